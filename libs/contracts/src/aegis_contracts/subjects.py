"""NATS JetStream subjects and streams: the queue contract between AEGIS services.

Subjects are built here and nowhere else. Every token that comes from outside (a factory id, a
source type) is validated first, so a hostile id can never add a token or a wildcard.
"""

from __future__ import annotations

from dataclasses import dataclass

from aegis_contracts.ids import SourceType, validate_factory_id
from aegis_contracts.keys import CLOUD_INFRA, Dataset

ROOT = "aegis"

# ingest -> processor: one event per archived raw object
RAW = f"{ROOT}.raw"
# S3 ObjectCreated events (bucket, key) for everything the platform writes
OBJECT_CREATED = f"{ROOT}.objects.created"
# read-model change events (before/after images)
CHANGES = f"{ROOT}.changes"
# system events: alert sent, report generated, service up/down (orchestrator Automation triggers)
SYSTEM = f"{ROOT}.events"
# dead letters, one subject per service and reason family
DEAD_LETTER = f"{ROOT}.dlq"
# service heartbeats (cloud collector's readiness view)
HEARTBEAT = f"{ROOT}.heartbeat"


# objects that S3's event notifications alone report (the orchestrator's S3 bridge): a device's
# image upload under image_snapshot/, and a key outside the contract's layout
IMAGE_UPLOADS = "image_upload"
EXTERNAL_OBJECTS = "external"
# the families of ``aegis.objects.created.{family}``: the processed datasets, the aggregator's
# 5-minute windows, the reporter's reports, the cloud collectors' snapshots, and the two above
OBJECT_FAMILIES: tuple[str, ...] = (
    *(d.value for d in Dataset),
    "metrics_5m",
    "reports",
    CLOUD_INFRA,
    IMAGE_UPLOADS,
    EXTERNAL_OBJECTS,
)

# the entities of ``aegis.changes.{entity}`` and the changes their writers announce (the table
# stream's event names); TTL expiry is no writer's and is never announced by one
CHANGE_ENTITIES: dict[str, tuple[str, ...]] = {
    # a factory's LATEST (the processor, its periodic refresh)
    "factory_latest": ("INSERT", "MODIFY"),
    # a factory-hour that got late data, until the aggregator folded it again (``LATE#{hour}``)
    "factory_late": ("INSERT", "MODIFY", "REMOVE"),
    # one 5-minute graph window of a factory (``GRAPH#5M#{start}``), written by the aggregator
    "graph_5m": ("INSERT", "MODIFY"),
    # an alert's state (``ALERT#{scope}`` / ``{severity}#{reason}#{status}``): fired, resolved
    "alert": ("INSERT", "MODIFY"),
    # the cloud infrastructure's LATEST (``CLOUD#infra`` / ``LATEST``), one tier at a time
    "cloud_infra": ("INSERT", "MODIFY"),
    # a registered job (``JOB#registry`` / ``JOB#{id}``); ``aegis jobs delete`` is a soft delete
    "orch_job": ("INSERT", "MODIFY"),
    # an incident (``INCIDENT#{id}`` / ``INCIDENT``): triggered, notified, acknowledged,
    # escalated, resolved, archived (the dispatcher, and a person through the dashboard or CLI)
    "incident": ("INSERT", "MODIFY"),
}


# the entities whose items carry a ``ttl`` (late-data markers, graph windows, alert states):
# where the table's stream reports DynamoDB's own deletes of expired items, the orchestrator
# announces those as REMOVE changes marked ``expired`` (aegis_orchestrator.expiry)
EXPIRING_ENTITIES: tuple[str, ...] = ("factory_late", "graph_5m", "alert")


def raw_subject(factory_id: str, source_type: SourceType | str) -> str:
    """Subject of the raw event for one archived message: ``aegis.raw.{factory}.{source}``."""
    return f"{RAW}.{validate_factory_id(factory_id)}.{SourceType(source_type).value}"


def object_created_subject(prefix_family: str) -> str:
    """``aegis.objects.created.{family}``; family is a fixed word such as ``state_snapshot``."""
    return f"{OBJECT_CREATED}.{_token(prefix_family)}"


def change_subject(entity: str) -> str:
    """``aegis.changes.{entity}``, e.g. ``aegis.changes.factory_latest``."""
    return f"{CHANGES}.{_token(entity)}"


def system_subject(kind: str) -> str:
    return f"{SYSTEM}.{_token(kind)}"


def dead_letter_subject(service: str, reason: str) -> str:
    """``aegis.dlq.{service}.{reason}``: consumers can watch one service or one reason."""
    return f"{DEAD_LETTER}.{_token(service)}.{_token(reason)}"


def heartbeat_subject(service: str, instance: str | None = None) -> str:
    """``aegis.heartbeat.{service}.{instance}``; without ``instance``, the filter for all replicas."""
    return f"{HEARTBEAT}.{_token(service)}.{_token(instance) if instance else '*'}"


def _token(word: str) -> str:
    if not word or not all(c.isascii() and (c.isalnum() or c in "_-") for c in word):
        raise ValueError(f"not a subject token: {word!r} (ASCII letters, digits, '_' and '-' only)")
    return word


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """A JetStream stream AEGIS relies on; the runtime creates it idempotently at start-up."""

    name: str
    subjects: tuple[str, ...]
    max_age_seconds: int
    duplicate_window_seconds: int = 120
    # each subject (for raw events: one factory and source) may hold at most the deployment's
    # bound; the next message on a full subject is refused, not an older one dropped
    bounded_per_subject: bool = False


STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec("AEGIS_RAW", (f"{RAW}.>",), max_age_seconds=7 * 86_400, bounded_per_subject=True),
    StreamSpec(
        "AEGIS_EVENTS",
        (f"{OBJECT_CREATED}.>", f"{CHANGES}.>", f"{SYSTEM}.>", f"{HEARTBEAT}.>"),
        max_age_seconds=3 * 86_400,
    ),
    StreamSpec("AEGIS_DLQ", (f"{DEAD_LETTER}.>",), max_age_seconds=30 * 86_400),
)


def subject_matches(subject: str, pattern: str) -> bool:
    """Whether NATS routes ``subject`` to a subscription on ``pattern`` (``*`` one token,
    ``>`` one or more at the end)."""
    tokens, wanted = subject.split("."), pattern.split(".")
    for i, w in enumerate(wanted):
        if w == ">":
            return len(tokens) > i
        if i >= len(tokens) or (w != "*" and w != tokens[i]):
            return False
    return len(tokens) == len(wanted)
