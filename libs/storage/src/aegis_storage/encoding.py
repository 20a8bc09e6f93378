"""Items as DynamoDB keeps them: JSON-shaped values converted to attribute values and back,
numbers as DynamoDB keeps them (38 significant digits, integral ones read back as ``int``), and
the fleet index's keys set on every write and stripped from every read
(:func:`aegis_contracts.keys.fleet_index_keys`). Shared by the table (:mod:`aegis_storage.readmodel`)
and its in-memory twin (:mod:`aegis_storage.memorytable`), so both store the same values."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from pydantic import BaseModel

from aegis_contracts import keys
from aegis_contracts.times import format_ts

_ser = TypeSerializer()
_deser = TypeDeserializer()


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):  # already converted once: keep it a number
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, datetime):
        return format_ts(value)
    return str(value)


def to_plain(value: BaseModel | Mapping[str, Any], *, drop_none: bool = False) -> dict[str, Any]:
    """JSON-shaped Python with Decimal numbers: what DynamoDB's type serializer accepts.
    Idempotent: converting a converted item again changes nothing. ``drop_none``: top-level
    attributes that are None are left out (nested ones are kept)."""
    return _item_json(value, drop_none, parse_float=Decimal)


def _item_json(
    value: BaseModel | Mapping[str, Any], drop_none: bool, **loads: Any
) -> dict[str, Any]:
    """The item through JSON: a model straight from its serializer (no intermediate dict),
    a mapping through :func:`json.dumps`; ``loads``: options of the parse."""
    if isinstance(value, BaseModel):
        absent = {k for k in type(value).model_fields if getattr(value, k) is None}
        text = value.model_dump_json(exclude=absent if drop_none and absent else None)
    else:
        if drop_none:
            value = {k: v for k, v in value.items() if v is not None}
        text = json.dumps(value, default=_json_default)
    result = json.loads(text, **loads)
    if not isinstance(result, dict):
        raise TypeError("an item must be an object")
    return result


@dataclass(frozen=True, slots=True)
class Encoded:
    """An item converted once, both as a read would return it (``plain``: numbers as DynamoDB
    keeps them, 24.0 -> 24, so that what a writer derives from it serializes to the same bytes
    as what a reader does) and as DynamoDB attribute values (``attributes``): a state written as
    HISTORY and as LATEST is converted one time, not once per write."""

    plain: dict[str, Any]
    attributes: dict[str, Any]

    def with_fields(self, **fields: Any) -> Encoded:
        """The same item with ``fields`` set (only those are converted)."""
        added = encode(fields)
        return Encoded({**self.plain, **added.plain}, {**self.attributes, **added.attributes})


def encode(item: BaseModel | Mapping[str, Any], *, drop_none: bool = False) -> Encoded:
    """``item`` converted once (see :class:`Encoded`); ``drop_none`` as in :func:`to_plain`.
    One pass over the item's JSON gives both forms (the per-message writes' conversion)."""
    loaded = _item_json(item, drop_none)
    plain: dict[str, Any] = {}
    attributes: dict[str, Any] = {}
    for name, value in loaded.items():
        plain[name], attributes[name] = _both(value)
    return Encoded(plain, attributes)


# a float at least this large is written in exponent form (an integral one too), as DynamoDB
# keeps at most 38 significant digits
_EXPONENT_FROM = 1e16
# the numbers DynamoDB keeps: 38 significant digits, magnitudes 1E-130 to 9.99...E+125
_MAX_DIGITS = 10**38
_SMALLEST, _LARGEST = 1e-130, 1e126


def _both(value: Any) -> tuple[Any, dict[str, Any]]:
    """A JSON value as a read returns it (integral numbers as int) and as its attribute value,
    in one pass (what :func:`to_plain`, :func:`_unwrap` and :func:`to_attributes` do in three)."""
    if isinstance(value, str):
        return value, {"S": value}
    if isinstance(value, dict):
        plain: dict[str, Any] = {}
        attributes: dict[str, Any] = {}
        for k, v in value.items():
            plain[k], attributes[k] = _both(v)
        return plain, {"M": attributes}
    if isinstance(value, list):
        pairs = [_both(v) for v in value]
        return [p for p, _ in pairs], {"L": [a for _, a in pairs]}
    if value is None:
        return None, {"NULL": True}
    if isinstance(value, bool):
        return value, {"BOOL": value}
    return _number(value)


def _number(value: Any) -> tuple[int | float, dict[str, str]]:
    if isinstance(value, int):
        if abs(value) >= _MAX_DIGITS:
            raise TypeError(f"{value} has more than the 38 digits a DynamoDB number keeps")
        return value, {"N": str(value)}
    if not isinstance(value, float):
        raise TypeError(f"not a JSON value: {type(value).__name__}")
    if not math.isfinite(value) or (value and not _SMALLEST <= abs(value) < _LARGEST):
        raise TypeError(f"{value} is not a DynamoDB number (1E-130 to 9.99E+125, finite)")
    if not value.is_integer():
        return value, {"N": repr(value)}
    if abs(value) < _EXPONENT_FROM:
        return int(value), {"N": str(int(value))}
    text = repr(value)  # its shortest digits, as the read of them gives them back
    return int(Decimal(text)), {"N": text}


def item_attributes(item: BaseModel | Mapping[str, Any] | Encoded) -> dict[str, Any]:
    """The item as DynamoDB attribute values, with the fleet index's keys when it belongs in
    the index (a whole-item put without them takes the item out of the index)."""
    return indexed((item if isinstance(item, Encoded) else encode(item)).attributes)


def indexed(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """``attributes`` with the fleet index keys set as :func:`keys.fleet_index_keys` says."""
    out = {k: v for k, v in attributes.items() if k not in keys.FLEET_ATTRIBUTES}
    pk, sk = (attributes.get(name, {}).get("S") for name in ("pk", "sk"))
    if pk and sk:
        firing = attributes.get("firing", {}).get("BOOL")
        archived = attributes.get("archived_key", {}).get("S")
        state = attributes.get("state", {}).get("S")
        found = keys.fleet_index_keys(pk, sk, firing=firing, archived=archived, state=state)
        for name, value in (found or {}).items():
            out[name] = {"S": value}
    return out


def condition_value(value: Any) -> dict[str, Any]:
    """An ``expected`` value of a conditional put as the attribute value it is compared with."""
    serialized: dict[str, Any] = _ser.serialize(to_plain({"v": value})["v"])
    return serialized


def to_attributes(item: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _ser.serialize(v) for k, v in item.items()}


def from_attributes(item: Mapping[str, Any]) -> dict[str, Any]:
    """A stored item as plain values, without the fleet index's keys (storage bookkeeping)."""
    return {
        k: _unwrap(_deser.deserialize(v)) for k, v in item.items() if k not in keys.FLEET_ATTRIBUTES
    }


def _unwrap(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _unwrap(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    if isinstance(value, set):
        return {_unwrap(v) for v in value}
    return value
