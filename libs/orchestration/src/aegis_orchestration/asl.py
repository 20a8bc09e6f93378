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
from aegis_orchestration.model import FlowKind, Job, JobStep, StepType

DEFAULT_FUNCTION_ARN = "arn:aws:lambda:ap-south-1:000000000000:function:aegis-orchestrator-task"
DONE = "Done"
BRANCH_DONE = "BranchDone"
INIT = "Init"
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
    return {
        "Comment": f"AEGIS job {job.id}: {job.job_name}",
        "StartAt": INIT,
        "States": states,
    }


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
