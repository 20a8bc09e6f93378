"""The jobs pages (``/jobs`` and ``/jobs/{id}``) against the real S3/DynamoDB emulator, on a clock
the test holds still: the list (the deleted jobs only when asked for), a job's steps as a nested
outline in the order they run with what each does on failure and where it jumps, its global
params and its latest executions, newest first. Each execution's row carries where every step
of the job stands in it, for the page's flow chart, and the list alone is read again with its ETag
(304 while unchanged). Admins get an Enable or Disable button; the whole fleet's viewers and
responders read without buttons; a person scoped to a factory is refused both pages and is
offered no way there."""

from __future__ import annotations

import html
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from typing import Any

import httpx
import pytest

from aegis_contracts import keys
from aegis_contracts.people import Role, TokenRecord
from aegis_contracts.times import format_ts
from aegis_dashboard_api.access import COOKIE, token_digest
from aegis_dashboard_api.app import create_app
from aegis_dashboard_api.settings import DashboardSettings
from aegis_devstack.testing.builders import FakeClock
from aegis_devstack.testing.storage import Foundation
from aegis_orchestration.graph import graph
from aegis_orchestration.model import Job
from aegis_orchestration.store import JobStore
from aegis_storage.tokens import TokenStore

pytestmark = pytest.mark.integration

NOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
RESPONSE = "gas-leak-response"  # enabled, nested steps, two executions
NIGHTLY = "nightly-digest"  # disabled
RETIRED = "old-escalation"  # deleted (soft)
LATEST_RUN = "20261130T025500-1a2b3c4d"
EARLIER_RUN = "20261130T010000-9f8e7d6c"

# name -> (role, scope)
PEOPLE: dict[str, tuple[Role, tuple[str, ...]]] = {
    "admin": (Role.ADMIN, ("*",)),
    "viewer-fleet": (Role.VIEWER, ("*",)),
    "responder-fleet": (Role.RESPONDER, ("*",)),
    "viewer-a": (Role.VIEWER, ("factory-a",)),
}


def response_job() -> dict[str, Any]:
    """A job with every kind of nesting: a TASK that retries and has a catch path, a PARALLEL of
    two branches (one a SEQUENCE holding a WAIT), a CHOICE with a condition branch that loops
    back and a default branch."""
    return {
        "id": RESPONSE,
        "job_name": "Gas leak response",
        "job_description": "Tell the shift, page the site, check again until it is closed",
        "trigger_type": "BizObject",
        "object_id": "incident",
        "trigger_sub_type": "Update",
        "trigger_condition_expr": 'StringEQ([$.afterData.reason], "GAS_LEAK")',
        "global_params": {"channel": "#safety", "limits": {"ppm": 50}},
        "steps": [
            {
                "id": "notify",
                "step_type": "TASK",
                "step_sub_type": "SLACK_NOTIFY",
                "is_start_point": True,
                "seq": 0,
                "retry": {"max_attempts": 3, "interval_s": 2},
                "catch_step_id": "give_up",
            },
            {"id": "fan_out", "step_type": "FLOW", "step_sub_type": "PARALLEL", "seq": 1},
            {
                "id": "page_site",
                "flow_step_id": "fan_out",
                "step_type": "TASK",
                "step_sub_type": "HTTP_WEBHOOK",
                "seq": 0,
            },
            {
                "id": "log_it",
                "flow_step_id": "fan_out",
                "step_type": "FLOW",
                "step_sub_type": "SEQUENCE",
                "seq": 1,
            },
            {
                "id": "settle",
                "flow_step_id": "log_it",
                "step_type": "FLOW",
                "step_sub_type": "WAIT",
                "wait_seconds": 30,
                "seq": 0,
            },
            {
                "id": "record",
                "flow_step_id": "log_it",
                "step_type": "TASK",
                "step_sub_type": "PUBLISH_EVENT",
                "seq": 1,
            },
            {"id": "check", "step_type": "FLOW", "step_sub_type": "CHOICE", "seq": 2},
            # the default branch comes first by seq; the engine tries the conditions first
            {"id": "closed", "flow_step_id": "check", "step_type": "DUMMY", "seq": 0},
            {
                "id": "still_open",
                "flow_step_id": "check",
                "step_type": "DUMMY",
                "seq": 1,
                "condition_expr": 'StringEQ([$.trigger.afterData.state], "triggered")',
                "next_step_id": "fan_out",
            },
            {"id": "give_up", "step_type": "DUMMY", "seq": 3},
        ],
    }


def simple_job(job_id: str, name: str, **trigger: Any) -> dict[str, Any]:
    return {
        "id": job_id,
        "job_name": name,
        "steps": [{"id": "noted", "step_type": "DUMMY", "is_start_point": True}],
        **trigger,
    }


def step_entry(
    step_id: str,
    status: str,
    at: datetime,
    *,
    attempts: int = 0,
    branch: str | None = None,
    error: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A step's record as the orchestrator's runner writes it into the execution log."""
    return {
        "step_id": step_id,
        "occurrence": f"{step_id}.1",
        "kind": "TASK",
        "status": status,
        "attempts": attempts,
        "branch": branch,
        "started_at": format_ts(at),
        "finished_at": format_ts(at + timedelta(seconds=1)),
        "wake_at": None,
        "duration_ms": 1000.0,
        "input": "{}",
        "output": "null",
        "error": error,
    }


def execution(
    execution_id: str, started: datetime, status: str, steps: list[dict[str, Any]], **more: Any
) -> dict[str, Any]:
    """An execution log item as the orchestrator's runner writes it."""
    return {
        "pk": keys.exec_pk(RESPONSE),
        "sk": keys.exec_sk(started, execution_id),
        "job_id": RESPONSE,
        "job_version": 1,
        "execution_id": execution_id,
        "trigger": {
            "type": "BizObject",
            "object_id": "incident",
            "sub_type": "Update",
            "digest": "0" * 32,
        },
        "status": status,
        "started_at": format_ts(started),
        "finished_at": format_ts(started + timedelta(seconds=42)),
        "runner": "orchestrator-1",
        "steps": steps,
        "ttl": int((started + timedelta(days=30)).timestamp()),
        **more,
    }


TIMEOUT = {"Error": "States.Timeout", "Cause": "over 60.0s"}


@dataclass
class Site:
    client: httpx.AsyncClient
    tokens: dict[str, str]

    async def get(self, person: str, path: str) -> httpx.Response:
        cookie = {"Cookie": f"{COOKIE}={self.tokens[person]}"}
        return await self.client.get(path, headers=cookie)

    async def read(self, person: str, path: str) -> Page:
        answer = await self.get(person, path)
        assert answer.status_code == 200, (person, path, answer.status_code)
        return Page(answer.text)


@pytest.fixture
async def site(foundation: Foundation, unique_id: str) -> AsyncIterator[Site]:
    store = TokenStore(foundation.readmodel)
    tokens = {}
    for name, (role, scope) in PEOPLE.items():
        tokens[name] = f"token-of-{name}-{unique_id}"
        await store.add(
            TokenRecord(
                name=f"{name}-{unique_id}",
                digest=token_digest(tokens[name]),
                role=role,
                scope=scope,
                created_at=NOW,
                created_by="test",
            )
        )
    jobs = JobStore(foundation.readmodel, lambda: NOW)
    await jobs.register(Job.model_validate(response_job()))
    nightly = simple_job(
        NIGHTLY, "Nightly digest", trigger_type="Schedule", trigger_cron="0 9 * * *"
    )
    await jobs.register(Job.model_validate(nightly))
    await jobs.update(NIGHTLY, is_enabled=False)
    retired = simple_job(RETIRED, "Old escalation", trigger_type="Component", object_id="*")
    await jobs.register(Job.model_validate(retired))
    await jobs.update(RETIRED, is_active=False)
    earlier = NOW - timedelta(hours=2)
    await jobs.put_execution(
        execution(
            EARLIER_RUN,
            earlier,
            "SUCCEEDED",
            [step_entry("notify", "SUCCEEDED", earlier, attempts=1)],
        ),
        new=True,
    )
    latest = NOW - timedelta(minutes=5)
    await jobs.put_execution(
        execution(
            LATEST_RUN,
            latest,
            "FAILED",
            [
                step_entry("notify", "SUCCEEDED", latest, attempts=2),
                step_entry("record", "SUCCEEDED", latest, branch="fan_out[log_it]"),
                step_entry(
                    "page_site", "FAILED", latest, branch="fan_out[page_site]", error=TIMEOUT
                ),
                step_entry("fan_out", "FAILED", latest, error=TIMEOUT),
            ],
            error=TIMEOUT,
        ),
        new=True,
    )

    clock = FakeClock(NOW)
    app = create_app(
        DashboardSettings(bucket=foundation.bucket, table=foundation.table),
        clients=foundation.clients,
        clock=clock,
    )
    app.state.tokens.take_stored(await store.listed(now=NOW), NOW)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://dash"
    ) as client:
        yield Site(client, tokens)


# -- reading a page ------------------------------------------------------------------------------


@dataclass
class Step:
    id: str
    tags: list[str] = field(default_factory=list)  # its badges' data-tag, in order
    children: list[Step] = field(default_factory=list)

    def tree(self) -> tuple[str, list[Any]]:
        return (self.id, [c.tree() for c in self.children])


@dataclass
class Run:
    id: str
    status: str
    steps: list[tuple[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class Page(HTMLParser):
    """What the tests read of a rendered page: the menu, the jobs table's rows with their
    buttons, every button, the step outline as a tree, and the executions."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.text = text
        self.menu: dict[str, bool] = {}  # href -> marked as the current page
        self.rows: dict[str, tuple[str, list[str]]] = {}  # job id -> (state, its buttons)
        self.buttons: list[str] = []
        self.outline: list[Step] = []
        self.executions: list[Run] = []
        self.body: dict[str, str | None] = {}
        self._nav = False
        self._row: str | None = None
        self._open: list[Step | None] = []  # every open <li>: a step's, or None
        self._capture: tuple[str, list[str]] | None = None  # (tag, text) of an error
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "body":
            self.body = a
        elif tag == "nav" and a.get("aria-label") == "main":
            self._nav = True
        elif tag == "a" and self._nav:
            self.menu[str(a["href"])] = a.get("aria-current") == "page"
        elif tag == "tr" and "data-job-row" in a:
            self._row = str(a["data-job-row"])
            self.rows[self._row] = (str(a["data-state"]), [])
        elif tag == "tr" and "data-execution" in a:
            self.executions.append(Run(str(a["data-execution"]), str(a["data-status"])))
        elif tag == "button" and "data-job-action" in a:
            self.buttons.append(str(a["data-job-action"]))
            if self._row is not None:
                self.rows[self._row][1].append(str(a["data-job-action"]))
        elif tag == "li":
            self._li(a)
        elif tag == "span" and "data-tag" in a:
            holder = self._step()
            if holder is not None:
                holder.tags.append(str(a["data-tag"]))
        if "run-error" in (a.get("class") or "").split():
            self._capture = (tag, [])

    def _li(self, a: dict[str, str | None]) -> None:
        if "data-step" in a:
            step = Step(str(a["data-step"]))
            parent = self._step()
            (parent.children if parent is not None else self.outline).append(step)
            self._open.append(step)
            return
        self._open.append(None)
        if "data-step-run" in a:
            self.executions[-1].steps.append((str(a["data-step-run"]), str(a["data-status"])))

    def _step(self) -> Step | None:
        return next((s for s in reversed(self._open) if s is not None), None)

    def handle_endtag(self, tag: str) -> None:
        if tag == "nav":
            self._nav = False
        elif tag == "tr":
            self._row = None
        elif tag == "li":
            self._open.pop()
        if self._capture is not None and tag == self._capture[0]:
            self.executions[-1].errors.append("".join(self._capture[1]).strip())
            self._capture = None

    def handle_data(self, data: str) -> None:
        if self._capture is not None:
            self._capture[1].append(data)


# -- the tests -----------------------------------------------------------------------------------


async def test_an_admin_sees_the_active_jobs_with_disable_on_the_enabled_and_enable_on_the_disabled(
    site: Site,
) -> None:
    page = await site.read("admin", "/jobs")
    assert page.body["data-page"] == "jobs"
    assert page.rows == {
        RESPONSE: ("enabled", ["disable"]),
        NIGHTLY: ("disabled", ["enable"]),
    }
    assert page.menu["/jobs"] is True and page.menu["/"] is False
    assert f'href="/jobs/{RESPONSE}"' in page.text
    # the columns: trigger (object / sub type), condition, steps, version, updated in KST
    assert "incident / Update" in page.text
    assert "StringEQ([$.afterData.reason], &#34;GAS_LEAK&#34;)" in page.text
    assert "2026-11-30 12:00:00 KST" in page.text


async def test_deleted_jobs_are_listed_only_with_deleted_1_and_get_no_button(site: Site) -> None:
    hidden = await site.read("admin", "/jobs")
    assert RETIRED not in hidden.rows and 'href="/jobs?deleted=1"' in hidden.text
    shown = await site.read("admin", "/jobs?deleted=1")
    assert list(shown.rows) == [RESPONSE, NIGHTLY, RETIRED]  # by id
    assert shown.rows[RETIRED] == ("deleted", [])
    assert 'href="/jobs"' in shown.text  # and back


async def test_the_job_page_shows_every_step_nested_in_run_order_with_its_badges(
    site: Site,
) -> None:
    page = await site.read("admin", f"/jobs/{RESPONSE}")
    assert page.body["data-page"] == "job"
    assert [s.tree() for s in page.outline] == [
        ("notify", []),
        (
            "fan_out",
            [("page_site", []), ("log_it", [("settle", []), ("record", [])])],
        ),
        # the condition branch before the default, as the engine tries them
        ("check", [("still_open", []), ("closed", [])]),
        ("give_up", []),
    ]
    notify, fan_out, check, _ = page.outline
    assert notify.tags == ["start", "retry", "catch"]
    assert fan_out.tags == ["parallel"]
    assert fan_out.children[1].children[0].tags == ["wait"]
    assert [c.tags for c in check.children] == [["if", "loop"], ["default"]]
    assert "retries up to 3 times" in page.text and "waits 30 s" in page.text
    assert "2 branches at once" in page.text
    assert 'href="#step-give_up"' in page.text and 'href="#step-fan_out"' in page.text
    assert "StringEQ([$.trigger.afterData.state], &#34;triggered&#34;)" in page.text
    # the header and the global params
    assert "Gas leak response" in page.text and "check again until it is closed" in page.text
    assert "incident / Update" in page.text
    assert "<code>#safety</code>" in page.text and "{&#34;ppm&#34;: 50}" in page.text
    assert page.menu["/jobs"] is True


async def test_the_job_page_shows_the_executions_newest_first_with_each_steps_status_and_the_error(
    site: Site,
) -> None:
    page = await site.read("admin", f"/jobs/{RESPONSE}")
    assert [(r.id, r.status) for r in page.executions] == [
        (LATEST_RUN, "FAILED"),
        (EARLIER_RUN, "SUCCEEDED"),
    ]
    latest = page.executions[0]
    assert latest.steps == [
        ("notify", "SUCCEEDED"),
        ("record", "SUCCEEDED"),
        ("page_site", "FAILED"),
        ("fan_out", "FAILED"),
    ]
    # the failed steps' errors, then the execution's
    assert latest.errors == ["States.Timeout: over 60.0s"] * 3
    assert page.executions[1].errors == []
    assert "rs-failed" in page.text and "rs-succeeded" in page.text  # coloured by status
    assert "2026-11-30 11:55:00 KST" in page.text and "took 42 s" in page.text
    assert "2 attempts" in page.text  # notify's retry


async def test_an_admin_gets_a_disable_button_on_an_enabled_jobs_page(site: Site) -> None:
    assert (await site.read("admin", f"/jobs/{RESPONSE}")).buttons == ["disable"]
    assert (await site.read("admin", f"/jobs/{NIGHTLY}")).buttons == ["enable"]
    assert (await site.read("admin", f"/jobs/{RETIRED}")).buttons == []


@pytest.mark.parametrize("person", ["viewer-fleet", "responder-fleet"])
async def test_the_whole_fleets_viewer_and_responder_read_both_pages_without_buttons(
    site: Site, person: str
) -> None:
    listed = await site.read(person, "/jobs")
    assert set(listed.rows) == {RESPONSE, NIGHTLY}
    assert listed.buttons == [] and 'class="job-act"' not in listed.text
    one = await site.read(person, f"/jobs/{RESPONSE}")
    assert [s.id for s in one.outline] == ["notify", "fan_out", "check", "give_up"]
    assert [r.status for r in one.executions] == ["FAILED", "SUCCEEDED"]
    assert one.buttons == []
    assert "/jobs" in (await site.read(person, "/")).menu  # the menu leads there


async def test_a_viewer_scoped_to_one_factory_is_refused_both_pages_and_has_no_jobs_menu_entry(
    site: Site,
) -> None:
    for path in ("/jobs", "/jobs?deleted=1", f"/jobs/{RESPONSE}", "/jobs/no-such-job"):
        answer = await site.get("viewer-a", path)
        assert answer.status_code == 403, path
        refused = Page(answer.text)
        assert refused.body["data-page"] == "missing", path
        assert RESPONSE not in answer.text and "Gas leak" not in answer.text, path
        assert "/jobs" not in refused.menu, path
    assert "/jobs" not in (await site.read("viewer-a", "/")).menu


@pytest.mark.parametrize("job_id", ["no-such-job", "Not%20An%20Id"])
async def test_an_unknown_or_invalid_job_id_is_the_missing_page_with_404(
    site: Site, job_id: str
) -> None:
    answer = await site.get("admin", f"/jobs/{job_id}")
    assert answer.status_code == 404
    page = Page(answer.text)
    assert page.body["data-page"] == "missing"
    assert "Unknown job" in page.text and 'href="/jobs"' in page.text
    assert page.outline == [] and page.executions == []


async def test_the_jobs_pages_are_in_korean_with_lang_ko(site: Site) -> None:
    listed = await site.read("admin", "/jobs?lang=ko")
    assert "자동화 작업" in listed.text and "비활성화" in listed.text and "활성" in listed.text
    one = await site.read("admin", f"/jobs/{RESPONSE}?lang=ko")
    assert "실행 순서별 단계" in one.text and "최대 3회 재시도" in one.text
    assert "실패" in one.text and "30초 대기" in one.text


def states_of(page: Page, execution_id: str) -> dict[str, str]:
    """Where each step stands in one execution, as its row on the page carries it."""
    at = page.text.index(f'data-execution="{execution_id}"')
    row = page.text[at : page.text.index(">", at)]
    found = re.search(r'data-states="([^"]*)"', row)
    assert found is not None, row
    return dict(json.loads(html.unescape(found.group(1))))


async def test_each_execution_row_carries_where_every_step_stands_in_it(site: Site) -> None:
    page = await site.read("viewer-fleet", f"/jobs/{RESPONSE}")
    assert states_of(page, LATEST_RUN) == {
        "notify": "SUCCEEDED",
        "fan_out": "FAILED",
        "page_site": "FAILED",
        "log_it": "STOPPED",  # cut off by the failed branch
        "settle": "STOPPED",
        "record": "SUCCEEDED",
        "check": "SKIPPED",
        "closed": "SKIPPED",
        "still_open": "SKIPPED",
        "give_up": "SKIPPED",
    }
    assert states_of(page, EARLIER_RUN)["notify"] == "SUCCEEDED"
    assert (
        'data-step-errors="{&#34;page_site&#34;:&#34;States.Timeout: over 60.0s&#34;' in page.text
    )
    assert page.text.count('class="exec-pick small"') == 2


async def test_the_executions_are_read_again_alone_and_answered_304_while_unchanged(
    site: Site, foundation: Foundation
) -> None:
    path = f"/jobs/{RESPONSE}/executions"
    first = await site.get("viewer-fleet", path)
    assert first.status_code == 200 and first.headers["content-type"].startswith("text/html")
    part = Page(first.text)
    assert [r.id for r in part.executions] == [LATEST_RUN, EARLIER_RUN]
    assert "<html" not in first.text and part.outline == []
    tag = first.headers["etag"]
    cookie = {"Cookie": f"{COOKIE}={site.tokens['viewer-fleet']}"}
    same = await site.client.get(path, headers={**cookie, "If-None-Match": tag})
    assert same.status_code == 304 and same.content == b"" and same.headers["etag"] == tag
    # a step recorded in a new execution: a new list, a new tag
    newest = NOW - timedelta(minutes=1)
    await JobStore(foundation.readmodel, lambda: NOW).put_execution(
        execution("20261130T025900-77aa88bb", newest, "RUNNING", [
            step_entry("notify", "SUCCEEDED", newest, attempts=1)
        ]),
        new=True,
    )  # fmt: skip
    changed = await site.client.get(path, headers={**cookie, "If-None-Match": tag})
    assert changed.status_code == 200 and changed.headers["etag"] != tag
    assert Page(changed.text).executions[0].id == "20261130T025900-77aa88bb"
    assert states_of(Page(changed.text), "20261130T025900-77aa88bb")["fan_out"] == "RUNNING"


async def test_the_executions_alone_are_refused_as_the_job_page_is(site: Site) -> None:
    assert (await site.get("viewer-a", f"/jobs/{RESPONSE}/executions")).status_code == 403
    assert (await site.get("admin", "/jobs/no-such-job/executions")).status_code == 404


def config_of(page: Page) -> dict[str, Any]:
    found = re.search(
        r'<script id="aegis-config" type="application/json">(.*?)</script>', page.text
    )
    assert found is not None
    config: dict[str, Any] = json.loads(found.group(1))
    return config


async def test_the_job_page_gives_its_script_the_graph_of_the_job(
    site: Site, foundation: Foundation
) -> None:
    drawn = config_of(await site.read("viewer-fleet", f"/jobs/{RESPONSE}"))["jobGraph"]
    job = await JobStore(foundation.readmodel, lambda: NOW).get(RESPONSE)
    assert job is not None
    flow = graph(job)
    assert [n["id"] for n in drawn["nodes"]] == [n.id for n in flow.nodes]
    assert [(e["from"], e["to"], e["kind"], e["back"]) for e in drawn["edges"]] == [
        (e.source, e.target, e.kind.value, e.back) for e in flow.edges
    ]
    assert drawn["placed"] is False and all(n["at"] is None for n in drawn["nodes"])


async def test_a_job_its_designer_placed_is_drawn_where_the_designer_put_each_step(
    site: Site, foundation: Foundation
) -> None:
    placed = simple_job("placed-job", "Placed", trigger_type="Automation")
    placed["steps"].append({"id": "after", "step_type": "DUMMY", "seq": 1})
    placed["designer_offset"] = {
        "x": 5,
        "y": 5,
        "noted": {"x": 40, "y": 10},
        "after": {"x": 40, "y": 130},
    }
    await JobStore(foundation.readmodel, lambda: NOW).register(Job.model_validate(placed))
    page = await site.read("viewer-fleet", "/jobs/placed-job")
    drawn = config_of(page)["jobGraph"]
    assert drawn["placed"] is True
    assert [(n["id"], n["at"]) for n in drawn["nodes"]] == [
        ("noted", [40.0, 10.0]),
        ("after", [40.0, 130.0]),
    ]
    assert 'data-placed="designer"' in page.text
