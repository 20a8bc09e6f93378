"""Who may do what on the internal bus: one NATS identity per service, each allowed exactly the
subjects it publishes and the consumers it reads, and nothing else.

Without identities any process that reaches NATS can publish a forged event (a raw event for a
factory, a change of LATEST, an alert), read every subject, or purge a stream through the
JetStream API (``$JS.API.STREAM.PURGE.*``). With them:

* ``ingest`` and ``replay`` publish raw events (``aegis.raw.>``); nobody else may;
* ``processor`` reads the raw stream and publishes changes and object events; nobody else may
  publish a change;
* every service publishes its own heartbeat and dead letters, and checks the streams exist
  (``$JS.API.STREAM.INFO``), but only ``admin`` (``aegis bootstrap``, operators) creates, updates,
  purges or deletes streams: services run with ``AEGIS_NATS_MANAGE_STREAMS=false``;
* each identity reads JetStream's answers under an inbox of its own (``_INBOX_{name}``), so none
  can subscribe to another's replies.

:func:`server_authorization` writes the ``authorization`` block of a nats-server config for given
passwords (bcrypt hashes, never the passwords); :data:`IDENTITIES` is the table it comes from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import bcrypt

from aegis_contracts.subjects import (
    CHANGES,
    DEAD_LETTER,
    HEARTBEAT,
    OBJECT_CREATED,
    RAW,
    SYSTEM,
)

ADMIN = "admin"
BCRYPT_COST = 11


@dataclass(frozen=True, slots=True)
class Identity:
    """One service's rights: subjects it may publish to and subscribe to (NATS wildcards)."""

    name: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...] = ()

    def permissions(self) -> dict[str, dict[str, list[str]]]:
        inbox = f"_INBOX_{self.name}.>"
        return {
            "publish": {"allow": list(self.publish)},
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


IDENTITIES: dict[str, Identity] = {
    "ingest": Identity("ingest", (f"{RAW}.>", *_own("ingest"))),
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
            f"{SYSTEM}.alert_sent",
            *_own("alert-dispatcher"),
            *_consumes("AEGIS_EVENTS"),
            *_consumes("AEGIS_DLQ"),
        ),
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
