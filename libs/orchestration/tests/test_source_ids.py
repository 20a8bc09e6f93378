"""The ids of real tables made valid: UUIDs, hexadecimal and numeric keys become job, step, param
and condition ids, the same every time; valid ids stay; over-long ones end in a digest; the step
ids a job's expressions name follow their steps."""

from __future__ import annotations

import hashlib
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aegis_orchestration.model import ID_PATTERN, STEP_ID_PATTERN
from aegis_orchestration.source_ids import (
    Kind,
    rename_references,
    rename_step_path,
    valid_id,
)

UUID = "3f2504e0-4f89-11d3-9a0c-0305e82c3301"
PATTERN = {kind: re.compile(STEP_ID_PATTERN) for kind in Kind} | {Kind.JOB: re.compile(ID_PATTERN)}


@pytest.mark.parametrize(
    ("original", "kind", "expected"),
    [
        (UUID, Kind.JOB, f"job-{UUID}"),
        (UUID.upper(), Kind.JOB, f"job-{UUID}"),
        (UUID, Kind.STEP, "step_" + UUID.replace("-", "_")),
        ("A1B2C3D4E5F60718293A4B5C6D7E8F90", Kind.PARAM, "a1b2c3d4e5f60718293a4b5c6d7e8f90"),
        (
            "0A1B2C3D4E5F60718293A4B5C6D7E8F9",
            Kind.CONDITION,
            "condition_0a1b2c3d4e5f60718293a4b5c6d7e8f9",
        ),
        ("1024", Kind.JOB, "job-1024"),
        ("1024", Kind.STEP, "step_1024"),
        ("Step One", Kind.STEP, "step_one"),
        ("nightly-shift-note", Kind.JOB, "nightly-shift-note"),  # valid: kept
        ("call_maintenance", Kind.STEP, "call_maintenance"),  # valid: kept
    ],
)
def test_an_id_of_the_tables_becomes_a_valid_readable_id(
    original: str, kind: Kind, expected: str
) -> None:
    assert valid_id(original, kind) == expected


def test_an_over_long_id_keeps_a_readable_prefix_and_ends_in_a_digest() -> None:
    long = "Maintenance-Escalation-For-The-Northern-Plant-Line-Seven"  # 56 characters
    job = valid_id(long, Kind.JOB)
    digest = hashlib.sha256(long.encode()).hexdigest()[:8]
    assert job == f"maintenance-escalation-for-the-northern-{digest}"  # as docs/orchestration.md
    assert valid_id(long + "x", Kind.JOB) != job  # the digest tells them apart
    assert valid_id(long, Kind.STEP) == long.lower().replace("-", "_")  # 64 for a step: fits
    step = valid_id("s" * 70, Kind.STEP)
    assert len(step) == 64 and step.startswith("s" * 55 + "_")


def test_an_id_outside_ascii_ends_in_a_digest() -> None:
    first, second = valid_id("작업1", Kind.STEP), valid_id("검사1", Kind.STEP)
    assert first != second
    assert all(re.fullmatch(r"step_1_[0-9a-f]{8}", i) for i in (first, second))


@given(st.text(min_size=1, max_size=300), st.sampled_from(list(Kind)))
def test_every_id_becomes_a_valid_one_and_the_same_every_time(original: str, kind: Kind) -> None:
    made = valid_id(original, kind)
    assert PATTERN[kind].fullmatch(made), made
    assert valid_id(original, kind) == made
    assert valid_id(made, kind) == made  # a valid id is kept


def test_step_ids_in_context_paths_follow_their_steps() -> None:
    renamed = {UUID: "step_x", "1024": "step_1024"}
    text = (
        f'AND(NumberGT([$.steps.{UUID}.count], 0), Exists([$.errors["1024"]]), '
        f"NumberLT([$.loops['1024'].n], 3), Exists([$.steps.check.items]), "
        f'StringEQ([$.trigger.{UUID}], "x"))'
    )
    assert rename_references(text, renamed) == (
        "AND(NumberGT([$.steps.step_x.count], 0), Exists([$.errors.step_1024]), "
        "NumberLT([$.loops.step_1024.n], 3), Exists([$.steps.check.items]), "
        f'StringEQ([$.trigger.{UUID}], "x"))'
    )


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("1024.items[0]", "step_1024.items[0]"),
        ("$.1024.items", "$.step_1024.items"),
        ("$['1024'].items", "$.step_1024.items"),
        ("$.check.items", "$.check.items"),  # not a renamed step
        ("10245.items", "10245.items"),  # another step
    ],
)
def test_a_return_data_path_names_the_renamed_step(path: str, expected: str) -> None:
    assert rename_step_path(path, {"1024": "step_1024"}) == expected
