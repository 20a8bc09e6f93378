"""The device integrator's schemas and examples (docs/schemas, docs/examples) are what the
platform really accepts: the committed schemas equal a fresh generation from the models, every
accepted example parses, every refused one is refused with the reason its name gives, and the
schema refuses it too unless the reason lies beyond what a JSON Schema can say."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from aegis_contracts import schemas
from aegis_contracts.errors import ContractError
from aegis_contracts.ids import SourceType
from aegis_contracts.payloads import parse_device_message
from aegis_contracts.uploads import UploadRefused, parse_upload_request

DOCS = Path(__file__).resolve().parents[3] / "docs"
EXAMPLES = sorted((DOCS / "examples").glob("*/*.json"))
# refusals a JSON Schema cannot express; the schema's description names them
BEYOND_THE_SCHEMA = {
    "number-out-of-range",  # pydantic validator bounds
    "time-without-offset",  # date-time format is not asserted by JSON Schema validators
    "other-factory",  # the topic's factory
    "key-not-the-contract-key",  # built from other fields
}


def test_the_committed_schemas_are_the_generated_ones():
    for source_type in SourceType:
        path = DOCS / "schemas" / f"{source_type.value}.schema.json"
        assert path.read_text() == schemas.rendered(source_type), (
            f"{path} is stale: run .venv/bin/python -m aegis_contracts.schemas docs/schemas"
        )


def test_every_source_type_has_examples_both_ways():
    for source_type in SourceType:
        names = [p.name for p in EXAMPLES if p.parent.name == source_type.value]
        assert any(n.startswith("accepted.") for n in names), source_type
        assert any(n.startswith("refused.") for n in names), source_type


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_example(path: Path):
    source_type = SourceType(path.parent.name)
    schema = json.loads((DOCS / "schemas" / f"{source_type.value}.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    payload = path.read_bytes()
    verdict, *rest = path.name.removesuffix(".json").split(".")
    if verdict == "accepted":
        parse_device_message(source_type, payload, topic_factory_id="factory-a")
        validator.validate(json.loads(payload))
        return
    assert verdict == "refused", path.name
    reason, case = rest
    with pytest.raises(ContractError) as refused:
        parse_device_message(source_type, payload, topic_factory_id="factory-a")
    assert refused.value.code == reason, str(refused.value)
    if reason == "schema_violation" and case not in BEYOND_THE_SCHEMA:
        assert not validator.is_valid(json.loads(payload)), f"the schema accepts {path.name}"


@pytest.mark.parametrize("name", schemas.UPLOAD_MESSAGES)
def test_the_committed_upload_schemas_are_the_generated_ones(name: str):
    path = DOCS / "schemas" / f"{name}.schema.json"
    assert path.read_text() == schemas.rendered(name), (
        f"{path} is stale: run .venv/bin/python -m aegis_contracts.schemas docs/schemas"
    )


UPLOAD_REQUEST = {
    "request_id": "cam-01-000042",
    "filename": "cam-01-20261130T031500000Z.jpg",
    "captured_at": "2026-11-30T03:15:00.000Z",
    "content_type": "image/jpeg",
    "size_bytes": 48213,
}


def test_the_upload_schemas_take_what_the_platform_takes_and_refuse_what_it_refuses():
    request = jsonschema.Draft202012Validator(schemas.upload_schema("upload_request"))
    request.validate(UPLOAD_REQUEST)
    parse_upload_request(json.dumps(UPLOAD_REQUEST).encode())
    for broken in ({**UPLOAD_REQUEST, "extra": 1}, {**UPLOAD_REQUEST, "request_id": "a/b"}):
        assert not request.is_valid(broken)
        with pytest.raises(ContractError):
            parse_upload_request(json.dumps(broken).encode())
    answer = jsonschema.Draft202012Validator(schemas.upload_schema("upload_url"))
    refused = UploadRefused(request_id="cam-01-000042", reason="upload_too_large", detail="big")
    answer.validate(json.loads(refused.model_dump_json()))
    assert not answer.is_valid({**json.loads(refused.model_dump_json()), "status": "maybe"})
