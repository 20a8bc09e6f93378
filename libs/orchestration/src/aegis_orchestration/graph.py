"""A job's steps as a graph: the one place that knows in what order the engine takes a job's
steps and where each one leads. The engine (:mod:`aegis_orchestration.engine`) and the ASL
export take their order from here, and the dashboard draws its outline and its graph from it.

- :func:`run_order`: the steps of one container in the order the engine takes them (by ``seq``;
  a PARALLEL's branches all at once in that order; a CHOICE's branches with a condition first,
  then its default).
- :func:`successor`: the step of the same flow that runs after a step that ended normally, None
  at the end of its container.
- :func:`graph`: every step as a :class:`Node` (a container before what it holds, as an outline
  lists them) and the :class:`Edge` s between them: where control goes after each step, out of
  the containers it ends, with the CHOICE's branches, the catch paths, the retries and the loops
  (an edge back to a step at or before its source).
- :func:`step_states`: where each step of one execution stands, from the records of its steps.

Two pseudo nodes stand for the job's start and end: :data:`START` and :data:`END` (no step id
can be either).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from aegis_orchestration.model import FlowKind, Job, JobStep, StepType, step_positions

START = "^start"
END = "^end"


class EdgeKind(StrEnum):
    START = "start"  # the job's start to its start point
    NEXT = "next"  # to the following step by seq; out of a finished SEQUENCE or branch; to END
    JUMP = "jump"  # to a step's next_step_id (a loop when it goes back)
    ENTER = "enter"  # a SEQUENCE to its first step
    BRANCH = "branch"  # a PARALLEL to each of its branches, all at once
    IF = "if"  # a CHOICE to a branch with a condition (the label)
    DEFAULT = "default"  # a CHOICE to its default branch
    NO_BRANCH = "no_branch"  # a CHOICE on to its successor: no branch taken, or repeat limit
    CATCH = "catch"  # a TASK or PARALLEL that failed after its retries to its catch path
    RETRY = "retry"  # a TASK to itself (the label: how many retries)


class StepState(StrEnum):
    """Where a step of one execution stands (the first four as the engine records them)."""

    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CAUGHT = "CAUGHT"  # failed, and its catch path took over
    REPEAT_LIMIT = "REPEAT_LIMIT"  # a CHOICE past the job's repeat_limit: no branch taken
    WAITING = "WAITING"  # a WAIT begun
    RUNNING = "RUNNING"
    PENDING = "PENDING"  # not reached yet by a running execution
    SKIPPED = "SKIPPED"  # not reached by an execution that ended
    STOPPED = "STOPPED"  # begun, and cut off by the end of its execution (a failed branch)


CONTAINERS = (FlowKind.SEQUENCE, FlowKind.PARALLEL, FlowKind.CHOICE)


@dataclass(frozen=True)
class Node:
    step: JobStep
    parent: str | None  # the SEQUENCE, PARALLEL or CHOICE holding it; None at the top level
    depth: int
    # under a CHOICE: "if" (a branch with a condition) or "default"; None elsewhere
    branch: str | None = None
    # where the job's designer placed it (``designer_offset``), if it did
    position: tuple[float, float] | None = None

    @property
    def id(self) -> str:
        return self.step.id

    @property
    def container(self) -> bool:
        return self.step.step_sub_type in CONTAINERS


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    kind: EdgeKind
    # goes to a step at or before its source in run order: a loop
    back: bool = False
    label: str | None = None


@dataclass(frozen=True)
class Graph:
    nodes: list[Node]  # in run order, a container before the steps it holds
    edges: list[Edge]
    _rank: dict[str, int] = field(repr=False, compare=False, default_factory=dict)

    def node(self, step_id: str) -> Node:
        return self.nodes[self._rank[step_id]]

    def children(self, parent: str | None) -> list[Node]:
        """The nodes one container holds (``None``: the top level), in run order."""
        return [n for n in self.nodes if n.parent == parent]

    def edges_from(self, step_id: str) -> list[Edge]:
        return [e for e in self.edges if e.source == step_id]

    @property
    def placed(self) -> bool:
        """Whether the job's designer placed every step."""
        return all(n.position is not None for n in self.nodes)

    def loops_back(self, step_id: str) -> bool:
        """Whether the step's ``next_step_id`` goes back to a step at or before it."""
        target = self.node(step_id).step.next_step_id
        return target is not None and self._rank[target] <= self._rank[step_id]


def run_order(job: Job, parent: str | None) -> list[JobStep]:
    """The steps of one container in the order the engine takes them (``None``: the top level)."""
    kids = job.children(parent)
    if parent is not None and job.step(parent).step_sub_type is FlowKind.CHOICE:
        return [k for k in kids if k.condition_expr is not None] + [
            k for k in kids if k.condition_expr is None
        ]
    return kids


def successor(job: Job, step: JobStep) -> str | None:
    """The step that runs after ``step`` when it ends normally, in the same flow: its
    ``next_step_id``, else the next of its container by ``seq``; None at the container's end.
    A CHOICE's branch goes on where its CHOICE would; a PARALLEL's branch ends its branch."""
    return _successor(job, step)[0]


def _successor(job: Job, step: JobStep) -> tuple[str | None, bool]:
    """:func:`successor`, and whether it is a ``next_step_id`` (a jump) rather than the next by
    ``seq``."""
    holder = job.step(step.flow_step_id) if step.flow_step_id is not None else None
    if holder is not None and holder.step_sub_type is FlowKind.PARALLEL:
        return None, False
    if step.next_step_id is not None:
        return step.next_step_id, True
    if holder is not None and holder.step_sub_type is FlowKind.CHOICE:
        return _successor(job, holder)
    order = job.children(step.flow_step_id)
    i = order.index(step) + 1
    return (order[i].id if i < len(order) else None), False


def graph(job: Job) -> Graph:
    """The job's steps and where each leads (see the module docstring)."""
    positions = step_positions(job)[0]
    nodes: list[Node] = []

    def walk(parent: str | None, depth: int) -> None:
        choice = parent is not None and job.step(parent).step_sub_type is FlowKind.CHOICE
        for step in run_order(job, parent):
            branch = ("if" if step.condition_expr is not None else "default") if choice else None
            nodes.append(Node(step, parent, depth, branch, positions.get(step.id)))
            walk(step.id, depth + 1)

    walk(None, 0)
    rank = {n.id: i for i, n in enumerate(nodes)}
    edges: list[Edge] = []

    def add(source: str, target: str, kind: EdgeKind, label: str | None = None) -> None:
        back = source in rank and target in rank and rank[target] <= rank[source]
        edges.append(Edge(source, target, kind, back, label))

    add(START, job.start_step.id, EdgeKind.START)
    for node in nodes:
        step = node.step
        sub = step.step_sub_type
        kids = run_order(job, step.id)
        if sub is FlowKind.SEQUENCE:
            add(step.id, kids[0].id, EdgeKind.ENTER)
        elif sub is FlowKind.PARALLEL:
            for kid in kids:
                add(step.id, kid.id, EdgeKind.BRANCH)
        elif sub is FlowKind.CHOICE:
            for kid in kids:
                kind = EdgeKind.DEFAULT if kid.condition_expr is None else EdgeKind.IF
                add(step.id, kid.id, kind, kid.condition_expr)
            add(step.id, _onward(job, step)[0], EdgeKind.NO_BRANCH)
        else:
            add(step.id, *_onward(job, step))
        if step.catch_step_id is not None:
            add(step.id, step.catch_step_id, EdgeKind.CATCH)
        if step.retry.max_attempts and step.step_type is StepType.TASK:
            add(step.id, step.id, EdgeKind.RETRY, str(step.retry.max_attempts))
    return Graph(nodes, edges, rank)


def _onward(job: Job, step: JobStep) -> tuple[str, EdgeKind]:
    """Where control goes when ``step`` ends normally, out of every container it ends: a step,
    or :data:`END`."""
    nxt, jumped = _successor(job, step)
    if nxt is not None:
        return nxt, EdgeKind.JUMP if jumped else EdgeKind.NEXT
    holder = job.step(step.flow_step_id) if step.flow_step_id is not None else None
    while holder is not None and holder.step_sub_type is FlowKind.CHOICE:
        holder = job.step(holder.flow_step_id) if holder.flow_step_id is not None else None
    if holder is None:
        return END, EdgeKind.NEXT
    # the end of a SEQUENCE or of a PARALLEL's branch: on where that container goes
    return _onward(job, holder)


def step_states(
    job: Job, status: str, records: Iterable[Mapping[str, Any]]
) -> dict[str, StepState]:
    """Where each step of one execution stands: ``status`` is the execution's (RUNNING while it
    runs), ``records`` its steps' records in the order they were written (``step_id``,
    ``status``, and for a CHOICE the ``branch`` taken), as the orchestrator's runner logs them.

    The records are replayed along the job's flow: a step is RUNNING from when the step before
    it ended until its own record comes (a SEQUENCE or a PARALLEL while what it holds runs), and
    a step run again (a loop) is RUNNING again until its new record. A step not reached is
    PENDING while the execution runs, SKIPPED once it ended; one still running when the
    execution ended was cut off (STOPPED), unless nothing ran at all. Records of steps the job
    no longer has are ignored."""
    states: dict[str, StepState] = {}
    known = {s.id for s in job.steps}

    def enter(step_id: str) -> None:
        states[step_id] = StepState.RUNNING
        sub = job.step(step_id).step_sub_type
        if sub is FlowKind.SEQUENCE:
            enter(run_order(job, step_id)[0].id)
        elif sub is FlowKind.PARALLEL:
            for kid in run_order(job, step_id):
                enter(kid.id)

    enter(job.start_step.id)
    recorded_any = False
    for record in records:
        step_id, recorded = record.get("step_id"), str(record.get("status") or "")
        if step_id not in known or recorded not in StepState.__members__:
            continue
        recorded_any = True
        step = job.step(str(step_id))
        states[step.id] = StepState(recorded)
        after = _after(job, step, StepState(recorded), record.get("branch"), known)
        if after is not None:
            enter(after)
    running = status == StepState.RUNNING
    if not running and not recorded_any:  # it never ran (no run slot free: SKIPPED_OVERLAP)
        return dict.fromkeys((s.id for s in job.steps), StepState.SKIPPED)
    for s in job.steps:
        now = states.get(s.id)
        if now is None:
            states[s.id] = StepState.PENDING if running else StepState.SKIPPED
        elif not running and now in (StepState.RUNNING, StepState.WAITING):
            states[s.id] = StepState.STOPPED
    return {s.id: states[s.id] for s in job.steps}


def _after(
    job: Job, step: JobStep, recorded: StepState, branch: object, known: set[str]
) -> str | None:
    """The step that begins when ``step`` is recorded so, if any."""
    if recorded is StepState.CAUGHT:
        return step.catch_step_id
    if (
        recorded is StepState.SUCCEEDED
        and step.step_sub_type is FlowKind.CHOICE
        and branch in known
    ):
        return str(branch)
    if recorded in (StepState.SUCCEEDED, StepState.REPEAT_LIMIT):
        return successor(job, step)
    return None
