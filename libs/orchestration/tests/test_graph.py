"""A job's steps as a graph (:mod:`aegis_orchestration.graph`): the nodes in run order with their
containers, and for every kind of step where control goes after it (TASK, DUMMY, WAIT, SEQUENCE,
PARALLEL branches, CHOICE branches and the way past them, catch paths, retries, loops), the
designer's places, and where each step of an execution stands from its records, also as the
engine writes them."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from aegis_orchestration.engine import Interpreter, StepRecord
from aegis_orchestration.graph import END, START, EdgeKind, StepState, graph, step_states
from aegis_orchestration.model import Job, JobStep, TaskKind
from aegis_orchestration.yamlio import load_jobs

EXAMPLES = Path(__file__).parents[3] / "deploy" / "jobs" / "examples.yaml"
S = StepState


def task(step_id: str, seq: int, **more: Any) -> dict[str, Any]:
    return {
        "id": step_id,
        "step_type": "TASK",
        "step_sub_type": "PUBLISH_EVENT",
        "seq": seq,
        **more,
    }


def flow(step_id: str, kind: str, seq: int, **more: Any) -> dict[str, Any]:
    return {"id": step_id, "step_type": "FLOW", "step_sub_type": kind, "seq": seq, **more}


def dummy(step_id: str, seq: int, **more: Any) -> dict[str, Any]:
    return {"id": step_id, "step_type": "DUMMY", "seq": seq, **more}


def make(*steps: dict[str, Any], **more: Any) -> Job:
    first = dict(steps[0], is_start_point=True)
    return Job.model_validate(
        {
            "id": "j1",
            "job_name": "graph",
            "trigger_type": "Automation",
            "steps": [first, *steps[1:]],
            **more,
        }
    )


def edges(job: Job) -> set[tuple[str, str, str, bool]]:
    return {(e.source, e.target, e.kind.value, e.back) for e in graph(job).edges}


def test_tasks_dummies_and_waits_follow_each_other_by_seq_from_start_to_end() -> None:
    job = make(
        task("b", 2),
        dummy("a", 1),  # before the start point by seq: reached only by a jump
        flow("w", "WAIT", 3, wait_seconds=5),
        dummy("c", 4),
    )
    g = graph(job)
    assert [n.id for n in g.nodes] == ["a", "b", "w", "c"]
    assert edges(job) == {
        (START, "b", "start", False),
        ("a", "b", "next", False),
        ("b", "w", "next", False),
        ("w", "c", "next", False),
        ("c", END, "next", False),
    }
    assert all(n.parent is None and n.depth == 0 for n in g.nodes)


def test_a_task_retries_on_itself_and_catches_to_its_catch_path() -> None:
    job = make(
        task("call", 1, retry={"max_attempts": 3}, catch_step_id="down"),
        dummy("done", 2),
        dummy("down", 3),
    )
    out = graph(job).edges_from("call")
    assert [(e.target, e.kind, e.label) for e in out] == [
        ("done", EdgeKind.NEXT, None),
        ("down", EdgeKind.CATCH, None),
        ("call", EdgeKind.RETRY, "3"),
    ]
    assert ("down", END, "next", False) in edges(job)


def test_a_catch_path_to_an_earlier_step_and_a_next_step_id_back_are_loops() -> None:
    job = make(
        task("a", 1),
        task("b", 2, catch_step_id="a"),
        dummy("c", 3, next_step_id="a"),
        dummy("d", 4),
    )
    g = graph(job)
    assert {("b", "a", "catch", True), ("c", "a", "jump", True)} <= edges(job)
    assert g.loops_back("c") and not g.loops_back("b")
    # d is reached by no one, and still goes on to the end
    assert ("d", END, "next", False) in edges(job)


def test_a_forward_jump_skips_the_steps_between() -> None:
    job = make(task("a", 1, next_step_id="c"), task("b", 2), task("c", 3))
    assert {("a", "c", "jump", False), ("b", "c", "next", False)} <= edges(job)
    assert not graph(job).loops_back("a")


def test_a_sequence_enters_its_first_step_and_its_last_goes_on_after_it() -> None:
    job = make(
        task("a", 1),
        flow("seq", "SEQUENCE", 2),
        task("s2", 2, flow_step_id="seq"),
        task("s1", 1, flow_step_id="seq"),
        flow("inner", "SEQUENCE", 3, flow_step_id="seq"),
        dummy("i1", 1, flow_step_id="inner"),
        dummy("z", 3),
    )
    g = graph(job)
    assert [(n.id, n.parent, n.depth) for n in g.nodes] == [
        ("a", None, 0),
        ("seq", None, 0),
        ("s1", "seq", 1),
        ("s2", "seq", 1),
        ("inner", "seq", 1),
        ("i1", "inner", 2),
        ("z", None, 0),
    ]
    assert edges(job) == {
        (START, "a", "start", False),
        ("a", "seq", "next", False),
        ("seq", "s1", "enter", False),
        ("s1", "s2", "next", False),
        ("s2", "inner", "next", False),
        ("inner", "i1", "enter", False),
        # the end of two sequences at once: on after the outer one
        ("i1", "z", "next", False),
        ("z", END, "next", False),
    }
    assert [n.id for n in g.children("seq")] == ["s1", "s2", "inner"]
    assert g.node("inner").container and not g.node("i1").container


def test_a_parallel_starts_every_branch_and_each_branch_ends_where_the_parallel_goes_on() -> None:
    job = make(
        flow("fan", "PARALLEL", 1, catch_step_id="down"),
        task("left", 1, flow_step_id="fan", retry={"max_attempts": 1}),
        flow("right", "SEQUENCE", 2, flow_step_id="fan"),
        flow("pause", "WAIT", 1, flow_step_id="right", wait_seconds=1),
        task("log", 2, flow_step_id="right"),
        dummy("after", 2, next_step_id="end"),
        dummy("down", 3),
        dummy("end", 4),
    )
    assert edges(job) == {
        (START, "fan", "start", False),
        ("fan", "left", "branch", False),
        ("fan", "right", "branch", False),
        ("fan", "down", "catch", False),
        ("left", "after", "next", False),
        ("left", "left", "retry", True),
        ("right", "pause", "enter", False),
        ("pause", "log", "next", False),
        ("log", "after", "next", False),
        ("after", "end", "jump", False),
        ("down", "end", "next", False),
        ("end", END, "next", False),
    }


def test_a_parallel_at_the_end_of_a_sequence_ends_the_job() -> None:
    job = make(
        flow("seq", "SEQUENCE", 1),
        flow("fan", "PARALLEL", 1, flow_step_id="seq"),
        dummy("x", 1, flow_step_id="fan"),
        dummy("y", 2, flow_step_id="fan"),
    )
    assert {("x", END, "next", False), ("y", END, "next", False)} <= edges(job)


CHECK = 'StringEQ([$.trigger.state], "open")'


def test_a_choice_tries_its_conditions_before_its_default_and_goes_on_when_none_is_taken() -> None:
    job = make(
        task("a", 1),
        flow("check", "CHOICE", 2),
        dummy("closed", 1, flow_step_id="check"),  # the default, first by seq
        dummy("still_open", 2, flow_step_id="check", condition_expr=CHECK, next_step_id="a"),
        task("then", 3),
    )
    g = graph(job)
    assert [(n.id, n.branch) for n in g.children("check")] == [
        ("still_open", "if"),
        ("closed", "default"),
    ]
    assert [(e.target, e.kind, e.label) for e in g.edges_from("check")] == [
        ("still_open", EdgeKind.IF, CHECK),
        ("closed", EdgeKind.DEFAULT, None),
        ("then", EdgeKind.NO_BRANCH, None),  # past the repeat limit
    ]
    assert {
        ("still_open", "a", "jump", True),  # a loop back
        ("closed", "then", "next", False),
        ("then", END, "next", False),
    } <= edges(job)
    assert g.loops_back("still_open") and not g.loops_back("closed")


def test_a_choices_next_step_id_is_where_its_branches_and_the_way_past_it_go() -> None:
    job = make(
        flow("check", "CHOICE", 1, next_step_id="done"),
        flow("branch", "SEQUENCE", 1, flow_step_id="check", condition_expr=CHECK),
        task("b1", 1, flow_step_id="branch"),
        dummy("skipped", 2),
        dummy("done", 3),
    )
    assert {
        ("check", "branch", "if", False),
        ("check", "done", "no_branch", False),
        ("branch", "b1", "enter", False),
        ("b1", "done", "jump", False),
    } <= edges(job)


def test_a_choice_inside_a_parallel_branch_ends_the_branch() -> None:
    job = make(
        flow("fan", "PARALLEL", 1),
        flow("pick", "CHOICE", 1, flow_step_id="fan"),
        dummy("yes", 1, flow_step_id="pick", condition_expr=CHECK),
        dummy("other", 2, flow_step_id="fan"),
        dummy("after", 2),
    )
    assert {
        ("pick", "yes", "if", False),
        ("pick", "after", "no_branch", False),
        ("yes", "after", "next", False),
        ("other", "after", "next", False),
    } <= edges(job)


@pytest.mark.parametrize("job", load_jobs(EXAMPLES.read_text()), ids=lambda j: j.id)
def test_every_example_has_a_node_per_step_and_every_step_is_reached_from_the_start(
    job: Job,
) -> None:
    g = graph(job)
    assert sorted(n.id for n in g.nodes) == sorted(s.id for s in job.steps)
    ids = {n.id for n in g.nodes} | {START, END}
    assert all(e.source in ids and e.target in ids for e in g.edges)
    reached, todo = {START}, [START]
    while todo:
        for e in g.edges_from(todo.pop()):
            if e.target not in reached:
                reached.add(e.target)
                todo.append(e.target)
    assert reached == ids


def test_the_escalation_example_loops_back_to_its_wait_and_catches_a_failed_parallel() -> None:
    job = next(j for j in load_jobs(EXAMPLES.read_text()) if j.id == "gas-leak-escalation")
    assert {
        ("respond", "maintenance_down", "catch", False),
        ("maintenance_down", "wait_2m", "jump", True),
        ("escalate", "wait_2m", "jump", True),
        ("still_critical", "done", "no_branch", False),
        ("call_maintenance", "wait_2m", "next", False),
        ("evacuate", "wait_2m", "next", False),
        ("call_maintenance", "call_maintenance", "retry", True),
    } <= edges(job)


# -- the designer's places ------------------------------------------------------------------------


def test_a_job_is_placed_when_the_designer_placed_every_step() -> None:
    places = {"x": 120, "y": 40, "a": {"x": 10, "y": 20}, "b": {"x": 10.5, "y": 120}}
    g = graph(make(task("a", 1), task("b", 2), designer_offset=places))
    assert g.placed
    assert [n.position for n in g.nodes] == [(10.0, 20.0), (10.5, 120.0)]


def test_a_job_with_a_step_the_designer_did_not_place_is_not_placed() -> None:
    g = graph(make(task("a", 1), task("b", 2), designer_offset={"a": {"x": 1, "y": 2}}))
    assert not g.placed and g.node("a").position == (1.0, 2.0) and g.node("b").position is None
    # the designer's own offset places no step
    assert not graph(make(task("a", 1), designer_offset={"x": 120, "y": 40})).placed


@pytest.mark.parametrize(
    "place", [{"x": "10", "y": 1}, {"x": 1}, {"x": True, "y": 1}, {"x": 1, "y": 2e9}]
)
def test_a_steps_place_that_is_not_two_numbers_is_refused_by_name(place: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match=r"designer_offset\.a: a step's place is \{x: number"):
        make(task("a", 1), designer_offset={"a": place})


# -- where the steps of an execution stand --------------------------------------------------------


def rec(step_id: str, status: str, branch: str | None = None) -> dict[str, Any]:
    return {"step_id": step_id, "status": status, "branch": branch}


def escalation() -> Job:
    return next(j for j in load_jobs(EXAMPLES.read_text()) if j.id == "gas-leak-escalation")


def test_a_running_execution_runs_the_step_after_the_last_recorded_and_the_rest_is_pending() -> (
    None
):
    states = step_states(escalation(), "RUNNING", [rec("notify", "SUCCEEDED")])
    assert states["notify"] is S.SUCCEEDED
    # a PARALLEL runs all its branches at once
    assert [states[s] for s in ("respond", "call_maintenance", "evacuate")] == [S.RUNNING] * 3
    assert {states[s] for s in ("wait_2m", "check", "still_critical", "escalate", "done")} == {
        S.PENDING
    }
    assert states["maintenance_down"] is S.PENDING


def test_a_branch_done_waits_for_the_others_and_a_wait_begun_is_waiting() -> None:
    job = escalation()
    records = [rec("notify", "SUCCEEDED"), rec("evacuate", "SUCCEEDED")]
    states = step_states(job, "RUNNING", records)
    assert (states["evacuate"], states["call_maintenance"], states["respond"]) == (
        S.SUCCEEDED,
        S.RUNNING,
        S.RUNNING,
    )
    records += [rec("call_maintenance", "SUCCEEDED"), rec("respond", "SUCCEEDED")]
    assert step_states(job, "RUNNING", records)["wait_2m"] is S.RUNNING
    waiting = step_states(job, "RUNNING", [*records, rec("wait_2m", "WAITING")])
    assert waiting["wait_2m"] is S.WAITING and waiting["check"] is S.PENDING


def test_a_choice_runs_the_branch_it_took_and_a_loop_runs_a_step_again() -> None:
    job = escalation()
    first_round = [
        rec("notify", "SUCCEEDED"),
        rec("evacuate", "SUCCEEDED"),
        rec("call_maintenance", "SUCCEEDED"),
        rec("respond", "SUCCEEDED"),
        rec("wait_2m", "WAITING"),
        rec("wait_2m", "SUCCEEDED"),
        rec("check", "SUCCEEDED"),
        rec("still_critical", "SUCCEEDED", branch="escalate"),
    ]
    states = step_states(job, "RUNNING", first_round)
    assert states["escalate"] is S.RUNNING and states["done"] is S.PENDING
    looped = step_states(job, "RUNNING", [*first_round, rec("escalate", "SUCCEEDED")])
    assert looped["wait_2m"] is S.RUNNING and looped["check"] is S.SUCCEEDED
    limit = step_states(job, "RUNNING", [*first_round[:-1], rec("still_critical", "REPEAT_LIMIT")])
    assert limit["done"] is S.RUNNING and limit["escalate"] is S.PENDING


def test_a_caught_failure_runs_the_catch_path_and_an_ended_execution_skips_the_rest() -> None:
    job = escalation()
    records = [
        rec("notify", "SUCCEEDED"),
        rec("evacuate", "SUCCEEDED"),
        rec("call_maintenance", "FAILED"),
        rec("respond", "CAUGHT"),
    ]
    assert step_states(job, "RUNNING", records)["maintenance_down"] is S.RUNNING
    ended = step_states(job, "FAILED", [*records, rec("maintenance_down", "FAILED")])
    assert (ended["respond"], ended["maintenance_down"], ended["done"]) == (
        S.CAUGHT,
        S.FAILED,
        S.SKIPPED,
    )


def test_a_branch_cut_off_by_a_failed_branch_is_stopped() -> None:
    job = make(
        flow("fan", "PARALLEL", 1),
        task("fast", 1, flow_step_id="fan"),
        flow("slow", "SEQUENCE", 2, flow_step_id="fan"),
        flow("pause", "WAIT", 1, flow_step_id="slow", wait_seconds=60),
        task("log", 2, flow_step_id="slow"),
    )
    records = [rec("pause", "WAITING"), rec("fast", "FAILED"), rec("fan", "FAILED")]
    assert step_states(job, "FAILED", records) == {
        "fan": S.FAILED,
        "fast": S.FAILED,
        "slow": S.STOPPED,
        "pause": S.STOPPED,
        "log": S.SKIPPED,
    }


def test_records_of_steps_the_job_no_longer_has_or_of_unknown_statuses_are_ignored() -> None:
    job = make(task("a", 1), task("b", 2))
    records = [rec("gone", "SUCCEEDED"), rec("a", "BOGUS"), rec("a", "SUCCEEDED")]
    assert step_states(job, "RUNNING", records) == {"a": S.SUCCEEDED, "b": S.RUNNING}
    # one that never ran (no run slot was free) skipped every step
    assert step_states(job, "SKIPPED_OVERLAP", []) == {"a": S.SKIPPED, "b": S.SKIPPED}


async def test_as_the_engine_writes_records_each_next_step_is_the_one_shown_running() -> None:
    """The engine's own records, one at a time: the step shown RUNNING after each record is the
    one the engine records next (or holds it), and at the end every step that ran is shown as
    the engine last recorded it."""
    job = escalation()
    job = job.model_copy(
        update={
            "steps": [
                s.model_copy(update={"wait_seconds": 0}) if s.id == "wait_2m" else s
                for s in job.steps
            ]
        }
    )
    written: list[dict[str, Any]] = []
    shown: list[set[str]] = []

    async def on_step(record: StepRecord) -> None:
        if shown:
            assert record.step_id in shown[-1], (record.step_id, shown[-1])
        written.append(
            {
                "step_id": record.step_id,
                "status": record.status,
                "branch": record.branch if record.kind == "CHOICE" else None,
            }
        )
        states = step_states(job, "RUNNING", written)
        shown.append({k for k, v in states.items() if v in (S.RUNNING, S.WAITING)})

    async def ok(step: JobStep, params: dict[str, Any], ctx: Any, *, key: str) -> Any:
        if step.id == "check":
            return {"items": [{"risk": {"level": "CRITICAL"}}]}
        return {"ok": True}

    now = datetime(2026, 12, 1, 6, 0, tzinfo=UTC)

    async def no_sleep(_: float) -> None:
        return None

    result = await Interpreter(
        job,
        dict.fromkeys(TaskKind, ok),
        clock=lambda: now,
        sleep=no_sleep,
        on_step=on_step,
        environment={"AEGIS_JOB_MAINTENANCE_URL": "http://127.0.0.1:9/hook"},
    ).run({"pk": "FACTORY#factory-b", "afterData": {"factory_id": "factory-b"}})
    assert result.status == "SUCCEEDED"
    assert sum(r["step_id"] == "escalate" for r in written) == job.repeat_limit
    final = step_states(job, result.status, written)
    assert final["done"] is S.SUCCEEDED and final["maintenance_down"] is S.SKIPPED
    assert final["still_critical"] is S.REPEAT_LIMIT
    assert shown[-1] == set()
