"""JSON Schemas of the device payloads, generated from the models that validate them.

``python -m aegis_contracts.schemas DIR`` writes ``DIR/{source_type}.schema.json`` for every
source type, and ``DIR/upload_request.schema.json`` and ``DIR/upload_url.schema.json`` for an
image upload's request and its answer; the committed copies (docs/schemas/) are checked against
a fresh generation by the test suite, so a device integrator's schema never drifts from what
the platform accepts.

A JSON Schema cannot say everything the models check; each schema's description lists what
only the platform checks (the topic's factory, the image key, number ranges that JSON Schema
could express but pydantic's validators hold).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from aegis_contracts.ids import MAX_PAYLOAD_BYTES, TOPIC_ROOT, SourceType
from aegis_contracts.payloads import LARGEST_NUMBER, MODEL_FOR, SMALLEST_NUMBER
from aegis_contracts.uploads import (
    MAX_UPLOAD_REQUEST_BYTES,
    UPLOAD_REQUEST,
    UPLOAD_URL,
    UploadAnswer,
    UploadRequest,
)

DRAFT = "https://json-schema.org/draft/2020-12/schema"

_BEYOND_THE_SCHEMA = {
    SourceType.FACTORY_STATE: "",
    SourceType.INFRA_STATE: "",
    SourceType.IMAGE_SNAPSHOT: (
        " s3_key must be the image_snapshot/ contract key built from factory_id, captured_at and "
        "filename."
    ),
}


def json_schema(source_type: SourceType) -> dict[str, Any]:
    """The schema of the payload published on ``aegis/{factory_id}/{source_type}``."""
    schema = MODEL_FOR[source_type].model_json_schema(mode="validation")
    topic = f"{TOPIC_ROOT}/{{factory_id}}/{source_type.value}"
    return {
        "$schema": DRAFT,
        "$id": f"https://aegis.example/schemas/{source_type.value}.schema.json",
        **schema,
        "title": f"AEGIS {source_type.value} payload",
        "description": (
            f"The JSON object a device publishes on MQTT topic {topic} (QoS 1). UTF-8, at most "
            f"{MAX_PAYLOAD_BYTES} bytes, no duplicate keys, no NaN or Infinity. Checked by the "
            "platform beyond this schema: factory_id equals the topic's; every number is 0 or "
            f"between {SMALLEST_NUMBER:g} and {LARGEST_NUMBER:g} in magnitude; timestamps carry "
            "an offset and fall in the years 1970 to 2999 (UTC)." + _BEYOND_THE_SCHEMA[source_type]
        ),
    }


# the image upload's two messages, by the last level of their topics
UPLOAD_MESSAGES = (UPLOAD_REQUEST, UPLOAD_URL)


def upload_schema(name: str) -> dict[str, Any]:
    """The schema of an upload request (``upload_request``) or of its answer (``upload_url``)."""
    if name == UPLOAD_REQUEST:
        schema = UploadRequest.model_json_schema(mode="validation")
        description = (
            f"The JSON object a gateway publishes on MQTT topic {TOPIC_ROOT}/{{factory_id}}/"
            f"{UPLOAD_REQUEST} (QoS 1) to get a presigned upload for one image. UTF-8, at most "
            f"{MAX_UPLOAD_REQUEST_BYTES} bytes, no duplicate keys. Checked by the platform beyond "
            "this schema: content_type is one of the types it allows and size_bytes within its "
            "limit (a deployment's settings); captured_at carries an offset and falls in the "
            "years 1970 to 2999 (UTC)."
        )
    elif name == UPLOAD_URL:
        schema = TypeAdapter(UploadAnswer).json_schema(mode="serialization")
        description = (
            f"What ingest publishes on MQTT topic {TOPIC_ROOT}/{{factory_id}}/{UPLOAD_URL}/"
            "{request_id} (QoS 1), which only that factory's identity may read: a presigned "
            "S3 POST (status granted: POST fields, then the image as the field file, to url "
            "before expires_at) or a refusal (status refused, with the reason it was "
            "dead-lettered under)."
        )
    else:
        raise ValueError(f"no upload message {name!r}; one of {', '.join(UPLOAD_MESSAGES)}")
    return {
        "$schema": DRAFT,
        "$id": f"https://aegis.example/schemas/{name}.schema.json",
        **schema,
        "title": f"AEGIS {name} message",
        "description": description,
    }


def rendered(source_type: SourceType | str) -> str:
    """A schema file's text: a source type's payload, or an upload message's."""
    if source_type in UPLOAD_MESSAGES:
        schema = upload_schema(str(source_type))
    else:
        schema = json_schema(SourceType(source_type))
    return json.dumps(schema, indent=2, sort_keys=False) + "\n"


def write(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in (*(s.value for s in SourceType), *UPLOAD_MESSAGES):
        path = directory / f"{name}.schema.json"
        path.write_text(rendered(name))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m aegis_contracts.schemas DIR", file=sys.stderr)
        return 2
    for path in write(Path(args[0])):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
