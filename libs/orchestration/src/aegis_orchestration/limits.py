"""The bounds of one execution: context size, steps per execution, runs of one step (repeat_limit
across nested loops), and the size of the execution's log item. A job past a bound fails with
:class:`LimitExceeded` (never caught by a catch path: a loop through its catch path would
otherwise go on), so no job can grow a replica's memory or its log item without end.

Pure: sizes are measured on the JSON the context or item would be stored as.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# DynamoDB refuses items over 400 KB; the budget leaves room for attribute names and type tags
DYNAMODB_ITEM_BYTES = 400 * 1024
# a value kept by reference (an S3 object) is ``{CLAIM_CHECK: {"bucket", "key", "bytes"}}``
CLAIM_CHECK = "claim_check"


def claim_check(value: Any) -> dict[str, Any] | None:
    """The reference (``bucket``, ``key``, ``bytes``) when ``value`` stands for an S3 object."""
    if isinstance(value, dict) and set(value) == {CLAIM_CHECK}:
        reference = value[CLAIM_CHECK]
        if isinstance(reference, dict):
            return reference
    return None


class ExecutionError(Exception):
    """What ends a step for good; ``error`` is the ASL-style error name, ``cause`` the detail."""

    def __init__(self, step_id: str, error: str, cause: str) -> None:
        super().__init__(f"step {step_id}: {error}: {cause}")
        self.step_id = step_id
        self.error = error
        self.cause = cause


class LimitExceeded(ExecutionError):
    """A bound of the execution was passed (no catch path applies)."""


@dataclass(frozen=True, slots=True)
class Limits:
    # the whole context (trigger data, step outputs, errors, loop counters) as JSON; Step
    # Functions stops a state's payload at 256 KB, the built-in engine allows more by default
    max_context_bytes: int = 1024 * 1024
    max_steps: int = 1000  # step runs per execution, containers and replays included
    max_item_bytes: int = 350 * 1024  # the execution log item


def json_size(value: Any) -> int:
    """Bytes of ``value`` as compact JSON (how the context and the log item are measured)."""
    return len(json.dumps(value, default=str, separators=(",", ":")).encode())


def check_context(step_id: str, context: Any, limits: Limits) -> int:
    """The context's size; :class:`LimitExceeded` when it is over ``max_context_bytes``."""
    size = json_size(context)
    if size > limits.max_context_bytes:
        raise LimitExceeded(
            step_id,
            "ContextTooLarge",
            f"the execution context grew to {size} bytes after step {step_id}, over the limit "
            f"of {limits.max_context_bytes} bytes (does a PARALLEL inside a loop copy it each round?)",
        )
    return size


def check_steps(step_id: str, count: int, limits: Limits) -> None:
    """``count`` step runs so far, this one included."""
    if count > limits.max_steps:
        raise LimitExceeded(
            step_id,
            "StepLimitExceeded",
            f"step {step_id} would be step run {count} of this execution, over the limit of "
            f"{limits.max_steps}",
        )


def allowed_runs(repeat_limit: int, choices: int) -> int:
    """Runs one step may have in an execution: the first, plus one per loop back the job allows
    (each CHOICE is evaluated at most ``repeat_limit`` times per execution, its counter shared by
    every pass through the containers around it, so nested loops add up instead of multiplying)."""
    return 1 + repeat_limit * max(1, choices)


REPEAT_LIMIT_EXCEEDED = "RepeatLimitExceeded"


def repeat_limit_cause(step_id: str, runs: int, allowed: int) -> str:
    """The cause of :data:`REPEAT_LIMIT_EXCEEDED` (the exported state machine says the same)."""
    return (
        f"step {step_id} would run {runs} times in this execution; its repeat_limit allows "
        f"{allowed}"
    )


def check_runs(step_id: str, runs: int, allowed: int) -> None:
    """``runs`` runs of one step in this execution, counted across every loop and branch that
    reaches it (a loop without a CHOICE, through ``next_step_id`` or a catch path, ends here)."""
    if runs > allowed:
        raise LimitExceeded(
            step_id, REPEAT_LIMIT_EXCEEDED, repeat_limit_cause(step_id, runs, allowed)
        )


def check_item(size: int, limits: Limits) -> None:
    """An execution log item of ``size`` bytes, its large values already stored by reference."""
    if size > limits.max_item_bytes:
        raise LimitExceeded(
            "execution",
            "ExecutionLogTooLarge",
            f"the execution log item would be {size} bytes with every large value stored by "
            f"reference, over the limit of {limits.max_item_bytes} bytes (DynamoDB stops at "
            f"{DYNAMODB_ITEM_BYTES}): too many steps for one execution",
        )
