"""The condition DSL: the three reference examples, comparisons with "any" semantics, missing data is false,
30 malformed expressions refused with their positions, and no input crashes it (hypothesis)."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aegis_orchestration.dsl import ConditionSyntaxError, evaluate, parse, references

# the conditions of the job model's documentation, one per change kind
DOCUMENTED = {
    "delete": 'AND(StringMatches(Array([$.beforeData], [@.Q_NAME]), "*S10*"))',
    "insert": 'AND(StringMatches(Array([$.afterData], [@.Q_DESC]), "SO_Description"))',
    "select": 'AND(StringEQ([$.busobjectid], "target_object_id"))',
}


@pytest.mark.parametrize(
    ("expr", "event", "expected"),
    [
        ("delete", {"beforeData": [{"Q_NAME": "A-S10-B"}, {"Q_NAME": "x"}]}, True),
        ("delete", {"beforeData": [{"Q_NAME": "S1"}, {"Q_NAME": "10"}]}, False),
        ("delete", {"beforeData": {"Q_NAME": "S10"}}, True),  # one object counts as an array of one
        ("delete", {"afterData": [{"Q_NAME": "S10"}]}, False),
        ("insert", {"afterData": [{"Q_DESC": "SO_Description"}]}, True),
        ("insert", {"afterData": [{"Q_DESC": "SO_Description2"}]}, False),  # whole-string match
        ("insert", {"afterData": [{"Q_DESC": 7}]}, False),
        ("select", {"busobjectid": "target_object_id"}, True),
        ("select", {"busobjectid": "other"}, False),
        ("select", {}, False),
    ],
)
def test_the_seeds_three_examples(expr: str, event: dict, expected: bool) -> None:
    assert parse(DOCUMENTED[expr])(event) is expected


LATEST = {
    "beforeData": {
        "risk": {"level": "WARNING", "score": 40},
        "updated_at": "2026-11-30T03:00:00.000Z",
    },
    "afterData": {
        "factory_id": "factory-b",
        "risk": {
            "level": "CRITICAL",
            "score": 85,
            "reasons": [{"code": "CO_HIGH"}, {"code": "GAS_HIGH"}],
        },
        "factory_state": {"sensors": {"co_ppm": 120.5}},
        "updated_at": "2026-11-30T03:00:05.000Z",
    },
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            'AND(StringEQ([$.afterData.risk.level], "CRITICAL"),'
            ' StringNE([$.beforeData.risk.level], "CRITICAL"))',
            True,
        ),
        ('StringMatches(Array([$.afterData.risk.reasons], [@.code]), "GAS_*")', True),
        ('StringEQ(Array([$.afterData.risk.reasons], [@.code]), "FIRE_DETECTED")', False),
        ("NumberGE([$.afterData.factory_state.sensors.co_ppm], 100)", True),
        ("NumberGT([$.afterData.risk.score], [$.beforeData.risk.score])", True),
        ("NumberLT([$.afterData.risk.score], 85)", False),
        ('TimestampGT([$.afterData.updated_at], "2026-11-30T12:00:04+09:00")', True),
        ("TimestampGT([$.afterData.updated_at], [$.beforeData.updated_at])", True),
        ("Exists([$.afterData.risk])", True),
        ("NOT(Exists([$.afterData.infra_state]))", True),
        (
            'OR(StringEQ([$.afterData.factory_id], "factory-a"),'
            ' StringEQ([$.afterData.factory_id], "factory-b"))',
            True,
        ),
        ('StringContains([$.afterData.factory_id], "ry-b")', True),
        ("NumberEQ([$.afterData.risk.reasons.length], 2)", False),
        ("Exists([$.afterData.risk.reasons[1].code])", True),
        ('StringEQ([$.afterData.risk.reasons[*].code], "CO_HIGH")', True),
    ],
)
def test_comparisons_on_a_latest_change(text: str, expected: bool) -> None:
    assert parse(text)(LATEST) is expected


@pytest.mark.parametrize(
    "text",
    [
        "NumberGT([$.missing.deeper], 1)",
        'StringEQ([$.afterData.risk.score], "85")',  # a number is not a string
        "NumberGT([$.afterData.risk.level], 1)",  # a string that is no number
        'TimestampGT([$.afterData.factory_id], "2026-01-01T00:00:00Z")',
        'StringMatches(Array([$.afterData.factory_id], [@.x]), "*")',
        "Exists([$.afterData.nothing])",
    ],
)
def test_missing_or_mistyped_data_is_false_never_an_error(text: str) -> None:
    assert parse(text)(LATEST) is False
    assert parse(text)({}) is False


def test_no_expression_always_holds_and_references_are_listed() -> None:
    assert evaluate(None, {}) and evaluate("  ", {})
    expr = parse(DOCUMENTED["delete"])
    assert sorted(references(expr)) == ["$.beforeData", "@.Q_NAME"]


MALFORMED = [
    ("", 1, 1),
    ("   ", 1, 1),
    ("AND(", 1, 5),
    ('AND(StringEQ([$.a], "x")', 1, 25),
    ("AND()", 1, 1),
    ("OR()", 1, 1),
    ("NOT()", 1, 1),
    ('NOT(StringEQ([$.a], "x"), StringEQ([$.a], "y"))', 1, 1),
    ("FOO([$.a])", 1, 1),
    ('and(StringEQ([$.a], "x"))', 1, 1),
    ("StringEQ([$.a])", 1, 1),
    ('StringEQ([$.a], "x", "y")', 1, 1),
    ('StringEQ([$.a] "x")', 1, 16),
    ('StringEQ([$.a], "x"', 1, 20),
    ('StringEQ([$.a], "x"))', 1, 21),
    ("StringEQ([$.a], 'x')", 1, 17),
    ('StringEQ([a.b], "x")', 1, 10),
    ('StringEQ($.a, "x")', 1, 10),
    ('StringEQ([$.a], "unterminated)', 1, 17),
    ("[$.a]", 1, 1),
    ('"just a string"', 1, 1),
    ("42", 1, 1),
    ("Array([$.a], [@.b])", 1, 1),
    ('StringEQ(Array([@.a], [@.b]), "x")', 1, 16),
    ('StringEQ(AND(Exists([$.a])), "x")', 1, 10),
    ("Exists()", 1, 1),
    ("StringMatches([$.a], 5)", 1, 22),
    ("AND(Exists([$.a]),)", 1, 19),
    ("AND(Exists([$.a]) Exists([$.b]))", 1, 19),
    ("NumberGT([$.a], 1) @", 1, 20),
    ('StringEQ([$..], "x")', 1, 10),
    ('AND(\n  StringEQ([$.a], "x"),\n  Bogus(1)\n)', 3, 3),
]


@pytest.mark.parametrize(("text", "line", "column"), MALFORMED)
def test_malformed_expressions_are_refused_with_their_position(
    text: str, line: int, column: int
) -> None:
    with pytest.raises(ConditionSyntaxError) as caught:
        parse(text)
    assert (caught.value.line, caught.value.column) == (line, column), str(caught.value)
    assert f"line {line}, column {column}" in str(caught.value)


assert len(MALFORMED) >= 30

ALPHABET = st.sampled_from(
    list('ANDORTSringEQMatchesNumberGTLExistsArray()[]$@.,"*?0123456789 -_\n\\')
)


@settings(max_examples=400, deadline=None)
@given(st.text(ALPHABET, max_size=80))
def test_any_text_either_compiles_or_is_a_syntax_error(text: str) -> None:
    with contextlib.suppress(ConditionSyntaxError):
        parse(text)


JSON = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers() | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(["a", "b", "beforeData", "afterData", "Q_NAME", "risk", "level"]),
            children,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    JSON,
    st.sampled_from(
        [
            *DOCUMENTED.values(),
            *(
                t
                for t, _ in [
                    ("NumberGT([$.a.b], [$.b])", 0),
                    ("TimestampLE([$.a], [$.b])", 0),
                    ('StringMatches([$..level], "*")', 0),
                    ("Exists(Array([$.beforeData], [@.Q_NAME]))", 0),
                    ("NOT(NumberEQ([$.a[*]], 1))", 0),
                ]
            ),
        ]
    ),
)
def test_evaluation_never_raises_on_any_event(event: object, text: str) -> None:
    result = parse(text)(event)  # type: ignore[arg-type]
    assert result in (True, False)
