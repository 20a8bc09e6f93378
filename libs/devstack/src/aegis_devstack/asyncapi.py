"""The AsyncAPI document of the internal bus: every subject AEGIS uses on NATS JetStream, which
service sends it, which reads it and how, and the JSON Schema of its payload.

``python -m aegis_devstack.asyncapi [PATH]`` writes it (default ``docs/asyncapi.json``, from the
checkout's root); the test suite checks that the committed copy equals a fresh generation, so the
document never drifts from the contracts.

Written from the contracts rather than by FastStream's AsyncAPI generator. FastStream describes
the subscribers and publishers registered on an application's brokers; here each service has a
broker of its own, a publish goes through ``broker.publish`` (which FastStream leaves out of its
document), and some readers are no subscribers at all (the cloud collector reads the last
heartbeat of each subject from the stream; the dashboard's live feed is a plain connection). So
:data:`CHANNELS` says who sends and who reads each subject, the subjects are built with
:mod:`aegis_contracts.subjects`, the streams are :data:`aegis_contracts.subjects.STREAMS`, and
each payload schema is the JSON Schema of the pydantic model that validates the message.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any, Literal

import pydantic

from aegis_contracts.bus import consumer
from aegis_contracts.events import ChangeEvent, Heartbeat, ObjectCreated, RawArchived, SystemEvent
from aegis_contracts.ids import FACTORY_ID_PATTERN, SourceType
from aegis_contracts.keys import CLOUD_INFRA, Dataset
from aegis_contracts.subjects import (
    DEAD_LETTER,
    EXTERNAL_OBJECTS,
    HEARTBEAT,
    IMAGE_UPLOADS,
    OBJECT_CREATED,
    RAW,
    STREAMS,
    SYSTEM,
    StreamSpec,
    change_subject,
    object_created_subject,
    system_subject,
)
from aegis_runtime.bus import MSG_ID_HEADER, DeadLetter, stream_for

ASYNCAPI_VERSION = "3.0.0"
DEFAULT_PATH = Path("docs") / "asyncapi.json"

# how a reader gets a channel's messages
Via = Literal["consumer", "subscription", "stream"]
_VERBS: dict[Via | None, str] = {
    None: "send",
    "consumer": "consume",
    "subscription": "subscribe",
    "stream": "read",
}


@dataclass(frozen=True, slots=True)
class Use:
    """One program's part in a channel: ``identity`` is the NATS identity it runs as
    (:mod:`aegis_contracts.bus`); a reader says how it reads (``via``), and a consumer its
    durable consumer's default name."""

    identity: str
    note: str
    via: Via | None = None
    durable: str | None = None
    program: str = ""  # when not the service of that name: a command, e.g. "aegis replay"

    @property
    def who(self) -> str:
        return self.program or self.identity


@dataclass(frozen=True, slots=True)
class Channel:
    """A subject (or a family of subjects: ``{name}`` tokens are parameters) and its uses."""

    id: str
    address: str
    title: str
    description: str
    message: type[pydantic.BaseModel]
    senders: tuple[Use, ...]
    readers: tuple[Use, ...]
    parameters: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)

    @property
    def stream(self) -> StreamSpec:
        """The contract stream whose subjects capture this channel's."""
        sample = ".".join("x" if t.startswith("{") else t for t in self.address.split("."))
        return stream_for(sample)


_FACTORY = (f"A factory's id: {FACTORY_ID_PATTERN.pattern}.", ())
_SERVICE = ("The service's name (its NATS identity).", ())
_ALERTS_CONSUMER = Use(
    "alert-dispatcher",
    "Reads every object event (`aegis.objects.created.>`) and decides alerts from the "
    "families it triggers on (state snapshots, cloud snapshots); the others are acknowledged "
    "and skipped.",
    via="consumer",
    durable=consumer("alert-dispatcher").name,
)
_FEED = "dashboard-api"
_TRIGGERS = "orchestrator"
# the orchestrator announcing what DynamoDB expired (aegis_orchestrator.expiry)
_EXPIRIES = Use(
    _TRIGGERS,
    "Each item DynamoDB deleted by its ttl, read from the table's stream (REMOVE, `expired`; "
    "with AEGIS_ORCHESTRATOR_EXPIRY_STREAM).",
)
# the orchestrator's trigger consumers, each reading several channels
_ON_CHANGES = Use(
    _TRIGGERS,
    "BizObject triggers of the registered jobs (every `aegis.changes.>` entity).",
    via="consumer",
    durable=consumer("orchestrator-changes").name,
)
_ON_OBJECTS = Use(
    _TRIGGERS,
    "Component triggers of the registered jobs (every `aegis.objects.created.>` family).",
    via="consumer",
    durable=consumer("orchestrator-objects").name,
)
_ON_EVENTS = Use(
    _TRIGGERS,
    "Automation triggers of the registered jobs (every `aegis.events.>` kind).",
    via="consumer",
    durable=consumer("orchestrator-events").name,
)

CHANNELS: tuple[Channel, ...] = (
    Channel(
        id="rawEvents",
        address=f"{RAW}.{{factory_id}}.{{source_type}}",
        title="Raw events",
        description=(
            "One event per device message archived in raw/: where the object is, and its text "
            "when it is small. `Nats-Msg-Id` is the raw object's key, so a message archived "
            "again (an MQTT redelivery, a replay) is stored once within the duplicate window. "
            "Each factory and source holds a bounded backlog (a deployment setting): a full "
            "subject refuses the next event, whose message is dead-lettered (`queue_full`) "
            "while its raw object stays."
        ),
        message=RawArchived,
        parameters={
            "factory_id": _FACTORY,
            "source_type": ("What the device sent.", tuple(s.value for s in SourceType)),
        },
        senders=(
            Use("ingest", "One per MQTT message archived; retried while NATS is away."),
            Use(
                "replay",
                "Raw objects of a time range again, marked `replayed` (alerts and triggers "
                "leave them alone unless `--notify`).",
                program="aegis replay",
            ),
        ),
        readers=(
            Use(
                "processor",
                "Validates the payload, writes the processed objects and the factory's LATEST, "
                "then announces them (object events, the LATEST change).",
                via="consumer",
                durable=consumer("processor").name,
            ),
            Use(
                _TRIGGERS,
                "Platform triggers of the registered jobs.",
                via="consumer",
                durable=consumer("orchestrator-raw").name,
            ),
        ),
    ),
    Channel(
        id="processedObjects",
        address=f"{OBJECT_CREATED}.{{dataset}}",
        title="Processed objects",
        description=(
            "An object the processor wrote under processed/{factory_id}/{dataset}/: what S3 "
            "would announce on ObjectCreated, plus who wrote it."
        ),
        message=ObjectCreated,
        parameters={"dataset": ("The processed dataset.", tuple(d.value for d in Dataset))},
        senders=(Use("processor", "After each processed object is written."),),
        readers=(_ALERTS_CONSUMER, _ON_OBJECTS),
    ),
    *(
        Channel(
            id=f"s3Reported{name}",
            address=object_created_subject(family),
            title=title,
            description=(
                f"{what}, reported by S3's event notifications and written by no service of the "
                "platform; producer `s3`."
            ),
            message=ObjectCreated,
            senders=(
                Use(
                    "orchestrator",
                    "For each such record of the S3 events queue "
                    "(AEGIS_ORCHESTRATOR_S3_EVENTS_QUEUE_URL).",
                ),
            ),
            readers=(_ALERTS_CONSUMER, _ON_OBJECTS),
        )
        for name, family, title, what in (
            (
                "ImageUploads",
                IMAGE_UPLOADS,
                "Image uploads",
                "A device's image uploaded under image_snapshot/",
            ),
            (
                "ExternalObjects",
                EXTERNAL_OBJECTS,
                "External objects",
                "An object outside the layout",
            ),
        )
    ),
    Channel(
        id="metricsWindows",
        address=object_created_subject("metrics_5m"),
        title="5-minute metric windows",
        description="A factory's 5-minute window written to processed_agg/.",
        message=ObjectCreated,
        senders=(Use("aggregator", "Each window it writes (the service, and `aegis aggregate`)."),),
        readers=(
            _ALERTS_CONSUMER,
            Use(_FEED, "The factory's 6-24 h charts reload.", via="subscription"),
            _ON_OBJECTS,
        ),
    ),
    Channel(
        id="reports",
        address=object_created_subject("reports"),
        title="Daily reports",
        description="A daily report written under reports/daily/.",
        message=ObjectCreated,
        senders=(Use("reporter", "Each report it writes (the service, and `aegis report`)."),),
        readers=(
            _ALERTS_CONSUMER,
            Use(_FEED, "The page offers the new report.", via="subscription"),
            _ON_OBJECTS,
        ),
    ),
    Channel(
        id="cloudSnapshots",
        address=object_created_subject(CLOUD_INFRA),
        title="Cloud snapshots",
        description=(
            "A cloud infrastructure snapshot (fast or slow tier) written under "
            "processed/cloud_infra/."
        ),
        message=ObjectCreated,
        senders=(Use("cloud-collector", "Each snapshot a collector files."),),
        readers=(
            _ALERTS_CONSUMER,
            Use(_FEED, "The cloud view is read again.", via="subscription"),
            _ON_OBJECTS,
        ),
    ),
    Channel(
        id="factoryLatestChanges",
        address=change_subject("factory_latest"),
        title="Changes of a factory's LATEST",
        description=(
            "A factory's LATEST item changed in the read model (old and new images, as a "
            "table stream would give them)."
        ),
        message=ChangeEvent,
        senders=(Use("processor", "Each change it makes to LATEST, and its periodic refresh."),),
        readers=(
            _ON_CHANGES,
            Use(_FEED, "The factory's fleet entry and LATEST on every page.", via="subscription"),
        ),
    ),
    Channel(
        id="lateHourChanges",
        address=change_subject("factory_late"),
        title="Changes of a late-data marker",
        description=(
            "A factory-hour got processed objects after its windows were folded (INSERT, MODIFY "
            "for each further late object), and was folded again (REMOVE), or expired (REMOVE "
            "with `expired`): `FACTORY#{factory_id}` / `LATE#{hour}`."
        ),
        message=ChangeEvent,
        senders=(
            Use("processor", "Each late object it marks."),
            Use("aggregator", "Each marker it clears once the hour is folded again."),
            _EXPIRIES,
        ),
        readers=(_ON_CHANGES,),
    ),
    Channel(
        id="graphWindowChanges",
        address=change_subject("graph_5m"),
        title="Changes of a graph window",
        description=(
            "A factory's 5-minute graph window in the read model: `FACTORY#{factory_id}` / "
            "`GRAPH#5M#{start}`, written (INSERT) and rewritten with late data (MODIFY); "
            "REMOVE with `expired` once DynamoDB deleted it by its ttl."
        ),
        message=ChangeEvent,
        senders=(Use("aggregator", "Each graph window the service writes."), _EXPIRIES),
        readers=(_ON_CHANGES,),
    ),
    Channel(
        id="alertChanges",
        address=change_subject("alert"),
        title="Changes of an alert",
        description=(
            "An alert's state: `ALERT#{scope}` / `{severity}#{reason}#{status}`, claimed, fired, "
            "resolved, settled (old and new images; the old one is absent only when a "
            "transaction wrote it without it); REMOVE with `expired` once DynamoDB deleted it "
            "by its ttl."
        ),
        message=ChangeEvent,
        senders=(Use("alert-dispatcher", "Each change of an alert's state."), _EXPIRIES),
        readers=(_ON_CHANGES,),
    ),
    Channel(
        id="incidentChanges",
        address=change_subject("incident"),
        title="Changes of an incident",
        description=(
            "An incident: `INCIDENT#{incident_id}` / `INCIDENT`, triggered, notified, "
            "escalated, acknowledged, resolved and archived (old and new images; the old one "
            "is absent only when a transaction wrote it without it)."
        ),
        message=ChangeEvent,
        senders=(
            Use("alert-dispatcher", "Each change the dispatcher makes to an incident."),
            Use(_FEED, "An incident a person acknowledged or resolved on a dashboard."),
        ),
        readers=(
            Use(_FEED, "Every open incidents list is read again.", via="subscription"),
            _ON_CHANGES,
        ),
    ),
    Channel(
        id="cloudInfraChanges",
        address=change_subject("cloud_infra"),
        title="Changes of the cloud LATEST",
        description=(
            "The cloud infrastructure's LATEST (`CLOUD#infra` / `LATEST`): one tier's snapshot "
            "and the overall status."
        ),
        message=ChangeEvent,
        senders=(Use("cloud-collector", "Each run that moves its tier forward."),),
        readers=(_ON_CHANGES,),
    ),
    Channel(
        id="jobChanges",
        address=change_subject("orch_job"),
        title="Changes of a job",
        description=(
            "A registered job changed in the read model: running orchestrators refresh it at "
            "once (without NATS they pick it up at their next periodic refresh)."
        ),
        message=ChangeEvent,
        senders=(
            Use(
                "orchestrator",
                "After each change of a job (register, enable, disable, delete, import); a core "
                "NATS publish, stored by the stream all the same.",
                program="aegis jobs",
            ),
            Use(_FEED, "A job an admin registered, replaced, enabled, disabled or deleted."),
        ),
        readers=(
            Use(_TRIGGERS, "Every replica reloads the job.", via="subscription"),
            _ON_CHANGES,
        ),
    ),
    Channel(
        id="alertsSent",
        address=system_subject("alert_sent"),
        title="Alerts sent",
        description="The alert dispatcher fired or resolved an alert on Slack.",
        message=SystemEvent,
        senders=(Use("alert-dispatcher", "Each alert it sends (fire or resolve)."),),
        readers=(
            _ON_EVENTS,
            Use(_FEED, "The firing alerts are read again.", via="subscription"),
        ),
    ),
    Channel(
        id="signIns",
        address=system_subject("login"),
        title="Sign-ins",
        description=(
            "A sign-in on a dashboard, or one that did not succeed: `detail` holds the "
            "`outcome` (ok, refused, failed), the `exception` (wrong_token, locked, "
            "unknown_user, provider_refused, provider_unreachable; null on success), who "
            "(`actor`, `subject`, `via`), from where (`source`, `agent`) and the `audit_id` of "
            "its audit record. The orchestrator's Automation jobs of sub type `Login`."
        ),
        message=SystemEvent,
        senders=(Use(_FEED, "Each sign-in, and each refused or failed one."),),
        readers=(_ON_EVENTS,),
    ),
    Channel(
        id="entityReads",
        address=system_subject("select"),
        title="Reads of one entity",
        description=(
            "A read of one factory, incident or job through the dashboard's API, at most one "
            "per person, entity, view and minute: `detail` holds the `entity` (factory, "
            "incident, job), its `id`, the `view` read (latest, history, images; else the "
            "entity), its `factory`, who (`actor`, `subject`, `via`) and from where (`source`, "
            "`agent`). The orchestrator's Automation jobs of sub type `Select`."
        ),
        message=SystemEvent,
        senders=(Use(_FEED, "Each read of one entity through the API."),),
        readers=(_ON_EVENTS,),
    ),
    Channel(
        id="reportsGenerated",
        address=system_subject("report_generated"),
        title="Reports generated",
        description="The reporter generated a daily report.",
        message=SystemEvent,
        senders=(Use("reporter", "Each report it generates."),),
        readers=(_ON_EVENTS,),
    ),
    Channel(
        id="jobEvents",
        address=f"{SYSTEM}.{{kind}}",
        title="System events of jobs",
        description=(
            "A system event a job's PUBLISH_EVENT step announces: any kind but those another "
            "service owns (`alert_sent`, `report_generated`, `login`)."
        ),
        message=SystemEvent,
        parameters={"kind": ("The event's kind: ^[a-z][a-z0-9_]{0,63}$.", ())},
        senders=(Use("orchestrator", "A job's PUBLISH_EVENT step."),),
        readers=(_ON_EVENTS,),
    ),
    Channel(
        id="heartbeats",
        address=f"{HEARTBEAT}.{{service}}.{{instance}}",
        title="Heartbeats",
        description=(
            "Every replica of every service says it is alive, and whether it is ready, at a "
            "fixed interval (and once with `stopping` on a clean stop). Read as the last "
            "message of each subject: no consumer, no extra store."
        ),
        message=Heartbeat,
        parameters={
            "service": _SERVICE,
            "instance": ("The replica: {host}-{pid}-{random}.", ()),
        },
        senders=tuple(
            Use(name, "Its replicas' heartbeats.")
            for name in (
                "ingest",
                "processor",
                "alert-dispatcher",
                "orchestrator",
                "aggregator",
                "reporter",
                "cloud-collector",
            )
        ),
        readers=(
            Use(
                "cloud-collector",
                "The fast tier reads the last heartbeat of every subject from the stream: a "
                "replica silent for a few intervals is reported lost.",
                via="stream",
            ),
        ),
    ),
    Channel(
        id="deadLetters",
        address=f"{DEAD_LETTER}.{{service}}.{{reason}}",
        title="Dead letters",
        description=(
            "A message that can never succeed (invalid, refused, or out of retries: the "
            "consumer's last delivery), wrapped with why, where it came from and its payload "
            "byte for byte, for an operator to read and replay. `Nats-Msg-Id` is derived from "
            "the original message and the reason: a redelivery is one dead letter."
        ),
        message=DeadLetter,
        parameters={
            "service": _SERVICE,
            "reason": (
                "Why: a contract error's code, invalid_payload, retries_exhausted, or the "
                "service's own reason (queue_full, undeliverable, ...).",
                (),
            ),
        },
        senders=(
            Use("ingest", "MQTT messages refused at the door (invalid, conflicting, queue full)."),
            Use("processor", "Raw events that cannot be processed."),
            Use(
                "alert-dispatcher",
                "Object events it cannot handle, and alerts Slack would not take "
                "(`undeliverable`, kept for `aegis alerts resend`).",
            ),
            Use("orchestrator", "Trigger events that cannot be handled."),
        ),
        readers=(
            Use(
                "alert-dispatcher",
                "Resends the undeliverable alerts (`aegis.dlq.alert-dispatcher.undeliverable` "
                "only), each once, once Slack is back.",
                via="consumer",
                durable=consumer("alerts-resend").name,
                program="aegis alerts resend",
            ),
            Use(
                "cloud-collector",
                "Counts the dead letters of each subject (the stream's per-subject state) and "
                "reports new ones.",
                via="stream",
            ),
        ),
    ),
)

_MESSAGES: tuple[type[pydantic.BaseModel], ...] = (
    RawArchived,
    ObjectCreated,
    ChangeEvent,
    SystemEvent,
    Heartbeat,
    DeadLetter,
)


# -- the document ----------------------------------------------------------------------------------


def _schemas() -> dict[str, Any]:
    """Every payload model's JSON Schema, its nested definitions beside it."""
    schemas: dict[str, Any] = {}
    for model in _MESSAGES:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, nested in schema.pop("$defs", {}).items():
            if schemas.setdefault(name, nested) != nested:
                raise ValueError(f"two different schemas named {name}")
        schemas[model.__name__] = schema
    return schemas


def _message(model: type[pydantic.BaseModel]) -> dict[str, Any]:
    doc = (model.__doc__ or model.__name__).strip()
    return {
        "name": model.__name__,
        "title": model.__name__,
        "summary": " ".join(doc.split("\n\n", 1)[0].split()),
        "contentType": "application/json",
        "headers": {"$ref": "#/components/schemas/Headers"},
        "payload": {"$ref": f"#/components/schemas/{model.__name__}"},
    }


_HEADERS = {
    "type": "object",
    "description": (
        "What an AEGIS publish sets. JetStream keeps one message per Nats-Msg-Id within its "
        "stream's duplicate window and answers the others as duplicates; every publish has "
        "one but the core NATS announcements of `aegis jobs`."
    ),
    "properties": {
        MSG_ID_HEADER: {"type": "string", "description": "The message's idempotency key."},
        "content-type": {"type": "string", "const": "application/json"},
        "correlation_id": {"type": "string", "description": "Set when a publisher gives one."},
    },
    "required": ["content-type"],
}


def _operation_id(channel: Channel, use: Use) -> str:
    return f"{use.identity}_{_VERBS[use.via]}_{channel.id}"


def _operation(channel: Channel, use: Use) -> dict[str, Any]:
    ref = {"$ref": f"#/channels/{channel.id}/messages/{channel.message.__name__}"}
    if use.via is None:
        title = f"{use.who} sends {channel.title.lower()}"
    elif use.via == "consumer":
        title = f"{use.who} consumes {channel.title.lower()}"
    elif use.via == "subscription":
        title = f"{use.who} subscribes to {channel.title.lower()}"
    else:
        title = f"{use.who} reads {channel.title.lower()} from the stream"
    how = {
        None: f"Publishes to JetStream stream {channel.stream.name} and waits for its ack.",
        "consumer": (
            f"Durable pull consumer `{use.durable}` of stream {channel.stream.name} (the "
            "default name; a setting), shared by the replicas: explicit ack, redelivery with "
            "a growing delay, the last delivery dead-lettered."
        ),
        "subscription": "A core NATS subscription (no replay, nothing left on the server).",
        "stream": f"JetStream API reads of stream {channel.stream.name}, no consumer.",
    }[use.via]
    operation: dict[str, Any] = {
        "action": "send" if use.via is None else "receive",
        "channel": {"$ref": f"#/channels/{channel.id}"},
        "title": title,
        "summary": use.note,
        "description": f"{how} NATS identity: `{use.identity}`.",
        "tags": [{"name": use.identity}],
        "messages": [ref],
    }
    if use.via is not None:
        operation["x-aegis-via"] = use.via
    if use.durable is not None:
        operation["x-aegis-durable"] = use.durable
    return operation


def _channel(channel: Channel) -> dict[str, Any]:
    spec = channel.stream
    body: dict[str, Any] = {
        "address": channel.address,
        "title": channel.title,
        "description": channel.description,
        "servers": [{"$ref": "#/servers/nats"}],
        "messages": {
            channel.message.__name__: {"$ref": f"#/components/messages/{channel.message.__name__}"}
        },
    }
    if channel.parameters:
        body["parameters"] = {
            name: {"description": text, **({"enum": list(enum)} if enum else {})}
            for name, (text, enum) in channel.parameters.items()
        }
    body["x-aegis-stream"] = {
        "name": spec.name,
        "subjects": list(spec.subjects),
        "maxAgeSeconds": spec.max_age_seconds,
        "duplicateWindowSeconds": spec.duplicate_window_seconds,
        "boundedPerSubject": spec.bounded_per_subject,
    }
    return body


def document() -> dict[str, Any]:
    """The AsyncAPI 3.0 document of the bus, as a JSON-ready dict."""
    operations: dict[str, Any] = {}
    for channel in CHANNELS:
        for use in (*channel.senders, *channel.readers):
            key = _operation_id(channel, use)
            if key in operations:
                raise ValueError(f"operation {key} twice")
            operations[key] = _operation(channel, use)
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": "AEGIS internal bus",
            "version": version("aegis-runtime"),
            "description": (
                "The subjects AEGIS services exchange on NATS JetStream: who sends each, who "
                "reads it and how, and its payload. Subjects are built by "
                "`aegis_contracts.subjects` only; every event is JSON validated by the pydantic "
                "model named here, and published to JetStream with a `Nats-Msg-Id` (the stream "
                "drops a repeat within its duplicate window). Each service connects with an "
                "identity of its own, allowed to publish exactly its subjects and to read its "
                "consumers (`aegis_contracts.bus`); JetStream's answers come back under that "
                "identity's inbox (`_INBOX_{identity}`). Generated by "
                "`python -m aegis_devstack.asyncapi`: do not edit by hand."
            ),
        },
        "defaultContentType": "application/json",
        "servers": {
            "nats": {
                "host": "nats:4222",
                "protocol": "nats",
                "description": (
                    "NATS with JetStream: one or more servers, TLS when the deployment asks "
                    "for it. Streams: "
                    + "; ".join(f"{s.name} ({', '.join(s.subjects)})" for s in STREAMS)
                    + "."
                ),
            }
        },
        "channels": {channel.id: _channel(channel) for channel in CHANNELS},
        "operations": operations,
        "components": {
            "messages": {model.__name__: _message(model) for model in _MESSAGES},
            "schemas": {"Headers": _HEADERS, **_schemas()},
        },
    }


def rendered() -> str:
    return json.dumps(document(), indent=2, ensure_ascii=False) + "\n"


def write(path: Path = DEFAULT_PATH) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(rendered(), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1 or (args and args[0].startswith("-")):
        print("usage: python -m aegis_devstack.asyncapi [PATH]  (default docs/asyncapi.json)")
        return 2
    print(write(Path(args[0]) if args else DEFAULT_PATH))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
