"""READ_MODEL_QUERY against the emulator: each answer equals the conditions applied to the whole
partition (the pushed-down key condition, filter and projection lose nothing), and a query
reads only the range of the partition that can hold its answer (counted at the emulator)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from aegis_devstack.testing.emulator import arequest_counts
from aegis_devstack.testing.storage import Foundation
from aegis_orchestration.model import TaskCondition
from aegis_orchestration.query import build_query
from aegis_orchestrator.tasks import read_query

pytestmark = pytest.mark.integration

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
HISTORY = "HISTORY#STATE#"
LEVELS = ("CRITICAL", "WARNING", "NORMAL")


def sk(n: int) -> str:
    return f"{HISTORY}2026-11-30T00:00:{n:02d}.000Z"


def stored(pk: str, n: int) -> dict[str, Any]:
    """Items whose fields change type from one to the next, as hand-written data does."""
    score: Any = n if n % 3 else str(n)  # a number, or the same as text
    return {
        "pk": pk,
        "sk": sk(n),
        "level": LEVELS[n % 3],
        "score": score,
        "flag": n % 2 == 0 if n % 5 else n % 2,  # a bool, or 0/1
        "risk": {"level": LEVELS[n % 3], "factors": ["gas"] if n % 4 == 0 else []},
        "ttl": int(NOW.timestamp()) + (3600 if n != 7 else -1),  # one has expired
    }


def cond(n: int, field: str, comparison: str, value: Any = None, **more: Any) -> TaskCondition:
    return TaskCondition(
        id=f"c{n}",
        step_id="q",
        field_id=field,
        comparison_type=comparison,
        value=value,
        condition_index=n,
        **more,
    )


CASES: list[tuple[str, list[TaskCondition], dict[str, Any]]] = [
    ("everything", [], {}),
    ("prefix", [], {"sk_prefix": HISTORY}),
    ("sk-range", [cond(0, "sk", "GE", sk(10)), cond(1, "sk", "LT", sk(20))], {}),
    ("sk-gt-and-prefix", [cond(0, "sk", "GT", sk(50))], {"sk_prefix": HISTORY}),
    ("sk-equal", [cond(0, "sk", "EQ", sk(12))], {}),
    ("sk-begins", [cond(0, "sk", "BEGINS_WITH", f"{HISTORY}2026-11-30T00:00:1")], {}),
    ("sk-empty-range", [cond(0, "sk", "GT", sk(30)), cond(1, "sk", "LT", sk(20))], {}),
    (
        "sk-or-level",
        [cond(0, "sk", "GE", sk(55)), cond(1, "level", "EQ", "WARNING", operator_type="OR")],
        {},
    ),
    ("level-equal", [cond(0, "level", "EQ", "CRITICAL")], {}),
    ("score-text-stored-as-text", [cond(0, "score", "EQ", "9")], {}),
    ("score-number-stored-as-text", [cond(0, "score", "EQ", 12)], {}),
    ("score-text-stored-as-number", [cond(0, "score", "EQ", "10")], {}),
    ("flag-true", [cond(0, "flag", "EQ", True)], {}),
    ("flag-one", [cond(0, "flag", "EQ", 1)], {}),
    ("score-range", [cond(0, "score", "GE", 40), cond(1, "score", "LT", "45")], {}),
    ("nested-sub-key", [cond(0, "risk", "EQ", "WARNING", sub_key="level")], {}),
    ("contains", [cond(0, "risk.factors", "CONTAINS", "gas")], {}),
    ("exists-and-ne", [cond(0, "score", "EXISTS"), cond(1, "level", "NE", "NORMAL")], {}),
    (
        "or-then-and",
        [
            cond(0, "level", "EQ", "CRITICAL"),
            cond(1, "flag", "EQ", True, operator_type="OR"),
            cond(2, "sk", "LE", sk(40)),
        ],
        {},
    ),
    ("limit-in-order", [cond(0, "level", "EQ", "NORMAL")], {"limit": 4}),
    (
        "limit-newest-first",
        [cond(0, "level", "EQ", "NORMAL"), cond(1, "sk", "DESC", condition_type="SORT")],
        {"limit": 3},
    ),
    (
        "sorted-by-score",
        [cond(0, "score", "DESC", condition_type="SORT", priority=0)],
        {"limit": 5, "sk_prefix": HISTORY},
    ),
    ("fields", [cond(0, "level", "EQ", "WARNING")], {"fields": ["score", "risk.level"]}),
    ("fields-as-text", [cond(0, "risk.level", "EQ", "NORMAL")], {"fields": "sk, risk"}),
]


@pytest.mark.parametrize(("name", "conditions", "params"), CASES, ids=[c[0] for c in CASES])
async def test_a_query_answers_what_its_conditions_select_from_the_whole_partition(
    foundation: Foundation,
    unique_id: str,
    name: str,
    conditions: list[TaskCondition],
    params: dict[str, Any],
) -> None:
    pk = f"FACTORY#q-{unique_id}"
    rm = foundation.readmodel
    for n in range(60):
        await rm.put_item(stored(pk, n))
    await rm.put_item({"pk": pk, "sk": "LATEST", "level": "CRITICAL", "score": 99, "flag": True})
    spec = build_query(conditions, {"pk": pk, **params})
    expected = spec.apply(await rm.partition(pk, now=NOW))
    assert await read_query(rm, spec, now=NOW) == expected
    if name == "sk-empty-range":
        assert expected == []
    if name.startswith(("score-text", "score-number")):
        assert len(expected) == 1  # the one item, whichever type it was stored as
    if name.startswith("fields"):
        assert expected and all(set(i) <= {"score", "risk", "sk"} for i in expected)


async def test_a_query_reads_only_the_range_and_the_count_it_returns(
    foundation: Foundation, unique_id: str, aws_endpoint: str
) -> None:
    """60 history items and a LATEST in one partition: a range of 10 reads 10; the first 5 in
    sort key order read 5; an equality on a non-key field reads the range and returns what
    matches; a sort on another field must read the whole range."""
    pk = f"FACTORY#c-{unique_id}"
    rm = foundation.readmodel
    for n in range(60):
        await rm.put_item(stored(pk, n))
    await rm.put_item({"pk": pk, "sk": "LATEST"})

    async def read(conditions: list[TaskCondition], **params: Any) -> tuple[int, int, int]:
        spec = build_query(conditions, {"pk": pk, **params})
        before = await arequest_counts(aws_endpoint)
        found = await read_query(rm, spec, now=NOW)
        counted = (await arequest_counts(aws_endpoint)) - before
        return len(found), counted.items_scanned("Query"), counted.items_returned("Query")

    assert await read([cond(0, "sk", "GE", sk(50))], sk_prefix=HISTORY) == (10, 10, 10)
    assert await read([], limit=5) == (5, 5, 5)
    assert await read(
        [cond(0, "sk", "DESC", condition_type="SORT")], limit=2, sk_prefix=HISTORY
    ) == (2, 2, 2)
    # level CRITICAL: every third of the 20 below sk(20); the range read is inclusive at both
    # ends (BETWEEN the prefix and sk(20)), so sk(20) is read too, and left out
    found, scanned, returned = await read(
        [cond(0, "sk", "LT", sk(20)), cond(1, "level", "EQ", "CRITICAL")], sk_prefix=HISTORY
    )
    assert (found, scanned, returned) == (7, 21, 7)
    assert await read(
        [cond(0, "score", "ASC", condition_type="SORT")], limit=3, sk_prefix=HISTORY
    ) == (3, 60, 60)
