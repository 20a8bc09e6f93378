"""Items as the read model writes them: one pass gives the plain form a read returns and the
attribute values DynamoDB takes, and both mean what boto3's serializer and deserializer make of
the same JSON."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from hypothesis import given
from hypothesis import strategies as st

from aegis_storage.encoding import encode, from_attributes

_ser, _deser = TypeSerializer(), TypeDeserializer()

# what JSON can carry and DynamoDB can keep: finite floats inside its range, ints of <= 38 digits
numbers = st.one_of(
    st.integers(min_value=-(10**38) + 1, max_value=10**38 - 1),
    st.floats(allow_nan=False, allow_infinity=False).filter(
        lambda f: f == 0 or 1e-130 <= abs(f) < 1e126
    ),
)
values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.text(max_size=8), numbers),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)
items = st.dictionaries(st.text(min_size=1, max_size=6), values, max_size=6)


def _library(item: dict[str, Any]) -> dict[str, Any]:
    """boto3's attribute values of the item's JSON, its numbers parsed as Decimal."""
    return {
        k: _ser.serialize(v) for k, v in json.loads(json.dumps(item), parse_float=Decimal).items()
    }


def _read_back(attributes: dict[str, Any]) -> dict[str, Any]:
    return {k: _deser.deserialize(v) for k, v in attributes.items()}


@given(items)
def test_attribute_values_hold_the_same_values_as_boto3s(item: dict[str, Any]) -> None:
    assert _read_back(encode(item).attributes) == _read_back(_library(item))


@given(items)
def test_the_plain_form_is_what_a_read_of_the_attributes_gives(item: dict[str, Any]) -> None:
    encoded = encode(item)
    assert encoded.plain == from_attributes(encoded.attributes)


def test_each_json_type_has_its_attribute_type_and_integral_numbers_read_as_int() -> None:
    encoded = encode(
        {"s": "x", "b": True, "n": None, "i": 3, "f": 24.0, "g": 0.5, "l": [1], "m": {}}
    )
    assert encoded.attributes == {
        "s": {"S": "x"},
        "b": {"BOOL": True},
        "n": {"NULL": True},
        "i": {"N": "3"},
        "f": {"N": "24"},
        "g": {"N": "0.5"},
        "l": {"L": [{"N": "1"}]},
        "m": {"M": {}},
    }
    assert encoded.plain == {
        "s": "x",
        "b": True,
        "n": None,
        "i": 3,
        "f": 24,
        "g": 0.5,
        "l": [1],
        "m": {},
    }


def test_a_large_integral_float_is_written_with_an_exponent_not_its_digits() -> None:
    assert encode({"f": 1e20}).attributes["f"] == {"N": "1e+20"}


@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), 1e126, -1e200, 1e-131, 10**38, -(10**40)]
)
def test_a_number_dynamodb_cannot_keep_is_refused_before_sending(value: Any) -> None:
    with pytest.raises(TypeError, match="DynamoDB"):
        encode({"v": {"nested": [value]}})
