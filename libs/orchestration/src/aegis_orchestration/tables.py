"""Jobs kept as rows of four relational tables, read from a folder of CSV or JSON files and
assembled into :class:`Job` documents.

The tables, one file each, named after the table (``orch_job.csv`` or ``orch_job.json``, ...):

- ``orch_job``: one row per job (trigger and job fields);
- ``orch_job_step``: one row per step, ``job_id`` names its job, ``flow_step_id`` its FLOW parent;
- ``orch_step_param``: one row per step parameter (``step_id``; ``job_id`` checked when given);
- ``orch_task_condition``: one row per READ_MODEL_QUERY condition (``step_id``).

Each row may also carry the tenant and audit columns (``tenant_app_id``, ``tenant_account_id``,
``is_active``, ``created_by``, ``modified_by``, ``created_at``, ``updated_at``). A job keeps its
row's tenant and audit values in :attr:`Job.origin`, and belongs to the tenant
``{tenant_app_id}/{tenant_account_id}`` (:attr:`Job.tenant`); step, parameter and condition rows
must name the job's tenant (or none). A row with ``is_active`` = N is a deleted row and is left
out (a deleted job with all its rows).

Ids are those of a real database (UUIDs, hexadecimal or numeric keys): each becomes a valid id
(:mod:`aegis_orchestration.source_ids`), the same at every import, in every column that refers
to it, and the original is kept as the entity's ``source_id``. Two originals that would become
one id are refused, naming both rows.

:func:`load_tables` reads a folder and returns every job it could assemble and every problem
found, each naming the table, the row (1-based, data rows only), the CSV line and the job.
:func:`plan_registration` compares assembled jobs with the registered ones: what is new, what is
unchanged (importing twice changes nothing), what would replace a job, what is refused.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from aegis_orchestration.model import Job, JobError
from aegis_orchestration.source_ids import Kind, rename_references, rename_step_path, valid_id
from aegis_orchestration.tenants import Tenants

JOB, STEP, PARAM, CONDITION = TABLES = (
    "orch_job",
    "orch_job_step",
    "orch_step_param",
    "orch_task_condition",
)
OPTIONAL_TABLES = frozenset({PARAM, CONDITION})  # a folder without them: no params, conditions
TENANT = ("tenant_app_id", "tenant_account_id")
AUDIT = ("created_by", "modified_by", "created_at", "updated_at")
SYSTEM = (*TENANT, "is_active", *AUDIT)
# overlap_allowed is a Y/N flag in the tables and a number of concurrent runs in the model
OVERLAP_WHEN_ALLOWED = 10
NULL_MARKERS = frozenset({"", "\\N"})  # an empty CSV cell, MySQL's NULL in exports

COLUMNS: dict[str, tuple[str, ...]] = {
    JOB: (
        "id",
        "orch_id",
        "object_id",
        "job_name",
        "job_description",
        "is_enabled",
        "overlap_allowed",
        "repeat_limit",
        "trigger_type",
        "trigger_sub_type",
        "trigger_condition_expr",
        "trigger_cron",
        "trigger_cron_desc",
        "designer_offset",
        # the model's own job fields, optional
        "time_zone",
        "misfire_policy",
        "misfire_grace_s",
        "global_params",
        "unscoped_events",
        *SYSTEM,
    ),
    STEP: (
        "id",
        "job_id",
        "flow_step_id",
        "step_name",
        "step_description",
        "step_type",
        "step_sub_type",
        "is_start_point",
        # the model's own step fields, optional
        "seq",
        "next_step_id",
        "condition_expr",
        "wait_seconds",
        "catch_step_id",
        "timeout_s",
        "retry_max_attempts",
        "retry_interval_s",
        "retry_backoff_rate",
        "retry_max_delay_s",
        *SYSTEM,
    ),
    PARAM: (
        "id",
        "job_id",
        "step_id",
        "parent_param_id",
        "param_name",
        "param_description",
        "param_key",
        "param_value",
        "param_seq",
        "data_type",
        "param_type",
        "source_type",
        "target_type",
        "ref_path",
        "default_value",
        "is_required",
        "max_length",
        "condition_expr",
        "param_index",
        *SYSTEM,
    ),
    CONDITION: (
        "id",
        "step_id",
        "field_id",
        "condition_type",
        "operator_type",
        "comparison_type",
        "priority",
        "value_type",
        "value",
        "sub_key",
        "condition_index",
        *SYSTEM,
    ),
}
REQUIRED: dict[str, tuple[str, ...]] = {
    JOB: ("id", "job_name", "trigger_type"),
    STEP: ("id", "job_id", "step_type"),
    PARAM: ("id", "step_id", "param_key"),
    CONDITION: ("id", "step_id", "field_id"),
}

# how a column is read: text as given unless named here
_FLAGS = frozenset({"is_enabled", "is_active", "is_start_point", "is_required", "unscoped_events"})
_INTEGERS = frozenset(
    {
        "repeat_limit",
        "seq",
        "retry_max_attempts",
        "param_seq",
        "param_index",
        "max_length",
        "priority",
        "condition_index",
    }
)
_NUMBERS = frozenset(
    {
        "misfire_grace_s",
        "wait_seconds",
        "timeout_s",
        "retry_interval_s",
        "retry_backoff_rate",
        "retry_max_delay_s",
    }
)
_JSON = frozenset({"designer_offset", "global_params"})
# values kept as they are (a CSV cell is text; a JSON file may give any JSON value)
_ANY = frozenset({"param_value", "default_value", "value"})
_RETRY = {
    "retry_max_attempts": "max_attempts",
    "retry_interval_s": "interval_s",
    "retry_backoff_rate": "backoff_rate",
    "retry_max_delay_s": "max_delay_s",
}
# the columns that hold an id of the tables, and the kind of entity it names: each becomes a
# valid id of that kind, the same for the row that has the id and for every row that refers to it
_ID_COLUMNS: dict[str, dict[str, Kind]] = {
    JOB: {"id": Kind.JOB},
    STEP: {
        "id": Kind.STEP,
        "flow_step_id": Kind.STEP,
        "next_step_id": Kind.STEP,
        "catch_step_id": Kind.STEP,
    },
    PARAM: {"id": Kind.PARAM, "step_id": Kind.STEP, "parent_param_id": Kind.PARAM},
    CONDITION: {"id": Kind.CONDITION, "step_id": Kind.STEP},
}
_KIND = {JOB: Kind.JOB, STEP: Kind.STEP, PARAM: Kind.PARAM, CONDITION: Kind.CONDITION}
# a part of a tenant ({tenant_app_id}/{tenant_account_id}), as Job.tenant takes it
_TENANT_PART = re.compile(r"[^\s/]{1,100}")
# the columns that are not model fields of the entity (handled apart)
_NOT_FIELDS = {
    JOB: frozenset(SYSTEM),
    STEP: frozenset({"job_id", *SYSTEM, *_RETRY}),
    PARAM: frozenset({"job_id", *SYSTEM}),
    CONDITION: frozenset(SYSTEM),
}


@dataclass(frozen=True, slots=True)
class Row:
    """One data row: its ``table``, ``number`` (1-based, data rows only), the CSV ``line`` it
    starts on (None in a JSON file) and its ``values`` (None for NULL)."""

    table: str
    number: int
    line: int | None
    values: dict[str, Any]

    def get(self, column: str) -> Any:
        return self.values.get(column)


@dataclass(frozen=True, slots=True)
class TableProblem:
    """One fault: the ``table`` and ``row`` (None: the file, or the folder, as a whole), the CSV
    ``line``, the ``job`` it belongs to (by the id it is imported as; None when no job could be
    told) and the ``reason``."""

    table: str | None
    row: int | None
    line: int | None
    job: str | None
    reason: str

    def __str__(self) -> str:
        where = self.table or ""
        if self.row is not None:
            where += f" row {self.row}"
        if self.line is not None:
            where += f" (line {self.line})" if self.row is not None else f" line {self.line}"
        if self.job is not None:
            where += f" [job {self.job}]"
        return f"{where}: {self.reason}" if where else self.reason

    def as_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "row": self.row,
            "line": self.line,
            "job": self.job,
            "reason": self.reason,
        }


@dataclass
class TablesResult:
    """What :func:`load_tables` found: the ``jobs`` that form valid documents (in the order of
    their rows), every problem, the files read, the data rows read and the deleted rows left out
    per table."""

    jobs: list[Job] = field(default_factory=list)
    problems: list[TableProblem] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    deleted: dict[str, int] = field(default_factory=dict)
    job_rows: dict[str, Row] = field(default_factory=dict)
    # rows naming a job or step that is not in the tables: they belong to no job read
    orphans: list[TableProblem] = field(default_factory=list)

    @property
    def fatal(self) -> bool:
        """Whether a problem cannot be tied to a job (a file, or a row that cannot be read or
        has no id): then no job can be trusted, even when leaving the bad ones out."""
        return any(p.job is None and p not in self.orphans for p in self.problems)

    @property
    def bad_jobs(self) -> list[str]:
        return sorted({p.job for p in self.problems if p.job is not None})

    @property
    def good_jobs(self) -> list[Job]:
        """The jobs none of whose rows has a problem."""
        bad = set(self.bad_jobs)
        return [j for j in self.jobs if j.id not in bad]


# -- reading the files ------------------------------------------------------------------------


def load_tables(directory: Path) -> TablesResult:
    """Read the four tables of ``directory`` and assemble their jobs (see the module's doc)."""
    result = TablesResult()
    tables: dict[str, list[Row]] = {}
    for table in TABLES:
        rows = _read_table(directory, table, result)
        tables[table] = rows
        result.rows[table] = len(rows)
    if not result.fatal:
        _Assembly(result, tables).run()
    return result


def _read_table(directory: Path, table: str, result: TablesResult) -> list[Row]:
    found = [directory / f"{table}.{ext}" for ext in ("csv", "json")]
    present = [p for p in found if p.is_file()]
    if len(present) > 1:
        result.problems.append(
            _file_problem(table, f"both {present[0].name} and {present[1].name}: keep one")
        )
        return []
    if not present:
        if table not in OPTIONAL_TABLES:
            result.problems.append(_file_problem(table, f"no {table}.csv or {table}.json"))
        return []
    path = present[0]
    result.files[table] = path.name
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte order mark from a spreadsheet
    except (OSError, UnicodeDecodeError) as err:
        result.problems.append(_file_problem(table, f"{path.name} cannot be read: {err}"))
        return []
    if path.suffix == ".csv":
        return _csv_rows(table, text, result.problems)
    return _json_rows(table, text, result.problems)


def _file_problem(table: str, reason: str, line: int | None = None) -> TableProblem:
    return TableProblem(table, None, line, None, reason)


def _csv_rows(table: str, text: str, problems: list[TableProblem]) -> list[Row]:
    reader = csv.reader(text.splitlines(keepends=True), strict=True)
    rows: list[Row] = []
    header: list[str] | None = None
    start = 1
    try:
        for record in reader:
            line, start = start, reader.line_num + 1
            if not record or all(not cell.strip() for cell in record):
                continue  # a blank line
            if header is None:
                header = [c.strip() for c in record]
                if not _header_ok(table, header, problems):
                    return []
                continue
            number = len(rows) + 1
            if len(record) != len(header):
                problems.append(
                    TableProblem(
                        table,
                        number,
                        line,
                        None,
                        f"{len(record)} fields where the header has {len(header)}",
                    )
                )
                rows.append(Row(table, number, line, {}))
                continue
            rows.append(
                Row(table, number, line, {c: _cell(v) for c, v in zip(header, record, strict=True)})
            )
    except csv.Error as err:
        problems.append(_file_problem(table, f"not CSV: {err}", reader.line_num))
        return []
    if header is None:
        problems.append(_file_problem(table, "no header line"))
    return rows


def _header_ok(table: str, header: list[str], problems: list[TableProblem]) -> bool:
    before = len(problems)
    known = COLUMNS[table]
    for column in sorted({c for c in header if header.count(c) > 1}):
        problems.append(_file_problem(table, f"column {column!r} appears twice", 1))
    for column in header:
        if column not in known:
            problems.append(_file_problem(table, f"unknown column {column!r}", 1))
    for column in REQUIRED[table]:
        if column not in header:
            problems.append(_file_problem(table, f"missing column {column!r}", 1))
    return len(problems) == before


def _cell(value: str) -> str | None:
    text = value.strip()
    return None if text in NULL_MARKERS else text


def _json_rows(table: str, text: str, problems: list[TableProblem]) -> list[Row]:
    try:
        doc = json.loads(text)
    except ValueError as err:
        problems.append(_file_problem(table, f"not JSON: {err}"))
        return []
    if not isinstance(doc, list):
        problems.append(_file_problem(table, "expected a JSON list of rows (objects)"))
        return []
    rows: list[Row] = []
    for i, entry in enumerate(doc, start=1):
        if not isinstance(entry, dict):
            problems.append(TableProblem(table, i, None, None, "not an object"))
            rows.append(Row(table, i, None, {}))
            continue
        values: dict[str, Any] = {}
        for column, value in entry.items():
            if column not in COLUMNS[table]:
                problems.append(TableProblem(table, i, None, None, f"unknown column {column!r}"))
                continue
            values[column] = _cell(value) if isinstance(value, str) else value
        owner = entry.get("id" if table == JOB else "job_id")
        job = owner if isinstance(owner, str) and owner else None
        missing = [c for c in REQUIRED[table] if c not in entry]
        problems.extend(TableProblem(table, i, None, job, f"missing column {c!r}") for c in missing)
        rows.append(Row(table, i, None, values))
    return rows


# -- assembling the jobs ------------------------------------------------------------------------


_SUBJECT = re.compile(r"^(step|param|condition) ([^:\s]+): (.+)$", re.DOTALL)
_ENTITY = {"steps": STEP, "params": PARAM, "conditions": CONDITION}
_SUBJECT_TABLE = {"step": STEP, "param": PARAM, "condition": CONDITION}


class _Bad(ValueError):
    pass


@dataclass
class _Draft:
    row: Row
    doc: dict[str, Any]
    children: dict[str, list[tuple[Row, dict[str, Any]]]] = field(
        default_factory=lambda: {STEP: [], PARAM: [], CONDITION: []}
    )


class _Assembly:
    def __init__(self, result: TablesResult, tables: dict[str, list[Row]]) -> None:
        self.result = result
        self.tables = tables
        self.drafts: dict[str, _Draft] = {}
        self.deleted_jobs: set[str] = set()
        self.step_job: dict[str, str] = {}  # step id -> job id (active steps)
        self.deleted_steps: dict[str, str | None] = {}  # step id -> job id
        self.step_rows: dict[str, Row] = {}

    def problem(self, row: Row, job: str | None, reason: str, *, orphan: bool = False) -> None:
        """A problem of ``row``, of the job whose id in the tables is ``job`` (named by the id
        it is imported as)."""
        named = None if job is None else valid_id(job, Kind.JOB)
        found = TableProblem(row.table, row.number, row.line, named, reason)
        self.result.problems.append(found)
        if orphan and job is None:
            self.result.orphans.append(found)

    def left_out(self, table: str) -> None:
        self.result.deleted[table] = self.result.deleted.get(table, 0) + 1

    def run(self) -> None:
        self.jobs()
        self.steps()
        self.params()
        self.conditions()
        for job_id, draft in self.drafts.items():
            self.validate(job_id, draft)

    # -- one table after another ----------------------------------------------------------------

    def active(self, row: Row, job: str | None) -> bool:
        try:
            return _flag(row.get("is_active")) is not False
        except _Bad as err:
            self.problem(row, job, f"is_active: {err}")
            return True

    def jobs(self) -> None:
        for row in self.tables[JOB]:
            if not row.values:
                continue  # unreadable: named already
            job_id = _text(row.get("id"))
            if job_id is None:
                self.problem(row, None, "id is empty")
                continue
            if not self.active(row, job_id):
                self.deleted_jobs.add(job_id)
                self.left_out(JOB)
                continue
            if job_id in self.drafts:
                first = self.drafts[job_id].row
                self.problem(row, job_id, f"duplicate id {job_id!r} (also row {first.number})")
                continue
            doc = self.fields(row, job_id)
            if (overlap := row.get("overlap_allowed")) is not None:
                try:
                    doc["overlap_allowed"] = _overlap(overlap)
                except _Bad as err:
                    self.problem(row, job_id, f"overlap_allowed: {err}")
            origin = {c: str(row.get(c)) for c in (*TENANT, *AUDIT) if row.get(c) is not None}
            if origin:
                doc["origin"] = origin
            tenant = self.tenant_of(row, job_id)
            if tenant is not None:
                doc["tenant"] = tenant
            first = self.result.job_rows.setdefault(doc["id"], row)
            if first is not row:
                self.problem(row, job_id, _one_id(Kind.JOB, first, row, doc["id"]))
            self.drafts[job_id] = _Draft(row, doc)

    def tenant_of(self, row: Row, job_id: str) -> str | None:
        """The tenant of a job's row: ``{tenant_app_id}/{tenant_account_id}``; None without."""
        app, account = (_text(row.get(c)) for c in TENANT)
        if app is None and account is None:
            return None
        if app is None or account is None:
            given, missing = TENANT if account is None else TENANT[::-1]
            self.problem(
                row,
                job_id,
                f"{given} without {missing}: a job's tenant is both "
                "({tenant_app_id}/{tenant_account_id})",
            )
            return None
        for column, part in zip(TENANT, (app, account), strict=True):
            if not _TENANT_PART.fullmatch(part):
                self.problem(
                    row,
                    job_id,
                    f"{column} {part!r} cannot name a tenant (1 to 100 characters, no spaces "
                    "and no '/')",
                )
                return None
        return f"{app}/{account}"

    def owner(self, row: Row, job_id: Any, what: str) -> _Draft | None:
        """The draft of job ``job_id`` that ``row`` belongs to; None (and why) when there is
        none or the job is deleted."""
        job = _text(job_id)
        if job is None:
            self.problem(row, None, "job_id is empty")
            return None
        if job in self.deleted_jobs:
            self.left_out(row.table)  # a row of a deleted job
            return None
        draft = self.drafts.get(job)
        if draft is None:
            self.problem(row, None, f"{what} of an unknown job {job!r}", orphan=True)
        return draft

    def same_tenant(self, row: Row, draft: _Draft, job_id: str) -> None:
        for column in TENANT:
            mine, theirs = row.get(column), draft.row.get(column)
            if mine is not None and str(mine) != (None if theirs is None else str(theirs)):
                shown = "none" if theirs is None else repr(str(theirs))
                self.problem(row, job_id, f"{column} {str(mine)!r} differs from its job's {shown}")

    def steps(self) -> None:
        containers: dict[tuple[str, str | None], list[tuple[Row, dict[str, Any]]]] = {}
        for row in self.tables[STEP]:
            if not row.values:
                continue
            step_id = _text(row.get("id"))
            job_hint = _text(row.get("job_id"))
            if step_id is None:
                self.problem(row, job_hint if job_hint in self.drafts else None, "id is empty")
                continue
            if not self.active(row, job_hint):
                self.deleted_steps[step_id] = job_hint
                self.left_out(STEP)
                continue
            draft = self.owner(row, row.get("job_id"), "a step")
            if draft is None:
                continue
            job_id = draft.row.get("id")
            if step_id in self.step_rows:
                first = self.step_rows[step_id]
                self.problem(row, job_id, f"duplicate id {step_id!r} (also row {first.number})")
                continue
            self.same_tenant(row, draft, job_id)
            doc = self.fields(row, job_id)
            retry = {}
            for column, key in _RETRY.items():
                value = self.convert(row, job_id, column)
                if value is not None:
                    retry[key] = value
            if retry:
                doc["retry"] = retry
            self.step_job[step_id] = job_id
            self.step_rows[step_id] = row
            draft.children[STEP].append((row, doc))
            containers.setdefault((job_id, _text(row.get("flow_step_id"))), []).append((row, doc))
        for (job_id, parent), members in containers.items():
            self.order(job_id, parent, members)

    def order(
        self, job_id: str, parent: str | None, members: list[tuple[Row, dict[str, Any]]]
    ) -> None:
        """The steps of one container run by ``seq``; without one, in the order of their rows.
        Two steps of one container at the same place are refused."""
        taken: dict[int, Row] = {}
        where = "the job's top level" if parent is None else f"flow step {parent!r}"
        for position, (row, doc) in enumerate(members, start=1):
            seq = doc.setdefault("seq", position)
            if isinstance(seq, int) and seq in taken:
                self.problem(
                    row,
                    job_id,
                    f"duplicate step order: seq {seq} in {where} is also step "
                    f"{taken[seq].get('id')!r}'s (row {taken[seq].number})",
                )
            else:
                taken[seq] = row

    def step_of(self, row: Row, what: str) -> _Draft | None:  # noqa: PLR0911
        """The draft of the job whose step ``row`` (a param or condition) names."""
        step_id = _text(row.get("step_id"))
        job_hint = _text(row.get("job_id"))
        hint = job_hint if job_hint in self.drafts else None
        if step_id is None:
            self.problem(row, hint, "step_id is empty")
            return None
        job_id = self.step_job.get(step_id)
        if job_id is None:
            if step_id in self.deleted_steps:
                owner = self.deleted_steps[step_id] or job_hint
                if owner in self.deleted_jobs:
                    self.left_out(row.table)
                    return None
                self.problem(
                    row,
                    owner if owner in self.drafts else None,
                    f"{what} of step {step_id!r}, which is deleted (is_active N)",
                    orphan=True,
                )
                return None
            if job_hint in self.deleted_jobs:
                self.left_out(row.table)
                return None
            self.problem(row, hint, f"{what} of an unknown step {step_id!r}", orphan=True)
            return None
        if job_hint is not None and job_hint != job_id:
            self.problem(
                row, job_id, f"job_id {job_hint!r}, but step {step_id!r} is of job {job_id!r}"
            )
            return None
        return self.drafts[job_id]

    def children_of(self, table: str, what: str) -> None:
        seen: dict[str, Row] = {}
        for row in self.tables[table]:
            if not row.values:
                continue
            child_id = _text(row.get("id"))
            if not self.active(row, None):
                self.left_out(table)
                continue
            draft = self.step_of(row, what)
            if draft is None:
                continue
            job_id = draft.row.get("id")
            if child_id is None:
                self.problem(row, job_id, "id is empty")
                continue
            if child_id in seen:
                first = seen[child_id]
                self.problem(row, job_id, f"duplicate id {child_id!r} (also row {first.number})")
                continue
            seen[child_id] = row
            self.same_tenant(row, draft, job_id)
            draft.children[table].append((row, self.fields(row, job_id)))

    def params(self) -> None:
        self.children_of(PARAM, "a parameter")

    def conditions(self) -> None:
        self.children_of(CONDITION, "a condition")

    # -- values -----------------------------------------------------------------------------------

    def fields(self, row: Row, job_id: str) -> dict[str, Any]:
        """The model fields of ``row``: every column that has a value, converted; its ids made
        valid, its own original kept as ``source_id`` when it changed."""
        doc: dict[str, Any] = {}
        ids = _ID_COLUMNS[row.table]
        for column in COLUMNS[row.table]:
            if column in _NOT_FIELDS[row.table] or column == "overlap_allowed":
                continue
            value = self.convert(row, job_id, column)
            if value is None:
                continue
            if column in ids:
                value = valid_id(str(value), ids[column])
                if column == "id" and value != str(row.get("id")):
                    doc["source_id"] = str(row.get("id"))
            doc[column] = value
        return doc

    def convert(self, row: Row, job_id: str, column: str) -> Any:
        value = row.get(column)
        if value is None or column in _ANY:
            return value
        read = _READERS.get(column)
        if read is None:  # text: a number in a JSON file is read as its text
            return str(value) if isinstance(value, int | float) else value
        try:
            return read(value)
        except _Bad as err:
            self.problem(row, job_id, f"{column}: {err}")
            return None

    # -- the model --------------------------------------------------------------------------------

    def validate(self, job_id: str, draft: _Draft) -> None:
        self.one_id_each(job_id, draft)
        doc = _renamed(draft)
        # a value already refused was left out: the tree checks would only echo it (a missing
        # start point, a parent that is not there); they run once the job's rows read cleanly
        echoes = any(p.job == doc["id"] for p in self.result.problems)
        try:
            self.result.jobs.append(Job.model_validate(doc))
        except ValidationError as err:
            for row, reason, tree in self.refusals(draft, err):
                if not (tree and echoes):
                    self.problem(row, job_id, reason)

    def one_id_each(self, job_id: str, draft: _Draft) -> None:
        """Two steps (params, conditions) of the job whose ids become one id: refused, on the
        later row, naming the earlier one."""
        for table in (STEP, PARAM, CONDITION):
            first: dict[str, Row] = {}
            for row, doc in draft.children[table]:
                earlier = first.setdefault(doc["id"], row)
                if earlier is not row:
                    self.problem(row, job_id, _one_id(_KIND[table], earlier, row, doc["id"]))

    def refusals(self, draft: _Draft, err: ValidationError) -> list[tuple[Row, str, bool]]:
        """Each of the model's refusals, on the row it is about (and whether a tree check)."""
        by_id = {
            table: {str(d.get("id")): r for r, d in draft.children[table]}
            for table in (STEP, PARAM, CONDITION)
        }
        found: list[tuple[Row, str, bool]] = []
        for e in err.errors():
            cause = (e.get("ctx") or {}).get("error")
            if isinstance(cause, JobError):  # the tree checks: one problem each
                for text in cause.problems:
                    match = _SUBJECT.match(text)
                    row = draft.row
                    if match:
                        row = by_id[_SUBJECT_TABLE[match[1]]].get(match[2], draft.row)
                    found.append((row, text, True))
                continue
            loc = list(e["loc"])
            row = draft.row
            if loc and loc[0] in _ENTITY and len(loc) > 1 and isinstance(loc[1], int):
                row = draft.children[_ENTITY[str(loc[0])]][loc[1]][0]
                loc = loc[2:]
            found.append((row, f"{_column(loc)}: {e['msg']}" if loc else str(e["msg"]), False))
        unique: list[tuple[Row, str, bool]] = []
        for item in found:
            if item not in unique:
                unique.append(item)
        return unique


def _one_id(kind: Kind, first: Row, row: Row, new: str) -> str:
    return (
        f"id {str(row.get('id'))!r} and row {first.number}'s id {str(first.get('id'))!r} both "
        f"become the {kind.value} id {new!r}: rename one of them (ids that differ only in case "
        "or punctuation are one id here)"
    )


def _renamed(draft: _Draft) -> dict[str, Any]:
    """The job's document, with its steps, params and conditions, where the step ids its
    expressions name (a designer place, a CHOICE or param condition on ``$.steps.{id}``, a
    RETURN_DATA ``ref_path``) are the ones the steps are imported as."""
    doc = dict(draft.doc)
    steps = [d for _, d in draft.children[STEP]]
    renamed = {d["source_id"]: d["id"] for d in steps if "source_id" in d}
    if isinstance(offset := doc.get("designer_offset"), dict):
        doc["designer_offset"] = {renamed.get(k, k): v for k, v in offset.items()}
    doc["steps"] = [_rename_condition(d, renamed) for d in steps]
    params = []
    for d in draft.children[PARAM]:
        param = _rename_condition(d[1], renamed)
        if param.get("source_type") == "RETURN_DATA" and isinstance(param.get("ref_path"), str):
            param = param | {"ref_path": rename_step_path(param["ref_path"], renamed)}
        params.append(param)
    doc["params"] = params
    doc["conditions"] = [d for _, d in draft.children[CONDITION]]
    return doc


def _rename_condition(doc: dict[str, Any], renamed: Mapping[str, str]) -> dict[str, Any]:
    expression = doc.get("condition_expr")
    if not isinstance(expression, str):
        return doc
    return doc | {"condition_expr": rename_references(expression, renamed)}


def _column(loc: list[Any]) -> str:
    """The table column a model field path names (``retry.max_attempts``:
    ``retry_max_attempts``; ``origin.created_by``: ``created_by``)."""
    head = str(loc[0])
    if head == "retry" and len(loc) > 1:
        return f"retry_{loc[1]}"
    if head == "origin" and len(loc) > 1:
        return str(loc[1])
    if head in ("step_sub_type",):
        return head  # a union: the member tried is noise
    return ".".join(str(p) for p in loc)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _flag(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().upper()
    if text in ("Y", "YES", "TRUE", "1"):
        return True
    if text in ("N", "NO", "FALSE", "0"):
        return False
    raise _Bad(f"{value!r} is not Y or N")


def _integer(value: Any) -> int:
    number = _number(value)
    if not number.is_integer():
        raise _Bad(f"{value!r} is not an integer")
    return int(number)


def _number(value: Any) -> float:
    if isinstance(value, bool):
        raise _Bad(f"{value!r} is not a number")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise _Bad(f"{value!r} is not a number") from None
    if not math.isfinite(number):
        raise _Bad(f"{value!r} is not a finite number")
    return number


def _json(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError as err:
        raise _Bad(f"not JSON: {err}") from None


def _overlap(value: Any) -> int:
    """N: one run at a time; Y: up to :data:`OVERLAP_WHEN_ALLOWED`; a number: that many."""
    if not isinstance(value, bool) and isinstance(value, int | float | str):
        text = str(value).strip()
        if text.isdigit():
            return int(text)
    flag = _flag(value)  # _Bad names the value
    return OVERLAP_WHEN_ALLOWED if flag else 1


_READERS: dict[str, Callable[[Any], Any]] = {
    **dict.fromkeys(_FLAGS, _flag),
    **dict.fromkeys(_INTEGERS, _integer),
    **dict.fromkeys(_NUMBERS, _number),
    **dict.fromkeys(_JSON, _json),
}


# -- registering ------------------------------------------------------------------------------


class Action(StrEnum):
    REGISTER = "register"  # a new job
    REPLACE = "replace"  # a new version of a registered job (with replace)
    UNCHANGED = "unchanged"  # registered already, as in the tables


@dataclass(frozen=True, slots=True)
class Planned:
    job: Job
    action: Action
    version: int | None  # the registered version (None: not registered yet)


BOOKKEEPING = frozenset({"version", "created_at", "updated_at"})


def same_job(a: Job, b: Job) -> bool:
    """Whether two jobs are one document, bookkeeping (version, timestamps) aside."""
    return a.model_dump(mode="json", exclude=set(BOOKKEEPING)) == b.model_dump(
        mode="json", exclude=set(BOOKKEEPING)
    )


def plan_registration(
    registered: Iterable[Job],
    jobs: list[Job],
    *,
    replace: bool = False,
    rows: Mapping[str, Row] | None = None,
    tenants: Tenants | None = None,
) -> tuple[list[Planned], list[TableProblem]]:
    """What registering ``jobs`` next to the ``registered`` ones does: each job new, unchanged
    (importing the same tables again changes nothing) or replacing a registered version (only
    with ``replace``), and what is refused: a registered job that differs (without ``replace``),
    a registered job of another original id that the job's id became (never replaced: two
    originals are not merged), an active job with the same trigger key as another active one
    (as registering refuses), and, when ``tenants`` are given, a job of a tenant they do not
    declare."""
    rows = rows or {}
    current = {j.id: j for j in registered}
    planned: list[Planned] = []
    problems: list[TableProblem] = []

    def refuse(job: Job, reason: str) -> None:
        row = rows.get(job.id)
        problems.append(
            TableProblem(
                JOB, row.number if row else None, row.line if row else None, job.id, reason
            )
        )

    for job in jobs:
        before = current.get(job.id)
        undeclared = tenants.refusal(job) if tenants is not None else None
        if undeclared is not None:
            refuse(job, undeclared)
        elif before is not None and before.source_id != job.source_id:
            refuse(
                job,
                f"job {job.id} is registered from the id {before.source_id or before.id!r}, "
                f"and this row's id {job.source_id or job.id!r} becomes the same id: rename one "
                "of them",
            )
        elif before is None:
            planned.append(Planned(job, Action.REGISTER, None))
        elif same_job(before, job):
            planned.append(Planned(job, Action.UNCHANGED, before.version))
        elif replace:
            planned.append(Planned(job, Action.REPLACE, before.version))
        else:
            refuse(job, f"job {job.id} is registered and differs (replace it to change it)")
    after = current | {p.job.id: p.job for p in planned}
    for p in planned:
        if p.action is Action.UNCHANGED or not p.job.is_active:
            continue
        key = p.job.duplicate_key()
        twin = next(
            (
                j
                for j in after.values()
                if j.id != p.job.id and j.is_active and j.duplicate_key() == key
            ),
            None,
        )
        if twin is not None:
            refuse(
                p.job,
                f"job {p.job.id} duplicates {twin.id}: same object, trigger type, sub type and "
                "condition",
            )
    refused = {p.job for p in problems}
    return [p for p in planned if p.job.id not in refused], problems
