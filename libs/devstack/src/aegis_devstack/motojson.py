"""The emulator's answers to DynamoDB's item calls and DynamoDB Streams' GetRecords, encoded
without moto's general serializer.

moto encodes every answer by walking the operation's output shape in botocore's model, and for
each member of each structure asks a chain of alias providers which attribute or key of the
result holds it. For the item calls (GetItem, PutItem, Query, BatchGetItem, TransactWriteItems
and the rest), whose results are plain dicts already named as the model names them, that walk
was a third of the emulator's CPU under the test suite (a sampling profile of the GIL holder).
GetRecords' records (two images of ~60 attributes each) took ~45 ms apiece that way.

:func:`encode` gives the same document for such a result: the same members, strings as strings
(a number of an ``N`` value as its text), blobs in base64, integers and doubles as numbers,
timestamps by moto's own timestamp serializer, nothing for a member that holds None. It takes
only what it can encode exactly as moto would: a structure whose keys are all members of its
shape, lists and maps as they are given, no renamed member. Anything else (and every error) is
left to moto's serializer, which :func:`answer_item_calls_directly` falls back to. ``tests``
compare both on results of every kind these calls return.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from enum import Enum
from typing import Any

# the operations whose results are plain dicts named as the model names them
ITEM_OPERATIONS = frozenset(
    {
        "GetItem",
        "PutItem",
        "UpdateItem",
        "DeleteItem",
        "Query",
        "Scan",
        "BatchGetItem",
        "BatchWriteItem",
        "TransactGetItems",
        "TransactWriteItems",
    }
)

# the calls answered directly: (service, operation)
DIRECT = frozenset({("dynamodb", name) for name in ITEM_OPERATIONS}) | {
    ("dynamodbstreams", "GetRecords")
}

Encoder = Callable[[Any], Any]


class NotPlain(Exception):
    """A result (or a shape) this encoder does not take: moto's serializer answers it."""


class _Encoders:
    """One encoder per shape name of one service model, made on first use (shapes refer to
    themselves: an AttributeValue holds maps and lists of AttributeValues)."""

    def __init__(self) -> None:
        self.made: dict[str, Encoder] = {}

    def of(self, shape: Any) -> Encoder:
        found = self.made.get(shape.name)
        if found is None:
            self.made[shape.name] = found = self._make(shape)
        return found

    def _make(self, shape: Any) -> Encoder:
        kind = shape.type_name
        nested = {"structure": self._structure, "list": self._list, "map": self._map}.get(kind)
        if nested is not None:
            return nested(shape)
        if kind == "timestamp":
            return _timestamp(shape)
        scalar = _SCALARS.get(kind)
        if scalar is None:  # an event stream
            raise NotPlain(f"{shape.name}: {kind}")
        return scalar

    def _structure(self, shape: Any) -> Encoder:
        if shape.is_document_type:
            raise NotPlain(f"{shape.name}: a document")
        members = dict(shape.members)
        for name, member in members.items():
            # a member moto would look up under another name (the model's, or a dict's class
            # prefix): not plain
            if member.serialization.get("name", name) != name or name.lower().startswith("dict"):
                raise NotPlain(f"{shape.name}.{name}")
        names = frozenset(members)
        encoders: dict[str, Encoder] = {}

        def encode_structure(value: Any) -> Any:
            if type(value) is not dict or not value.keys() <= names:
                raise NotPlain(shape.name)
            out = {}
            for key, item in value.items():
                if item is None:
                    continue
                encoder = encoders.get(key)
                if encoder is None:
                    encoders[key] = encoder = self.of(members[key])
                out[key] = encoder(item)
            return out

        return encode_structure

    def _list(self, shape: Any) -> Encoder:
        member = shape.member

        def encode_list(value: Any) -> Any:
            if type(value) is not list:
                raise NotPlain(shape.name)
            encoder = self.of(member)
            out = []
            for item in value:
                if item is None:
                    raise NotPlain(shape.name)
                out.append(encoder(item))
            return out

        return encode_list

    def _map(self, shape: Any) -> Encoder:
        if shape.key.type_name != "string":
            raise NotPlain(shape.name)
        value_shape = shape.value

        def encode_map(value: Any) -> Any:
            if type(value) is not dict:
                raise NotPlain(shape.name)
            encoder = self.of(value_shape)
            out = {}
            for key, item in value.items():
                # (moto encodes a value under the empty key into the map itself)
                if item is None or not key:
                    raise NotPlain(shape.name)
                out[key] = encoder(item)
            return out

        return encode_map


def _string(value: Any) -> Any:
    if isinstance(value, Enum):
        value = value.value
    return value if value is None or value in ({}, []) else str(value)


def _blob(value: Any) -> str:
    if isinstance(value, str):
        value = value.encode("utf-8")
    return base64.b64encode(value).strip().decode("utf-8")


def _as_is(value: Any) -> Any:
    return value


def _timestamp(shape: Any) -> Encoder:
    """moto's own conversion, with the JSON protocols' default format (or the shape's)."""
    from moto.core.serialize import BaseJSONSerializer, TimestampSerializer  # noqa: PLC0415

    serializer = TimestampSerializer(BaseJSONSerializer.DEFAULT_TIMESTAMP_FORMAT)

    def encode_timestamp(value: Any) -> Any:
        wrapper: dict[str, Any] = {}
        serializer.serialize(wrapper, value, shape, "value")
        return wrapper["value"]

    return encode_timestamp


# as moto encodes each scalar type for the JSON protocol
_SCALARS: dict[str, Encoder] = {
    "string": _string,
    "blob": _blob,
    "integer": int,
    "long": int,
    "float": float,
    "double": float,
    "boolean": _as_is,
}


# per service: its shapes' encoders (a service's model does not change while the emulator runs)
_SERVICES: dict[str, _Encoders] = {}


def encode(result: Any, operation: Any) -> str:
    """The JSON body moto's serializer would give ``result`` as the answer of ``operation``
    (a botocore OperationModel); NotPlain where this encoder cannot tell that it would be the
    same."""
    service = operation.service_model.service_name
    encoders = _SERVICES.get(service)
    if encoders is None:
        _SERVICES[service] = encoders = _Encoders()
    return json.dumps(encoders.of(operation.output_shape)(result))


def answer_item_calls_directly() -> None:
    """Answer the calls of :data:`DIRECT` through :func:`encode`, and everything else (and
    every result it does not take) through moto's serializer. Both services' results answer
    through ``ActionResult.execute_result`` (DynamoDB's DynamoResult inherits it); a moto in
    which DynamoResult answers on its own is refused at start, not left slow."""
    from moto.core.responses import ActionResult  # noqa: PLC0415
    from moto.dynamodb.responses import DynamoResult  # noqa: PLC0415

    if "execute_result" in vars(DynamoResult):
        raise RuntimeError("moto's DynamoResult has an execute_result of its own: patch it too")
    serialized = ActionResult.execute_result

    def execute_result(self: Any, context: Any) -> Any:
        operation = context.operation_model
        service = operation.service_model.service_name
        if (service, operation.name) in DIRECT and not isinstance(self.result, Exception):
            try:
                body = encode(self.result, operation)
            except NotPlain:
                pass
            else:
                metadata = operation.service_model.metadata
                content_type = f"application/x-amz-json-{metadata.get('jsonVersion', '1.0')}"
                status = operation.http.get("responseCode", 200)
                return status, {"Content-Type": content_type}, body
        return serialized(self, context)

    ActionResult.execute_result = execute_result  # type: ignore[method-assign]
