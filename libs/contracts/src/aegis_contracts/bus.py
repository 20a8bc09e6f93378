"""Who may do what on the internal bus: one NATS identity per service, each allowed exactly the
subjects it publishes and the consumers it reads, and nothing else.

Without identities any process that reaches NATS can publish a forged event (a raw event for a
factory, a change of LATEST, an alert), read every subject, or purge a stream through the
JetStream API (``$JS.API.STREAM.PURGE.*``). With them:

* ``ingest`` and ``replay`` publish raw events (``aegis.raw.>``); nobody else may;
* ``processor`` reads the raw stream and publishes changes and object events; every other writer
  of the read model announces the changes of its own entity only (the aggregator its graph windows
  and late-data markers, the alert dispatcher its alerts, the cloud collector the cloud LATEST,
  the orchestrator its jobs and the expiries of items with a ttl, read from the table's stream);
* every other service publishes exactly its own events (the aggregator its windows, the reporter
  its reports, the cloud collector its snapshots, the alert dispatcher ``alert_sent``, the
  orchestrator's jobs system events of other kinds); the dashboard only the changes of the
  incidents people acknowledge or resolve and the jobs admins change on it, and its sign-ins
  (``aegis.events.login``) and each read of one entity (``aegis.events.select``), which no
  other identity may forge;
* every service publishes its own heartbeat and dead letters, and checks the streams exist
  (``$JS.API.STREAM.INFO``), but only ``admin`` (``aegis bootstrap``, operators) creates, updates,
  purges or deletes streams: services run with ``AEGIS_NATS_MANAGE_STREAMS=false``;
* each identity reads JetStream's answers under an inbox of its own (``_INBOX_{name}``), so none
  can subscribe to another's replies.

:data:`IDENTITIES` is the declaration every other view of the bus is made from: the NATS server's
``authorization`` block (``aegis nats-auth``, :mod:`aegis_cli.natsauth`), the test bus's
identities, the AsyncAPI document's check that every sender and reader holds the rights it uses,
and the deployments' secrets (one password per identity, ``admin`` besides).
"""

from __future__ import annotations

from dataclasses import dataclass

from aegis_contracts.subjects import (
    CHANGES,
    DEAD_LETTER,
    EXPIRING_ENTITIES,
    EXTERNAL_OBJECTS,
    HEARTBEAT,
    IMAGE_UPLOADS,
    OBJECT_CREATED,
    RAW,
    SYSTEM,
)

ADMIN = "admin"


@dataclass(frozen=True, slots=True)
class Identity:
    """One service's rights: subjects it may publish to and subscribe to (NATS wildcards), and
    subjects refused although an allowed wildcard covers them."""

    name: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...] = ()
    deny_publish: tuple[str, ...] = ()

    def permissions(self) -> dict[str, dict[str, list[str]]]:
        inbox = f"_INBOX_{self.name}.>"
        # an empty allow list is no list at all to nats-server: "publish nothing" is a deny
        publish = {"allow": list(self.publish)} if self.publish else {"deny": [">"]}
        if self.deny_publish:
            publish["deny"] = list(self.deny_publish)
        return {
            "publish": publish,
            "subscribe": {"allow": [inbox, *self.subscribe]},
        }


def _own(service: str) -> tuple[str, ...]:
    """What every service publishes about itself, and the stream checks of its start."""
    return (
        f"{HEARTBEAT}.{service}.>",
        f"{DEAD_LETTER}.{service}.>",
        "$JS.API.INFO",
        "$JS.API.STREAM.INFO.*",
    )


def _consumes(stream: str) -> tuple[str, ...]:
    """Reading a stream through durable pull consumers: create or look up a consumer, fetch,
    acknowledge (the consumer's name is a setting, so any name on that stream)."""
    return (
        f"$JS.API.CONSUMER.CREATE.{stream}.>",
        f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.*",
        f"$JS.API.CONSUMER.INFO.{stream}.*",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.*",
        f"$JS.ACK.{stream}.>",
    )


@dataclass(frozen=True, slots=True)
class Consumer:
    """A durable pull consumer: its default name (a setting may rename it), the stream it reads
    and the subjects it takes, and the identity whose replicas share it."""

    name: str
    stream: str
    subject: str
    identity: str


CONSUMERS: tuple[Consumer, ...] = (
    Consumer("processor", "AEGIS_RAW", f"{RAW}.>", "processor"),
    Consumer("alert-dispatcher", "AEGIS_EVENTS", f"{OBJECT_CREATED}.>", "alert-dispatcher"),
    # `aegis alerts resend`: the dispatcher's undeliverable messages, read back
    Consumer(
        "alerts-resend",
        "AEGIS_DLQ",
        f"{DEAD_LETTER}.alert-dispatcher.undeliverable",
        "alert-dispatcher",
    ),
    # the orchestrator's triggers, one consumer per source (names: its prefix, then the source)
    Consumer("orchestrator-changes", "AEGIS_EVENTS", f"{CHANGES}.>", "orchestrator"),
    Consumer("orchestrator-objects", "AEGIS_EVENTS", f"{OBJECT_CREATED}.>", "orchestrator"),
    Consumer("orchestrator-events", "AEGIS_EVENTS", f"{SYSTEM}.>", "orchestrator"),
    Consumer("orchestrator-raw", "AEGIS_RAW", f"{RAW}.>", "orchestrator"),
)


def consumer(name: str) -> Consumer:
    """The declared consumer of that default name (KeyError: none is declared)."""
    for declared in CONSUMERS:
        if declared.name == name:
            return declared
    raise KeyError(f"no durable consumer {name!r} is declared")


def _reads(identity: str) -> tuple[str, ...]:
    """The consumer rights of ``identity``: those of every stream its declared consumers read."""
    streams = dict.fromkeys(c.stream for c in CONSUMERS if c.identity == identity)
    return tuple(right for stream in streams for right in _consumes(stream))


# system events that one service announces and no other may forge: the orchestrator's jobs
# publish system events of any other kind
ALERT_SENT = f"{SYSTEM}.alert_sent"
REPORT_GENERATED = f"{SYSTEM}.report_generated"
SIGNED_IN = f"{SYSTEM}.login"
READ_ONE = f"{SYSTEM}.select"
# what the dashboard's live feed hears (aegis_dashboard_api.feed)
LIVE_FEED = (
    f"{CHANGES}.factory_latest",
    f"{OBJECT_CREATED}.cloud_infra",
    f"{OBJECT_CREATED}.metrics_5m",
    f"{OBJECT_CREATED}.reports",
    ALERT_SENT,
    f"{CHANGES}.incident",
)

IDENTITIES: dict[str, Identity] = {
    # publishes raw events; reads the last heartbeats of the ingest replicas (a message of the
    # events stream) to decide whether a stopping replica hands its MQTT session over
    "ingest": Identity(
        "ingest", (f"{RAW}.>", *_own("ingest"), "$JS.API.STREAM.MSG.GET.AEGIS_EVENTS")
    ),
    "processor": Identity(
        "processor",
        (
            f"{CHANGES}.>",
            f"{OBJECT_CREATED}.>",
            *_own("processor"),
            *_reads("processor"),
        ),
    ),
    # `aegis replay`: raw events again, from the archive
    "replay": Identity("replay", (f"{RAW}.>", *_own("replay"))),
    # reads object events (snapshots, cloud runs), says what it sent; `aegis alerts resend`
    # reads its dead letters back
    "alert-dispatcher": Identity(
        "alert-dispatcher",
        (
            ALERT_SENT,
            f"{CHANGES}.alert",
            f"{CHANGES}.incident",
            *_own("alert-dispatcher"),
            *_reads("alert-dispatcher"),
        ),
    ),
    # triggers from changes, object events, system events and raw events; its jobs publish
    # system events (not another service's); `aegis jobs` announces a changed job, and every
    # replica hears that announcement on a plain subscription
    "orchestrator": Identity(
        "orchestrator",
        (
            f"{SYSTEM}.>",
            f"{CHANGES}.orch_job",
            # what DynamoDB expires, announced from the table's stream (aegis_orchestrator.expiry)
            *(f"{CHANGES}.{entity}" for entity in EXPIRING_ENTITIES),
            # objects only S3's notifications report (aegis_orchestrator.s3events): these two
            # families only, so it cannot forge an object another service announces
            f"{OBJECT_CREATED}.{IMAGE_UPLOADS}",
            f"{OBJECT_CREATED}.{EXTERNAL_OBJECTS}",
            *_own("orchestrator"),
            *_reads("orchestrator"),
        ),
        subscribe=(f"{CHANGES}.orch_job",),
        deny_publish=(ALERT_SENT, REPORT_GENERATED, SIGNED_IN, READ_ONE),
    ),
    # announces its 5-minute windows (the service and `aegis aggregate`), and the changes of its
    # graph windows and of the late-data markers it clears
    "aggregator": Identity(
        "aggregator",
        (
            f"{OBJECT_CREATED}.metrics_5m",
            f"{CHANGES}.graph_5m",
            f"{CHANGES}.factory_late",
            *_own("aggregator"),
        ),
    ),
    # announces its daily reports (the service and `aegis report`)
    "reporter": Identity(
        "reporter", (f"{OBJECT_CREATED}.reports", REPORT_GENERATED, *_own("reporter"))
    ),
    # announces its snapshots; reads the queue's state: the consumers of the watched streams,
    # the last heartbeat of every replica (a message of the events stream)
    "cloud-collector": Identity(
        "cloud-collector",
        (
            f"{OBJECT_CREATED}.cloud_infra",
            f"{CHANGES}.cloud_infra",
            *_own("cloud-collector"),
            "$JS.API.CONSUMER.LIST.AEGIS_RAW",
            "$JS.API.CONSUMER.LIST.AEGIS_EVENTS",
            "$JS.API.STREAM.MSG.GET.AEGIS_EVENTS",
        ),
    ),
    # the live feed: plain subscriptions; it announces the incidents people acknowledge or
    # resolve and the jobs admins change on a dashboard (through JetStream, like the
    # dispatcher's own changes and `aegis jobs`), each sign-in and each read of one entity
    "dashboard-api": Identity(
        "dashboard-api",
        (f"{CHANGES}.incident", f"{CHANGES}.orch_job", SIGNED_IN, READ_ONE),
        subscribe=LIVE_FEED,
    ),
}
