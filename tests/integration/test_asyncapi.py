"""The AsyncAPI document of the internal bus (docs/asyncapi.json, ``aegis_devstack.asyncapi``):
the committed copy is what the generator makes; it has AsyncAPI 3.0's shape (every reference
resolves, every channel has a message with a payload schema, every operation sends or receives
its channel's message); every subject of the contracts and of the services is one of its
channels; each payload schema accepts the events its model makes; and every sender and reader it
names may do so under its NATS identity (``aegis_contracts.bus``), while every subject an identity
may publish to is documented. No server is needed."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pydantic
import pytest
from jsonschema import Draft202012Validator

from aegis_contracts.bus import CONSUMERS, IDENTITIES, consumer
from aegis_contracts.events import ChangeEvent, Heartbeat, ObjectCreated, RawArchived, SystemEvent
from aegis_contracts.ids import SourceType
from aegis_contracts.keys import CLOUD_INFRA, Dataset
from aegis_contracts.subjects import (
    CHANGE_ENTITIES,
    CHANGES,
    DEAD_LETTER,
    HEARTBEAT,
    OBJECT_CREATED,
    RAW,
    STREAMS,
    SYSTEM,
    change_subject,
    dead_letter_subject,
    heartbeat_subject,
    object_created_subject,
    raw_subject,
    subject_matches,
    system_subject,
)
from aegis_devstack import asyncapi
from aegis_runtime.bus import DeadLetter

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / asyncapi.DEFAULT_PATH
ID = re.compile(r"^[A-Za-z0-9_\-]+$")
PARAM = re.compile(r"\{([a-z_]+)\}")
NOW = datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return asyncapi.document()


def resolve(doc: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = doc
    for part in ref[2:].split("/"):
        assert isinstance(node, dict) and part in node, f"{ref} does not resolve"
        node = node[part]
    return node


def refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [r for value in node.values() for r in refs(value)]
    if isinstance(node, list):
        return [r for value in node for r in refs(value)]
    return []


def address_matches(channel: dict[str, Any], subject: str) -> bool:
    """Whether ``subject`` is one of the channel's: each parameter one token (of its enum)."""
    params = channel.get("parameters", {})

    def token(match: re.Match[str]) -> str:
        enum = params[match[1]].get("enum")
        return "(" + "|".join(map(re.escape, enum)) + ")" if enum else "[^.]+"

    pattern = PARAM.sub(
        token, re.escape(channel["address"]).replace(r"\{", "{").replace(r"\}", "}")
    )
    return re.fullmatch(pattern, subject) is not None


def sample(channel: asyncapi.Channel, use: asyncapi.Use) -> str:
    """A subject of ``channel`` as ``use`` would send or read it (its own service token)."""

    def token(match: re.Match[str]) -> str:
        if match[1] == "service":
            return use.identity
        enum = channel.parameters[match[1]][1]
        return enum[0] if enum else "x-1"

    return PARAM.sub(token, channel.address)


def allowed(patterns: tuple[str, ...] | list[str], subject: str) -> bool:
    return any(subject_matches(subject, p) for p in patterns)


# -- the committed copy and its shape --------------------------------------------------------------


def test_the_committed_document_is_the_generated_one() -> None:
    assert COMMITTED.read_text(encoding="utf-8") == asyncapi.rendered(), (
        "docs/asyncapi.json is stale: run `python -m aegis_devstack.asyncapi` from the checkout"
    )
    assert json.loads(COMMITTED.read_text(encoding="utf-8")) == json.loads(asyncapi.rendered())


def test_the_document_has_asyncapis_shape(doc: dict[str, Any]) -> None:
    assert doc["asyncapi"] == "3.0.0"
    assert doc["info"]["title"] and doc["info"]["version"]
    assert doc["defaultContentType"] == "application/json"
    assert {s["protocol"] for s in doc["servers"].values()} == {"nats"}
    for ref in refs(doc):
        resolve(doc, ref)
    for kind in ("channels", "operations"):
        assert all(ID.match(key) for key in doc[kind]), kind
    for key in doc["components"]["messages"]:
        assert ID.match(key)
    for channel_id, channel in doc["channels"].items():
        assert channel["address"], channel_id
        assert set(PARAM.findall(channel["address"])) == set(channel.get("parameters", {}))
        assert channel["messages"], f"{channel_id} has no message"
        for message_ref in channel["messages"].values():
            message = resolve(doc, message_ref["$ref"])
            assert message["contentType"] == "application/json"
            payload = resolve(doc, message["payload"]["$ref"])
            assert payload["type"] == "object" and payload["properties"], channel_id
            Draft202012Validator.check_schema(payload)
    actions: dict[str, set[str]] = {channel_id: set() for channel_id in doc["channels"]}
    for operation_id, operation in doc["operations"].items():
        assert operation["action"] in {"send", "receive"}, operation_id
        channel_ref = operation["channel"]["$ref"]
        channel_id = channel_ref.removeprefix("#/channels/")
        assert channel_id in doc["channels"], operation_id
        actions[channel_id].add(operation["action"])
        assert operation["messages"], operation_id
        for message_ref in operation["messages"]:
            # AsyncAPI 3: an operation's messages are its channel's
            assert message_ref["$ref"].startswith(f"{channel_ref}/messages/"), operation_id
        assert operation["tags"][0]["name"] in IDENTITIES, operation_id
    assert all(found == {"send", "receive"} for found in actions.values()), actions


# -- the subjects ---------------------------------------------------------------------------------


def test_every_subject_of_the_contracts_is_a_channel(doc: dict[str, Any]) -> None:
    from aegis_aggregator.aggregate import OBJECT_FAMILY as WINDOWS  # noqa: PLC0415
    from aegis_alert_dispatcher.dispatcher import SERVICE, UNDELIVERABLE  # noqa: PLC0415
    from aegis_dashboard_api.feed import SUBJECTS as LIVE_FEED  # noqa: PLC0415
    from aegis_orchestrator.app import JOB_ENTITY  # noqa: PLC0415
    from aegis_processor.handlers import LATEST_ENTITY  # noqa: PLC0415
    from aegis_reporter.report import EVENT_KIND  # noqa: PLC0415
    from aegis_reporter.report import OBJECT_FAMILY as REPORTS  # noqa: PLC0415

    channels = doc["channels"].values()
    addresses = [c["address"] for c in channels]
    for root in (RAW, OBJECT_CREATED, CHANGES, SYSTEM, DEAD_LETTER, HEARTBEAT):
        assert any(a.startswith(f"{root}.") for a in addresses), root
    used = [
        *(raw_subject("factory-a", s) for s in SourceType),
        *(object_created_subject(d) for d in Dataset),
        object_created_subject(WINDOWS),
        object_created_subject(REPORTS),
        object_created_subject(CLOUD_INFRA),
        change_subject(LATEST_ENTITY),
        change_subject(JOB_ENTITY),
        *(change_subject(entity) for entity in CHANGE_ENTITIES),
        system_subject(EVENT_KIND),
        system_subject("alert_sent"),
        system_subject("job_done"),
        heartbeat_subject("processor", "host-1-abc123"),
        dead_letter_subject("ingest", "queue_full"),
        dead_letter_subject(SERVICE, UNDELIVERABLE),
        *LIVE_FEED,
    ]
    missing = [s for s in used if not any(address_matches(c, s) for c in channels)]
    assert not missing, f"subjects no channel describes: {missing}"
    # and each channel names the contract stream that stores it
    for channel in asyncapi.CHANNELS:
        spec = next(s for s in STREAMS if s.name == channel.stream.name)
        stream = doc["channels"][channel.id]["x-aegis-stream"]
        assert stream["name"] == spec.name and stream["subjects"] == list(spec.subjects)


def _events() -> list[pydantic.BaseModel]:
    return [
        RawArchived(
            message_id="m-0000001",
            factory_id="factory-a",
            source_type=SourceType.FACTORY_STATE,
            topic="aegis/factory-a/factory_state",
            bucket="b",
            key="raw/factory-a/factory_state/yyyy=2025/mm=01/dd=02/m-0000001.json",
            received_at=NOW,
            size_bytes=10,
            qos=1,
        ),
        ObjectCreated(bucket="b", key="k", size_bytes=1, producer="processor", created_at=NOW),
        ChangeEvent(
            table="t",
            pk="FACTORY#factory-a",
            sk="LATEST",
            event_name="MODIFY",
            new_image={"risk": {"level": "WARNING"}},
            producer="processor",
            at=NOW,
        ),
        SystemEvent(kind="alert_sent", producer="alert-dispatcher", at=NOW, detail={"n": 1}),
        Heartbeat(
            service="processor",
            instance="host-1-abc123",
            at=NOW,
            started_at=NOW,
            interval_s=10,
            ready=True,
            checks={"nats": True},
        ),
        DeadLetter.wrap(
            service="ingest",
            reason="queue_full",
            payload=b"\xff\x00",
            detail="full",
            received_at=NOW,
            headers={"Nats-Msg-Id": "x"},
        ),
    ]


@pytest.mark.parametrize("event", _events(), ids=lambda e: type(e).__name__)
def test_each_payload_schema_accepts_what_its_model_sends(
    doc: dict[str, Any], event: pydantic.BaseModel
) -> None:
    name = type(event).__name__
    # the document is the root: the schemas' references point into its components
    validator = Draft202012Validator(
        {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
    )
    validator.validate(json.loads(event.model_dump_json()))
    # a field this version does not know is ignored (a newer producer's, mid-rollout), while a
    # known one of the wrong type is refused
    newer = {**json.loads(event.model_dump_json()), "added_later": 1}
    assert validator.is_valid(newer) and type(event).model_validate(newer) == event
    first = next(iter(type(event).model_fields))
    wrong = {**json.loads(event.model_dump_json()), first: {"not": "a value"}}
    assert not validator.is_valid(wrong)
    used = {
        resolve(doc, m["$ref"])["payload"]["$ref"]
        for c in doc["channels"].values()
        for m in c["messages"].values()
    }
    assert f"#/components/schemas/{name}" in used


# -- the identities -------------------------------------------------------------------------------


def test_every_sender_and_reader_may_do_so_under_its_identity() -> None:
    problems = []
    for channel in asyncapi.CHANNELS:
        stream = channel.stream.name
        for use in channel.senders:
            identity = IDENTITIES[use.identity]
            subject = sample(channel, use)
            if not allowed(identity.publish, subject) or allowed(identity.deny_publish, subject):
                problems.append(f"{use.identity} may not publish {subject}")
        for use in channel.readers:
            identity = IDENTITIES[use.identity]
            if use.via == "consumer":
                needed = [f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{use.durable}"]
                rights = identity.publish
            elif use.via == "subscription":
                needed, rights = [sample(channel, use)], identity.subscribe
            else:
                needed = [f"$JS.API.STREAM.INFO.{stream}"]
                if channel.id == "heartbeats":  # the last message of each subject
                    needed.append(f"$JS.API.STREAM.MSG.GET.{stream}")
                rights = identity.publish
            problems += [f"{use.identity} may not {n}" for n in needed if not allowed(rights, n)]
    assert not problems, "\n".join(problems)


def test_every_consumer_read_is_declared_and_every_declared_one_is_read() -> None:
    """A reader through a durable consumer names one of the bus's declared consumers: of its
    identity, on the channel's stream, taking the channel's subjects."""
    problems, read = [], set()
    for channel in asyncapi.CHANNELS:
        for use in channel.readers:
            if use.via != "consumer":
                continue
            assert use.durable is not None, channel.id
            declared = consumer(use.durable)
            read.add(declared.name)
            if declared.identity != use.identity:
                problems.append(f"{declared.name} is {declared.identity}'s, not {use.identity}'s")
            if declared.stream != channel.stream.name:
                problems.append(f"{declared.name} reads {declared.stream}, not {channel.id}")
            family = re.sub(r"\{[a-z_]+\}", "*", channel.address)
            takes = allowed((declared.subject,), sample(channel, use))  # all of the channel
            if not (takes or subject_matches(declared.subject, family)):  # or a part of it
                problems.append(f"{declared.name} does not take {channel.address}")
    assert not problems, "\n".join(problems)
    assert read == {c.name for c in CONSUMERS}


def test_every_subject_an_identity_may_publish_is_documented() -> None:
    senders = [(c, u) for c in asyncapi.CHANNELS for u in c.senders]
    undocumented = []
    for identity in IDENTITIES.values():
        for pattern in identity.publish:
            # the JetStream API, and what every identity may send about itself
            if not pattern.startswith("aegis.") or pattern.startswith(
                (f"{HEARTBEAT}.", f"{DEAD_LETTER}.")
            ):
                continue
            if not any(
                u.identity == identity.name and subject_matches(sample(c, u), pattern)
                for c, u in senders
            ):
                undocumented.append(f"{identity.name}: {pattern}")
    assert not undocumented, undocumented
