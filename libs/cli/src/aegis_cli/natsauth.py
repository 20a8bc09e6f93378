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

:func:`ensure_passwords` keeps one password per identity in a file (``aegis nats-auth``);
:func:`server_authorization` writes the ``authorization`` block of a nats-server config for given
passwords (bcrypt hashes, never the passwords); :data:`IDENTITIES` is the table it comes from.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import bcrypt

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
BCRYPT_COST = 11
PASSWORD_BYTES = 24  # 192 bits, 32 URL-safe characters


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
            *_consumes("AEGIS_RAW"),
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
            *_consumes("AEGIS_EVENTS"),
            *_consumes("AEGIS_DLQ"),
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
            *_consumes("AEGIS_EVENTS"),
            *_consumes("AEGIS_RAW"),
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


def hash_password(password: str) -> str:
    """A bcrypt hash nats-server accepts in place of a password."""
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(BCRYPT_COST)).decode()


def server_authorization(passwords: Mapping[str, str]) -> str:
    """The ``authorization`` block of a nats-server config: ``admin`` (may do anything) and each
    identity of ``passwords`` that :data:`IDENTITIES` knows, with its permissions. Values are
    JSON, which the NATS config format reads as is."""
    users = []
    for name, password in sorted(passwords.items()):
        user: dict[str, object] = {"user": name, "password": hash_password(password)}
        if name != ADMIN:
            if name not in IDENTITIES:
                raise KeyError(
                    f"no NATS identity {name!r} (known: {', '.join(sorted(IDENTITIES))})"
                )
            user["permissions"] = IDENTITIES[name].permissions()
        users.append(user)
    body = ",\n    ".join(json.dumps(u) for u in users)
    return f"authorization {{\n  users: [\n    {body}\n  ]\n}}\n"


def ensure_passwords(path: Path) -> dict[str, str]:
    """The passwords of ``path``: ``name=password`` lines (an env file, which
    ``kubectl create secret generic --from-env-file`` makes one key per identity of). Those of
    ``admin`` and of every identity the file lacks are made up and added; the file is written
    mode 0600 when it changes. An unknown name is refused (a typo would lock a service out)."""
    passwords: dict[str, str] = {}
    if path.exists():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            name, sep, password = line.partition("=")
            name = name.strip()
            if not sep or not password or (name != ADMIN and name not in IDENTITIES):
                raise ValueError(f"{path}:{number}: not a NATS identity's name=password line")
            passwords[name] = password
    missing = [n for n in (ADMIN, *IDENTITIES) if n not in passwords]
    if missing:
        for name in missing:
            passwords[name] = secrets.token_urlsafe(PASSWORD_BYTES)
        text = "".join(f"{name}={password}\n" for name, password in passwords.items())
        fresh = path.with_name(f".{path.name}.new")
        fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(text)
        fresh.replace(path)
    return passwords
