"""The orchestration job model: a Job (trigger + workflow) with its JobSteps (nested
FLOW steps via ``flow_step_id``), StepParams (nested via ``parent_param_id``) and TaskConditions.

The four entities are kept as four flat lists inside one Job document (that is how they
are stored, exported and imported), and :func:`validate_job` checks that they form a well-formed
tree: one start point, every reference resolves, no cycles in nesting, CHOICE branch conditions
and trigger conditions parse (:mod:`aegis_orchestration.dsl`).

Errors: :class:`JobError` (a ``ValueError``) with the list of ``problems`` found.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from aegis_contracts.subjects import CHANGE_ENTITIES, EXPIRING_ENTITIES, OBJECT_FAMILIES
from aegis_orchestration.dsl import ConditionSyntaxError, canonical, parse

ID_PATTERN = r"^[a-z][a-z0-9_-]{0,47}$"
# step, param and condition ids appear in JSONPaths ($.steps.{id}) and ASL state names
STEP_ID_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
_ID = re.compile(ID_PATTERN)
# a tenant: "{app_id}/{account_id}" (the tenant columns of imported tables) or a name, as the
# orchestrator's tenants file declares it (:mod:`aegis_orchestration.tenants`)
TENANT_PATTERN = r"^[^\s/]{1,100}(/[^\s/]{1,100})?$"
DEFAULT_TIMEZONE = "Asia/Seoul"


class JobError(ValueError):
    """A job that is not well formed; ``problems`` lists every fault found."""

    def __init__(self, job_id: str, problems: list[str]) -> None:
        super().__init__(f"job {job_id!r}: " + "; ".join(problems))
        self.job_id = job_id
        self.problems = problems


class TriggerType(StrEnum):
    COMPONENT = "Component"
    BIZ_OBJECT = "BizObject"
    PLATFORM = "Platform"
    AUTOMATION = "Automation"
    SCHEDULE = "Schedule"


# the sub types of a BizObject job and the change event names they stand for
BIZ_SUB_TYPES = {"Insert": "INSERT", "Update": "MODIFY", "Delete": "REMOVE"}


class MisfirePolicy(StrEnum):
    """What a schedule does with fires missed while no replica ran (within ``misfire_grace_s``)."""

    SKIP = "SKIP"  # only future fires
    FIRE_ONCE = "FIRE_ONCE"  # one run for all that were missed (the latest)
    FIRE_ALL = "FIRE_ALL"  # every missed fire, oldest first


class StepType(StrEnum):
    TASK = "TASK"
    FLOW = "FLOW"
    DUMMY = "DUMMY"


class TaskKind(StrEnum):
    SLACK_NOTIFY = "SLACK_NOTIFY"
    HTTP_WEBHOOK = "HTTP_WEBHOOK"
    PUBLISH_EVENT = "PUBLISH_EVENT"
    RUN_COMMAND = "RUN_COMMAND"
    READ_MODEL_QUERY = "READ_MODEL_QUERY"


class FlowKind(StrEnum):
    SEQUENCE = "SEQUENCE"
    PARALLEL = "PARALLEL"
    CHOICE = "CHOICE"
    WAIT = "WAIT"


class SourceType(StrEnum):
    TRIGGER_DATA = "TRIGGER_DATA"  # ref_path into the trigger's data ($.afterData...)
    PAYLOAD = "PAYLOAD"  # ref_path into the execution input
    RETURN_DATA = "RETURN_DATA"  # ref_path into the outputs of earlier steps ($.{step_id}...)
    GLOBAL_TASK_PARAMETER = "GLOBAL_TASK_PARAMETER"  # ref_path names a job global parameter
    STATIC = "STATIC"  # param_value
    ENVIRONMENT = "ENVIRONMENT"  # param_value with ${AEGIS_JOB_*} placeholders


class DataType(StrEnum):
    STRING = "STRING"
    NUMBER = "NUMBER"
    INTEGER = "INTEGER"
    BOOLEAN = "BOOLEAN"
    JSON = "JSON"
    OBJECT = "OBJECT"  # built from child params
    ARRAY = "ARRAY"  # built from child params, ordered by param_index


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)


# the id a row had in the tables it was imported from (a UUID, a hexadecimal or numeric key),
# kept when it had to be mapped to a valid id (:mod:`aegis_orchestration.source_ids`)
SourceId = Annotated[str, Field(min_length=1, max_length=255)]


class Retry(_Model):
    """Per-step retry (ASL ``Retry``): ``max_attempts`` retries after the first try, waiting
    ``interval_s * backoff_rate**n`` (at most ``max_delay_s``) between them."""

    max_attempts: int = Field(default=0, ge=0, le=10)
    interval_s: float = Field(default=1.0, ge=0, le=3600)
    backoff_rate: float = Field(default=2.0, ge=1.0, le=10)
    max_delay_s: float = Field(default=60.0, ge=0, le=3600)

    def delay(self, retry: int) -> float:
        """Seconds before retry number ``retry`` (1-based)."""
        return float(min(self.max_delay_s, self.interval_s * self.backoff_rate ** (retry - 1)))


class StepParam(_Model):
    id: str = Field(pattern=STEP_ID_PATTERN)
    source_id: SourceId | None = None
    step_id: str
    parent_param_id: str | None = None
    param_name: str | None = None
    param_description: str | None = None
    param_key: str = Field(min_length=1, max_length=100)
    param_value: Any = None
    param_seq: int | None = None
    param_index: int | None = None
    data_type: DataType = DataType.STRING
    param_type: str = Field(default="IN", pattern=r"^(IN|OUT|INOUT)$")
    source_type: SourceType = SourceType.STATIC
    target_type: str | None = None
    ref_path: str | None = None
    default_value: Any = None
    is_required: bool = False
    max_length: int | None = Field(default=None, ge=1)
    condition_expr: str | None = None


class TaskCondition(_Model):
    """A READ_MODEL_QUERY's search or sort spec (its WHERE / ORDER BY rows)."""

    id: str = Field(pattern=STEP_ID_PATTERN)
    source_id: SourceId | None = None
    step_id: str
    field_id: str = Field(min_length=1, max_length=100)  # the item attribute (dots for nesting)
    condition_type: str = Field(default="SEARCH", pattern=r"^(SEARCH|SORT)$")
    operator_type: str = Field(default="AND", pattern=r"^(AND|OR)$")
    comparison_type: str = Field(
        default="EQ", pattern=r"^(EQ|NE|GT|GE|LT|LE|BEGINS_WITH|CONTAINS|EXISTS|ASC|DESC)$"
    )
    priority: int = 0
    value_type: str = Field(default="STATIC", pattern=r"^(STATIC|PARAM_KEY)$")
    value: Any = None
    sub_key: str | None = None
    condition_index: int | None = None


class JobStep(_Model):
    id: str = Field(pattern=STEP_ID_PATTERN)
    source_id: SourceId | None = None
    flow_step_id: str | None = None
    step_name: str | None = None
    step_description: str | None = None
    step_type: StepType
    step_sub_type: TaskKind | FlowKind | None = None
    is_start_point: bool = False
    # order among the steps of one container (the job, a SEQUENCE, a PARALLEL branch list)
    seq: int = 0
    # go to this step of the same container afterwards instead of the next by seq (a loop back)
    next_step_id: str | None = None
    # CHOICE branches: the DSL condition on the execution context; None is the default branch
    condition_expr: str | None = None
    # WAIT: seconds
    wait_seconds: float | None = Field(default=None, ge=0, le=86_400)
    retry: Retry = Field(default_factory=Retry)
    # on failure after the retries: record the error and go to this step of the same container
    catch_step_id: str | None = None
    timeout_s: float = Field(default=60.0, gt=0, le=3600)

    @model_validator(mode="after")
    def _sub_type_fits(self) -> JobStep:
        sub = self.step_sub_type
        if self.step_type is StepType.TASK and not isinstance(sub, TaskKind):
            raise ValueError(f"TASK step {self.id} needs a task sub type ({', '.join(TaskKind)})")
        if self.step_type is StepType.FLOW and not isinstance(sub, FlowKind):
            raise ValueError(f"FLOW step {self.id} needs a flow sub type ({', '.join(FlowKind)})")
        if self.step_type is StepType.DUMMY and sub is not None:
            raise ValueError(f"DUMMY step {self.id} takes no sub type")
        if sub is FlowKind.WAIT and self.wait_seconds is None:
            raise ValueError(f"WAIT step {self.id} needs wait_seconds")
        return self

    @field_validator("step_sub_type", mode="before")
    @classmethod
    def _sub_type(cls, value: Any) -> Any:
        if isinstance(value, str):
            for kind in (TaskKind, FlowKind):
                if value in kind.__members__:
                    return kind(value)
        return value


ORIGIN_MAX_KEYS = 32
OriginKey = Annotated[str, Field(pattern=STEP_ID_PATTERN)]
OriginValue = Annotated[str, Field(max_length=255)]


class Job(_Model):
    id: str = Field(pattern=ID_PATTERN)
    source_id: SourceId | None = None
    orch_id: str | None = None
    object_id: str | None = None
    job_name: str = Field(min_length=1, max_length=100)
    job_description: str | None = Field(default=None, max_length=255)
    is_enabled: bool = True  # the operator's toggle
    is_active: bool = True  # False: soft-deleted
    overlap_allowed: int = Field(default=1, ge=1, le=100)  # concurrent runs of this job
    repeat_limit: int = Field(default=10, ge=0, le=1000)  # evaluations of one CHOICE per run
    trigger_type: TriggerType
    trigger_sub_type: str | None = None
    trigger_condition_expr: str | None = None
    trigger_cron: str | None = None
    trigger_cron_desc: str | None = None
    time_zone: str = DEFAULT_TIMEZONE
    misfire_policy: MisfirePolicy = MisfirePolicy.FIRE_ONCE
    misfire_grace_s: float = Field(default=300.0, ge=0, le=7 * 86_400)
    global_params: dict[str, Any] = Field(default_factory=dict)
    designer_offset: dict[str, Any] | None = None
    steps: list[JobStep] = Field(default_factory=list)
    params: list[StepParam] = Field(default_factory=list)
    conditions: list[TaskCondition] = Field(default_factory=list)
    # where the job came from, kept as given (e.g. the tenant and audit columns of the table
    # rows it was imported from); the engine never reads it
    origin: dict[OriginKey, OriginValue] | None = Field(default=None, max_length=ORIGIN_MAX_KEYS)
    # the tenant the job belongs to: its event triggers start it only for the factories the
    # orchestrator's tenants file gives that tenant (None: every factory, as any job)
    tenant: str | None = Field(default=None, pattern=TENANT_PATTERN)
    # a tenant's job: also started by events that belong to no factory (the cloud's, sign-ins)
    unscoped_events: bool = False
    version: int = 0
    created_at: str | None = None
    updated_at: str | None = None

    @field_validator("trigger_condition_expr")
    @classmethod
    def _condition_parses(cls, value: str | None) -> str | None:
        if value is not None and value.strip():
            parse(value)  # ConditionSyntaxError (a ValueError) names the position
            return value
        return None

    @model_validator(mode="after")
    def _well_formed(self) -> Job:
        problems = problems_of(self)
        if problems:
            raise JobError(self.id, problems)
        return self

    # -- navigation -------------------------------------------------------------------------

    def step(self, step_id: str) -> JobStep:
        for s in self.steps:
            if s.id == step_id:
                return s
        raise KeyError(step_id)

    def children(self, parent: str | None) -> list[JobStep]:
        """The steps of one container, in order (``None``: the job's top level)."""
        return sorted(
            (s for s in self.steps if s.flow_step_id == parent), key=lambda s: (s.seq, s.id)
        )

    def params_of(self, step_id: str) -> list[StepParam]:
        return [p for p in self.params if p.step_id == step_id]

    def conditions_of(self, step_id: str) -> list[TaskCondition]:
        return [c for c in self.conditions if c.step_id == step_id]

    @property
    def start_step(self) -> JobStep:
        return next(s for s in self.steps if s.is_start_point)

    @property
    def fires(self) -> bool:
        """Whether triggers may start it: enabled by the operator and not soft-deleted."""
        return self.is_enabled and self.is_active

    def trigger_key(self) -> tuple[str, str, str]:
        return (self.trigger_type.value, self.object_id or "*", self.trigger_sub_type or "*")

    def duplicate_key(self) -> tuple[str, ...]:
        """Two active jobs with the same key would fire twice for one event: refused."""
        condition = canonical(self.trigger_condition_expr) if self.trigger_condition_expr else ""
        schedule = ("", "")
        if self.trigger_type is TriggerType.SCHEDULE:
            schedule = (" ".join((self.trigger_cron or "").split()), self.time_zone)
        # jobs of different tenants start for different factories: not twins (a job without a
        # tenant keeps the key it always had, so the trigger claims stored stay valid)
        tenant = (self.tenant,) if self.tenant is not None else ()
        return (*self.trigger_key(), condition, *schedule, *tenant)


def problems_of(job: Job) -> list[str]:  # noqa: PLR0912 - one check after another
    """Everything wrong with the tree of ``job`` (empty when it is well formed)."""
    problems: list[str] = []
    ids = [s.id for s in job.steps]
    by_id = {s.id: s for s in job.steps}
    if len(set(ids)) != len(ids):
        problems.append("step ids are not unique")
    if not job.steps:
        problems.append("a job needs at least one step")
    starts = [s.id for s in job.steps if s.is_start_point]
    if len(starts) != 1:
        problems.append(f"exactly one step must be the start point (found {len(starts)})")
    elif by_id[starts[0]].flow_step_id is not None:
        problems.append(f"the start point {starts[0]} must be a top-level step")
    if job.trigger_type is TriggerType.SCHEDULE:
        if not job.trigger_cron:
            problems.append("a Schedule job needs trigger_cron")
        else:
            problems.extend(_cron_problems(job.trigger_cron, job.time_zone))
    elif job.trigger_cron:
        problems.append("trigger_cron is only for Schedule jobs")
    problems.extend(_never_fires(job))
    if job.unscoped_events and job.tenant is None:
        problems.append("unscoped_events is for a tenant's job (it has no tenant)")
    problems.extend(step_positions(job)[1])
    for s in job.steps:
        problems.extend(_step_problems(job, s, by_id))
    param_ids = {p.id for p in job.params}
    if len(param_ids) != len(job.params):
        problems.append("param ids are not unique")
    for p in job.params:
        if p.step_id not in by_id:
            problems.append(f"param {p.id}: step {p.step_id} does not exist")
        if p.parent_param_id is not None:
            parent = next((q for q in job.params if q.id == p.parent_param_id), None)
            if parent is None:
                problems.append(f"param {p.id}: parent {p.parent_param_id} does not exist")
            elif parent.step_id != p.step_id or parent.data_type not in (
                DataType.OBJECT,
                DataType.ARRAY,
            ):
                problems.append(f"param {p.id}: parent must be an OBJECT/ARRAY of the same step")
        problems.extend(_direction_problems(p, by_id))
        if (
            p.param_type != "OUT"
            and p.source_type not in (SourceType.STATIC, SourceType.ENVIRONMENT)
            and p.data_type not in (DataType.OBJECT, DataType.ARRAY)
            and not p.ref_path
        ):
            problems.append(f"param {p.id}: {p.source_type.value} needs ref_path")
        if p.condition_expr:
            problems.extend(_dsl_problems(f"param {p.id}", p.condition_expr))
    parents = {p.id: p.parent_param_id for p in job.params}
    for p in job.params:
        if _cycle(p.id, parents):
            problems.append(f"param {p.id}: parent_param_id forms a cycle")
            break
    for c in job.conditions:
        step = by_id.get(c.step_id)
        if step is None or step.step_sub_type is not TaskKind.READ_MODEL_QUERY:
            problems.append(f"condition {c.id}: step {c.step_id} is not a READ_MODEL_QUERY")
    return problems


def _step_problems(  # noqa: PLR0912
    job: Job, s: JobStep, by_id: dict[str, JobStep]
) -> list[str]:
    problems: list[str] = []
    parent = by_id.get(s.flow_step_id) if s.flow_step_id else None
    if s.flow_step_id is not None:
        if parent is None:
            problems.append(f"step {s.id}: flow_step_id {s.flow_step_id} does not exist")
        elif parent.step_type is not StepType.FLOW or parent.step_sub_type is FlowKind.WAIT:
            problems.append(
                f"step {s.id}: its parent {parent.id} is not a SEQUENCE/PARALLEL/CHOICE"
            )
    if _cycle(s.id, {k: v.flow_step_id for k, v in by_id.items()}):
        problems.append(f"step {s.id}: flow_step_id forms a cycle")
        return problems
    in_choice = parent is not None and parent.step_sub_type is FlowKind.CHOICE
    if s.condition_expr is not None:
        if not in_choice:
            problems.append(f"step {s.id}: condition_expr is only for CHOICE branches")
        else:
            problems.extend(_dsl_problems(f"step {s.id}", s.condition_expr))
    # a CHOICE branch continues in the CHOICE's container; anything else in its own
    container = parent.flow_step_id if in_choice and parent is not None else s.flow_step_id
    for what, target in (("next_step_id", s.next_step_id), ("catch_step_id", s.catch_step_id)):
        if target is None:
            continue
        t = by_id.get(target)
        if t is None:
            problems.append(f"step {s.id}: {what} {target} does not exist")
        elif parent is not None and parent.step_sub_type is FlowKind.PARALLEL:
            problems.append(f"step {s.id}: a PARALLEL branch cannot jump ({what})")
        elif t.flow_step_id != container:
            problems.append(f"step {s.id}: {what} {target} is not in the same container")
        elif target == s.id:
            problems.append(f"step {s.id}: {what} points at itself")
    if s.catch_step_id is not None and not (
        s.step_type is StepType.TASK or s.step_sub_type is FlowKind.PARALLEL
    ):
        problems.append(f"step {s.id}: only a TASK or PARALLEL can have a catch path")
    if s.retry.max_attempts and s.step_type is not StepType.TASK:
        problems.append(f"step {s.id}: only a TASK retries")
    if s.step_type is StepType.FLOW and s.step_sub_type is not FlowKind.WAIT:
        kids = [k for k in job.steps if k.flow_step_id == s.id]
        if not kids:
            problems.append(f"step {s.id}: a {s.step_sub_type} needs child steps")
        if s.step_sub_type is FlowKind.CHOICE:
            defaults = [k.id for k in kids if k.condition_expr is None]
            if len(defaults) > 1:
                problems.append(f"step {s.id}: a CHOICE has at most one default branch")
    return problems


def _announced(entity: str) -> tuple[str, ...]:
    """The changes of ``entity`` some event carries: its writers', and REMOVE for an entity
    whose items expire by ttl (announced where the orchestrator reads the table's stream,
    ``AEGIS_ORCHESTRATOR_EXPIRY_STREAM``)."""
    written = CHANGE_ENTITIES[entity]
    if entity in EXPIRING_ENTITIES and "REMOVE" not in written:
        return (*written, "REMOVE")
    return written


def _never_fires(job: Job) -> list[str]:
    """A BizObject or Component trigger naming what no event ever carries: refused, since such a
    job would sit registered and silent."""
    obj, sub = job.object_id or "*", job.trigger_sub_type or "*"
    if job.trigger_type is TriggerType.BIZ_OBJECT:
        if obj != "*" and obj not in CHANGE_ENTITIES:
            return [
                f"a BizObject job's object_id {obj!r} is no entity whose changes are announced "
                f"(one of {', '.join(sorted(CHANGE_ENTITIES))}, or *)"
            ]
        if sub != "*" and sub not in BIZ_SUB_TYPES:
            return [
                f"a BizObject job's trigger_sub_type {sub!r} is none of "
                f"{', '.join(BIZ_SUB_TYPES)} (or *)"
            ]
        announced = _announced(obj) if obj != "*" else ()
        if obj != "*" and sub != "*" and BIZ_SUB_TYPES[sub] not in announced:
            made = ", ".join(k for k, v in BIZ_SUB_TYPES.items() if v in announced)
            return [
                f"{obj} never announces a {sub} (only {made}: its items are neither deleted by "
                "a writer nor expire by ttl)"
            ]
    if job.trigger_type is TriggerType.COMPONENT:
        if obj != "*" and obj not in OBJECT_FAMILIES:
            return [
                f"a Component job's object_id {obj!r} is no object family "
                f"(one of {', '.join(OBJECT_FAMILIES)}, or *)"
            ]
        if sub not in ("*", "Insert"):
            return [
                f"a Component job's trigger_sub_type is Insert (objects are only created), not {sub!r}"
            ]
    return []


# where an OUT or INOUT param's value goes after its step: read there by later steps with the
# source of the same name (``ref_path`` = the param's key)
OUT_TARGETS = ("GLOBAL_TASK_PARAMETER", "PAYLOAD")


def _direction_problems(p: StepParam, by_id: Mapping[str, JobStep]) -> list[str]:
    if p.param_type == "IN":
        return [f"param {p.id}: target_type is for OUT and INOUT params"] if p.target_type else []
    problems = []
    step = by_id.get(p.step_id)
    if step is not None and step.step_type is not StepType.TASK:
        problems.append(f"param {p.id}: {p.param_type} params belong to TASK steps")
    if p.parent_param_id is not None:
        problems.append(f"param {p.id}: an {p.param_type} param is top-level")
    if p.target_type is not None and p.target_type not in OUT_TARGETS:
        problems.append(
            f"param {p.id}: target_type {p.target_type} is not one of {', '.join(OUT_TARGETS)}"
        )
    return problems


def step_positions(job: Job) -> tuple[dict[str, tuple[float, float]], list[str]]:
    """Where the job's designer placed its steps, and what is wrong with those places: an entry
    of ``designer_offset`` whose key is one of the job's step ids and whose value is an object is
    that step's place, ``{"x": number, "y": number}`` (the top left corner of the step, in the
    designer's pixels); other entries (the designer's own offset, ``{"x": 120, "y": 40}``) are
    kept and not read."""
    places: dict[str, tuple[float, float]] = {}
    problems: list[str] = []
    ids = {s.id for s in job.steps}
    for key, value in (job.designer_offset or {}).items():
        if key not in ids or not isinstance(value, dict):
            continue
        x, y = value.get("x"), value.get("y")
        if not all(_coordinate(v) for v in (x, y)):
            problems.append(
                f"designer_offset.{key}: a step's place is {{x: number, y: number}} within "
                f"±{MAX_COORDINATE:,}, not {value!r}"[:300]
            )
            continue
        places[key] = (float(x), float(y))  # type: ignore[arg-type]
    return places, problems


MAX_COORDINATE = 1_000_000


def _coordinate(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and abs(value) <= MAX_COORDINATE
    )


def _cycle(start: str, parent_of: dict[str, str | None]) -> bool:
    """Whether following parents from ``start`` comes back to an id already seen."""
    seen: set[str] = set()
    current: str | None = start
    while current is not None and current in parent_of:
        if current in seen:
            return True
        seen.add(current)
        current = parent_of[current]
    return False


def _dsl_problems(where: str, text: str) -> list[str]:
    try:
        parse(text)
    except ConditionSyntaxError as err:
        return [f"{where}: condition {err.message} at line {err.line}, column {err.column}"]
    return []


def _cron_problems(cron: str, tz: str) -> list[str]:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError  # noqa: PLC0415

    from croniter import croniter  # noqa: PLC0415

    problems: list[str] = []
    if not croniter.is_valid(cron):
        problems.append(f"trigger_cron {cron!r} is not a cron expression")
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        problems.append(f"time_zone {tz!r} is unknown")
    return problems


def valid_id(value: str) -> bool:
    return _ID.fullmatch(value) is not None
