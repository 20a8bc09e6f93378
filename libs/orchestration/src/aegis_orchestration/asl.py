"""``export-asl``: a Job as an Amazon States Language state machine that runs like the built-in
engine (:mod:`aegis_orchestration.engine`).

Input of an execution: ``{"trigger": {...}, "payload": {...}}``. A first Pass state builds the
engine's context (``globals``, ``steps``, ``errors``, ``loops``). Mapping:

- TASK -> ``Task`` on the task function (``function_arn``; it receives :func:`task_parameters`:
  job id and version, step id, execution name, the state's entry time and the whole context,
  resolves the params exactly as the engine does and returns the output), result in
  ``$.steps.{id}``, ``Retry`` from the step's retry (whole seconds), ``Catch`` to its catch path
  with the error in ``$.errors.{id}``;
- PARALLEL -> ``Parallel`` whose branches end in a Pass that outputs their ``$.steps``;
- CHOICE -> a Pass that counts arrivals (``States.MathAdd`` on ``$.loops.{id}.n``) and a ``Choice``
  whose first rule leaves the loop past ``repeat_limit``; DSL conditions become Choice rules
  guarded by ``IsPresent`` and type tests, so missing data is false as in the DSL;
- SEQUENCE -> a Pass entering its steps inline; WAIT -> ``Wait``; DUMMY -> ``Pass``.

The engine's bound on a loop without a CHOICE (through ``next_step_id`` or a catch path; see
:func:`aegis_orchestration.limits.allowed_runs`) is exported too: each step on such a cycle is
entered through a Pass that counts its runs in ``$.runs.{id}.n`` and a Choice that fails the
execution (``RepeatLimitExceeded``, the engine's cause) past the runs allowed; a Parallel whose
branches hold such a counter passes that error on past its own Retry and Catch, so no catch path
catches it, as in the engine.

The trigger's data may come by reference (``{"claim_check": {...}}``, an S3 object: Step
Functions holds 256 KB of state); the task function reads it back. A job whose CHOICE conditions
read ``$.trigger`` cannot decide on a reference: its machine fails at once
(``TriggerByReference``) instead of taking a branch on data it cannot see.

A DSL construct ASL cannot express (``Array(...)`` any-semantics, wildcard JSONPaths, ``?`` in a
pattern) raises :class:`AslExportError` naming it.
"""

from __future__ import annotations

import math
import re
from typing import Any

from aegis_orchestration.dsl import (
    All,
    Any_,
    Compare,
    Condition,
    Exists,
    Literal,
    Not,
    Ref,
    Value,
    parse,
)
from aegis_orchestration.graph import run_order
from aegis_orchestration.graph import successor as step_after
from aegis_orchestration.limits import (
    CLAIM_CHECK,
    REPEAT_LIMIT_EXCEEDED,
    allowed_runs,
    repeat_limit_cause,
)
from aegis_orchestration.model import FlowKind, Job, JobStep, StepType

DEFAULT_FUNCTION_ARN = "arn:aws:lambda:ap-south-1:000000000000:function:aegis-orchestrator-task"
DONE = "Done"
BRANCH_DONE = "BranchDone"
INIT = "Init"
RUNS = "runs"  # the context's run counters of the steps on a loop without a CHOICE
TRIGGER_CHECK = "TriggerInline"
TRIGGER_BY_REFERENCE = "TriggerByReference"
# suffixes of the states added around a step (step ids are lower case: no clash)
_RUN, _COUNT, _LIMIT, _BRANCH_LIMIT = "__Run", "__Count", "__Limit", "__BranchLimit"
_SIMPLE_PATH = re.compile(r"^\$(\.[A-Za-z_][A-Za-z0-9_]*|\[\d+\])*$")


def task_parameters(job: Job, step: JobStep) -> dict[str, Any]:
    """What a Task state sends the task function (``aegis_orchestrator.sfn_task.TaskRequest``
    reads it): the job and its version (the function refuses to run a step of another version
    than the machine was exported from), the step, the execution's name and the time the state
    was entered (together the idempotency key of this run of the step: retries keep it, a loop's
    next pass does not) and the whole context."""
    return {
        "job_id": job.id,
        "job_version": job.version,
        "step_id": step.id,
        "kind": step.step_sub_type.value if step.step_sub_type else "",
        "execution.$": "$$.Execution.Name",
        "entered.$": "$$.State.EnteredTime",
        "context.$": "$",
    }


class AslExportError(ValueError):
    """The job uses something Amazon States Language cannot express."""


def export_asl(job: Job, *, function_arn: str = DEFAULT_FUNCTION_ARN) -> dict[str, Any]:
    writers = sorted({p.step_id for p in job.params if p.param_type != "IN"})
    if writers:
        # the machine keeps each task's output under steps.{id}; writing it back to the globals
        # or the payload is the built-in engine's alone, and a machine silently without it
        # would run the job differently
        raise AslExportError(
            f"OUT and INOUT params (steps {', '.join(writers)}) have no States Language form: "
            "run this job with the built-in engine"
        )
    states: dict[str, Any] = {
        INIT: {
            "Type": "Pass",
            "Parameters": {
                "trigger.$": "$.trigger",
                "payload.$": "$.payload",
                "globals": job.global_params,
                "steps": {},
                "errors": {},
                "loops": {s.id: {"n": 0} for s in job.steps if s.step_sub_type is FlowKind.CHOICE},
            },
            "Next": job.start_step.id,
        },
        DONE: {"Type": "Succeed"},
    }
    builder = _Builder(job, function_arn)
    builder.container(None, states, DONE)
    choices = [s.id for s in job.steps if s.step_sub_type is FlowKind.CHOICE]
    loop_states = {name for sid in choices for name in (sid, f"{sid}__choose")}
    allowed = allowed_runs(job.repeat_limit, len(choices))
    counted = _bound_cycles(states, loop_states, allowed)
    if counted:
        states[INIT]["Parameters"][RUNS] = {sid: {"n": 0} for sid in sorted(counted)}
    if _reads_trigger(states):
        states[TRIGGER_CHECK] = {
            "Type": "Choice",
            "Choices": [
                {
                    "Variable": f"$.trigger.{CLAIM_CHECK}",
                    "IsPresent": True,
                    "Next": TRIGGER_BY_REFERENCE,
                }
            ],
            "Default": states[INIT]["Next"],
        }
        states[TRIGGER_BY_REFERENCE] = {
            "Type": "Fail",
            "Error": TRIGGER_BY_REFERENCE,
            "Cause": f"the trigger's data was too large for Step Functions and came by "
            f"reference (S3), and the CHOICE conditions of job {job.id} read $.trigger, which "
            "a state machine can only read inline",
        }
        states[INIT]["Next"] = TRIGGER_CHECK
    _prune(states, INIT)
    return {
        "Comment": f"AEGIS job {job.id}: {job.job_name}",
        "StartAt": INIT,
        "States": states,
    }


def _bound_cycles(states: dict[str, Any], loop_states: set[str], allowed: int) -> list[str]:
    """Count the runs of every step on a cycle of ``states`` (and of the Parallel branches in
    it) that passes no CHOICE (``loop_states``: the CHOICEs' own states); returns their ids."""
    counted: list[str] = []
    for name, state in list(states.items()):
        if state["Type"] != "Parallel":
            continue
        inner = [
            sid
            for b in state["Branches"]
            for sid in _bound_cycles(b["States"], loop_states, allowed)
        ]
        if inner:
            _pass_limit_on(name, state, states)
        counted += inner
    graph = {
        name: [n for n in _successors(state) if n not in loop_states]
        for name, state in states.items()
        if name not in loop_states
    }
    for sid in sorted(_on_cycles(graph)):
        states[sid + _RUN] = states.pop(sid)
        states[sid] = {
            "Type": "Pass",
            "Parameters": {"n.$": f"States.MathAdd($.{RUNS}.{sid}.n, 1)"},
            "ResultPath": f"$.{RUNS}.{sid}",
            "Next": sid + _COUNT,
        }
        states[sid + _COUNT] = {
            "Type": "Choice",
            "Choices": [
                {
                    "Variable": f"$.{RUNS}.{sid}.n",
                    "NumericGreaterThan": allowed,
                    "Next": sid + _LIMIT,
                }
            ],
            "Default": sid + _RUN,
        }
        states[sid + _LIMIT] = {
            "Type": "Fail",
            "Error": REPEAT_LIMIT_EXCEEDED,
            "Cause": repeat_limit_cause(sid, allowed + 1, allowed),
        }
        counted.append(sid)
    return counted


def _pass_limit_on(name: str, state: dict[str, Any], states: dict[str, Any]) -> None:
    """A Parallel neither retries nor catches the repeat limit of a step in its branches: the
    error goes on to a Fail state beside it, with the branch's cause."""
    if "Retry" in state:
        state["Retry"].insert(0, {"ErrorEquals": [REPEAT_LIMIT_EXCEEDED], "MaxAttempts": 0})
    if "Catch" in state:
        state["Catch"].insert(
            0,
            {
                "ErrorEquals": [REPEAT_LIMIT_EXCEEDED],
                "ResultPath": f"$.errors.{name}",
                "Next": name + _BRANCH_LIMIT,
            },
        )
        states[name + _BRANCH_LIMIT] = {
            "Type": "Fail",
            "Error": REPEAT_LIMIT_EXCEEDED,
            "CausePath": f"$.errors.{name}.Cause",
        }


def _prune(states: dict[str, Any], start: str) -> None:
    """Drop the states nothing reaches (Step Functions refuses them): the end of a job, or of a
    PARALLEL branch, that only loops until its bound fails it."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        if name in seen or name not in states:
            continue
        seen.add(name)
        todo += _successors(states[name])
    for name in [n for n in states if n not in seen]:
        del states[name]
    for state in states.values():
        for branch in state.get("Branches", []):
            _prune(branch["States"], branch["StartAt"])


def _successors(state: dict[str, Any]) -> list[str]:
    found = [state[k] for k in ("Next", "Default") if k in state]
    found += [c["Next"] for c in state.get("Choices", [])]
    found += [c["Next"] for c in state.get("Catch", [])]
    return found


def _on_cycles(graph: dict[str, list[str]]) -> set[str]:
    """The nodes of ``graph`` that lie on a cycle (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[str] = set()

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, []):
            if nxt not in graph:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in graph[node]:
                found.update(component)

    for node in graph:
        if node not in index:
            visit(node)
    return found


def _reads_trigger(states: dict[str, Any]) -> bool:
    """Whether a Choice state (Parallel branches included) reads ``$.trigger``."""
    for state in states.values():
        if state["Type"] == "Parallel" and any(
            _reads_trigger(b["States"]) for b in state["Branches"]
        ):
            return True
        if state["Type"] == "Choice" and _paths_read(state["Choices"]) & {"$.trigger"}:
            return True
    return False


def _paths_read(rules: Any) -> set[str]:
    """The top two levels (``$.trigger``) of every path the Choice rules read."""
    found: set[str] = set()
    if isinstance(rules, list):
        for rule in rules:
            found |= _paths_read(rule)
    elif isinstance(rules, dict):
        for key, value in rules.items():
            if isinstance(value, str) and (key == "Variable" or key.endswith("Path")):
                found.add(".".join(value.split(".")[:2]).split("[")[0])
            else:
                found |= _paths_read(value)
    return found


class _Builder:
    def __init__(self, job: Job, function_arn: str) -> None:
        self.job = job
        self.function_arn = function_arn

    def container(self, parent: str | None, states: dict[str, Any], end: str) -> None:
        for step in run_order(self.job, parent):
            self.step(step, states, step_after(self.job, step) or end)

    def step(self, step: JobStep, states: dict[str, Any], successor: str) -> None:
        sid = step.id
        if step.step_type is StepType.DUMMY:
            states[sid] = {"Type": "Pass", "Next": successor}
        elif step.step_type is StepType.TASK:
            state: dict[str, Any] = {
                "Type": "Task",
                "Resource": self.function_arn,
                "Parameters": task_parameters(self.job, step),
                "ResultPath": f"$.steps.{sid}",
                "TimeoutSeconds": max(1, math.ceil(step.timeout_s)),
                "Next": successor,
            }
            self._retry_catch(step, state)
            states[sid] = state
        elif step.step_sub_type is FlowKind.WAIT:
            seconds = max(1, math.ceil(step.wait_seconds or 0))
            states[sid] = {"Type": "Wait", "Seconds": seconds, "Next": successor}
        elif step.step_sub_type is FlowKind.SEQUENCE:
            kids = self.job.children(sid)
            states[sid] = {"Type": "Pass", "Next": kids[0].id}
            self.container(sid, states, successor)
        elif step.step_sub_type is FlowKind.PARALLEL:
            branches = []
            for child in self.job.children(sid):
                # state names are unique across the whole machine, branches included
                done = f"{child.id}__{BRANCH_DONE}"
                inner: dict[str, Any] = {
                    done: {"Type": "Pass", "OutputPath": "$.steps", "End": True}
                }
                self.step(child, inner, done)
                branches.append({"StartAt": child.id, "States": inner})
            state = {
                "Type": "Parallel",
                "Branches": branches,
                "ResultPath": f"$.steps.{sid}",
                "Next": successor,
            }
            self._retry_catch(step, state)
            states[sid] = state
        elif step.step_sub_type is FlowKind.CHOICE:
            self._choice(step, states, successor)

    def _retry_catch(self, step: JobStep, state: dict[str, Any]) -> None:
        r = step.retry
        if r.max_attempts:
            state["Retry"] = [
                {
                    "ErrorEquals": ["States.ALL"],
                    "IntervalSeconds": max(1, math.ceil(r.interval_s)),
                    "MaxAttempts": r.max_attempts,
                    "BackoffRate": r.backoff_rate,
                    "MaxDelaySeconds": max(1, math.ceil(r.max_delay_s)),
                }
            ]
        if step.catch_step_id:
            state["Catch"] = [
                {
                    "ErrorEquals": ["States.ALL"],
                    "ResultPath": f"$.errors.{step.id}",
                    "Next": step.catch_step_id,
                }
            ]

    def _choice(self, step: JobStep, states: dict[str, Any], successor: str) -> None:
        sid = step.id
        chooser = f"{sid}__choose"
        states[sid] = {
            "Type": "Pass",
            "Parameters": {"n.$": f"States.MathAdd($.loops.{sid}.n, 1)"},
            "ResultPath": f"$.loops.{sid}",
            "Next": chooser,
        }
        kids = self.job.children(sid)
        rules: list[dict[str, Any]] = [
            {
                "Variable": f"$.loops.{sid}.n",
                "NumericGreaterThan": self.job.repeat_limit,
                "Next": successor,
            }
        ]
        default = successor
        for kid in kids:
            if kid.condition_expr is None:
                default = kid.id
            else:
                rule = choice_rule(parse(kid.condition_expr).condition)
                rules.append({**rule, "Next": kid.id})
            self.step(kid, states, kid.next_step_id or successor)
        states[chooser] = {"Type": "Choice", "Choices": rules, "Default": default}


# -- DSL -> Choice rules ----------------------------------------------------------------------

_OPS = {
    "EQ": "Equals",
    "GT": "GreaterThan",
    "GE": "GreaterThanEquals",
    "LT": "LessThan",
    "LE": "LessThanEquals",
}
_FAMILY = {
    "String": ("String", "IsString"),
    "Number": ("Numeric", "IsNumeric"),
    "Timestamp": ("Timestamp", "IsTimestamp"),
}
_FLIP = {"GT": "LT", "GE": "LE", "LT": "GT", "LE": "GE", "EQ": "EQ", "NE": "NE"}


def choice_rule(condition: Condition) -> dict[str, Any]:
    """One Choice rule (without ``Next``) with the DSL's meaning."""
    if isinstance(condition, All | Any_):
        parts = [choice_rule(p) for p in condition.parts]
        if len(parts) == 1:
            return parts[0]
        return {"And" if isinstance(condition, All) else "Or": parts}
    if isinstance(condition, Not):
        return {"Not": choice_rule(condition.part)}
    if isinstance(condition, Exists):
        path = _path(condition.value)
        return {"And": [{"Variable": path, "IsPresent": True}, {"Variable": path, "IsNull": False}]}
    if isinstance(condition, Compare):
        return _compare(condition)
    raise AslExportError(f"{type(condition).__name__} has no States Language form")


def _compare(c: Compare) -> dict[str, Any]:  # noqa: PLR0912 - one branch per DSL family
    name = c.name
    left, right = c.left, c.right
    if isinstance(left, Literal) and not isinstance(right, Literal):
        left, right = right, left
        for family in _FAMILY:
            if name.startswith(family):
                name = family + _FLIP[name[len(family) :]]
    path = _path(left)
    guard = [{"Variable": path, "IsPresent": True}]
    if name in ("StringMatches", "StringContains"):
        if not isinstance(right, Literal) or not isinstance(right.value, str):
            raise AslExportError(f"{name} needs a literal pattern in States Language")
        pattern = right.value
        if name == "StringMatches":
            if "?" in pattern:
                raise AslExportError("StringMatches with '?' has no States Language form")
            asl_pattern = pattern.replace("\\", "\\\\")
        else:
            asl_pattern = "*" + pattern.replace("\\", "\\\\").replace("*", "\\*") + "*"
        return {
            "And": [
                *guard,
                {"Variable": path, "IsString": True},
                {"Variable": path, "StringMatches": asl_pattern},
            ]
        }
    family = next(f for f in _FAMILY if name.startswith(f))
    op = name[len(family) :]
    prefix, type_test = _FAMILY[family]
    guard.append({"Variable": path, type_test: True})
    negate = op == "NE"
    operator = prefix + _OPS["EQ" if negate else op]
    if isinstance(right, Literal):
        value = right.value
        if family == "Timestamp":
            value = _rfc3339(value)
        elif family == "String" and not isinstance(value, str):
            raise AslExportError(f"{name} compares with a non-string literal")
        elif family == "Number":
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise AslExportError(f"{name} compares with a non-number literal")
            value = int(value) if float(value).is_integer() else value
        comparison: dict[str, Any] = {"Variable": path, operator: value}
    else:
        other = _path(right)
        guard += [{"Variable": other, "IsPresent": True}, {"Variable": other, type_test: True}]
        comparison = {"Variable": path, f"{operator}Path": other}
    if negate:
        comparison = {"Not": comparison}
    return {"And": [*guard, comparison]}


def _path(value: Value) -> str:
    if not isinstance(value, Ref):
        raise AslExportError(
            f"{type(value).__name__} (e.g. Array(...)) has no States Language form"
        )
    if value.relative:
        raise AslExportError(f"relative path {value.text} has no States Language form")
    text = "".join(value.text.split())
    if not _SIMPLE_PATH.fullmatch(text):
        raise AslExportError(f"{text} is not a plain reference path (no wildcards or filters)")
    return text


def _rfc3339(value: Any) -> str:
    from datetime import UTC, datetime  # noqa: PLC0415

    if not isinstance(value, str):
        raise AslExportError("a timestamp literal must be text")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise AslExportError(f"{value!r} is not a timestamp") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
