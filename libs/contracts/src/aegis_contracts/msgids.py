"""The ``Nats-Msg-Id`` of every event the platform publishes, in one place.

JetStream stores one message per id within a stream's duplicate window (2 minutes), so an id
names *the fact announced*, never the attempt: the same fact announced again (a retry, a
redelivered message handled twice, two replicas, a command re-run) carries the same id and is
stored once; another fact carries another id. Each family has a prefix of its own, so ids of two
families never meet.
"""

from __future__ import annotations

# the prefixes, one per family
OBJECT_CREATED = "oc"
CHANGE = "chg"
ALERT = "alert"
ORCHESTRATION = "orch"
DEAD_LETTER = "dlq"
EXPIRY = "exp"
S3_NOTIFICATION = "s3"
PREFIXES = (OBJECT_CREATED, CHANGE, ALERT, ORCHESTRATION, DEAD_LETTER, EXPIRY, S3_NOTIFICATION)


def object_created(key: str, etag: str | None = None) -> str:
    """An object written: its key, and its ETag for a key that may be written again with other
    content (a window folded again, a report regenerated). A key written once (the processor's
    objects, the cloud snapshots) is named by the key alone."""
    return f"{OBJECT_CREATED}:{key}" if etag is None else f"{OBJECT_CREATED}:{key}:{etag}"


def change(pk: str, sk: str, event_name: str, digest: str) -> str:
    """A read-model write announced by a change sink: the item, the event and a digest of the
    image written."""
    return f"{CHANGE}:{pk}:{sk}:{event_name}:{digest}"


def latest_change(pk: str, sk: str, updated_at: object) -> str:
    """A factory's LATEST moved on by the processor: the item and the snapshot time it holds."""
    return f"{CHANGE}:{pk}:{sk}:{updated_at}"


def alert_sent(pk: str, sk: str, version: object) -> str:
    """An alert announced as sent: the alert and the version of its state that was claimed."""
    return f"{ALERT}:{pk}:{sk}:{version}"


def orchestration(idempotency_key: str) -> str:
    """An event a job's PUBLISH_EVENT step published: the run of the step that published it."""
    return f"{ORCHESTRATION}:{idempotency_key}"


def dead_letter(service: str, reason: str, message_id: str, digest: str) -> str:
    """A dead letter: the same message dead-lettered again for the same reason is one letter;
    another body or subject under the same message id (a conflict, two factories reusing ids)
    is another."""
    return f"{DEAD_LETTER}:{service}:{reason}:{message_id}:{digest[:16]}"


def expiry(table: str, shard_id: str, sequence_number: str) -> str:
    """An expiry read from a table's stream: the record (shard ids are unique within a stream,
    not across tables)."""
    return f"{EXPIRY}:{table}:{shard_id}:{sequence_number}"


def s3_notification(bucket: str, key: str, sequencer: str) -> str:
    """An object S3's notifications reported: the object and S3's sequencer of the event."""
    return f"{S3_NOTIFICATION}:{bucket}/{key}:{sequencer}"
