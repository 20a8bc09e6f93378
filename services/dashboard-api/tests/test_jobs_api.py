"""The jobs API (``/api/jobs``) against the real S3/DynamoDB emulator: an admin registers,
replaces, disables, enables and deletes a job, each a new version, announced as a change of
``orch_job`` and on the audit record; a job that is not valid is refused with every problem and
where it is; a stale ``If-Match`` and a second job on the same trigger are refused and store
nothing. Who may call which route is walked in test_authz."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from aegis_contracts.audit import AuditEvent
from aegis_contracts.people import Role, TokenRecord
from aegis_dashboard_api import audit
from aegis_dashboard_api.access import token_digest
from aegis_dashboard_api.app import create_app
from aegis_dashboard_api.settings import DashboardSettings
from aegis_devstack.testing.builders import FakeClock
from aegis_devstack.testing.emulator import arequest_counts
from aegis_devstack.testing.storage import Foundation
from aegis_orchestration.model import Job
from aegis_orchestration.store import DuplicateJob, JobStore
from aegis_storage.audit import AuditLog
from aegis_storage.items import Change
from aegis_storage.tokens import TokenStore

pytestmark = pytest.mark.integration

NOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
TOKEN = "token-of-the-jobs-admin"


def job(job_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "id": job_id,
        "job_name": "Incident noted",
        "trigger_type": "BizObject",
        "object_id": "incident",
        "trigger_sub_type": "Update",
        "steps": [{"id": "noted", "step_type": "DUMMY", "is_start_point": True}],
        **fields,
    }


class Admin:
    def __init__(self, client: httpx.AsyncClient, app: FastAPI, changes: list[Change]) -> None:
        self.client, self.app, self.changes = client, app, changes
        self.auth = {"Authorization": f"Bearer {TOKEN}", "User-Agent": "pytest-jobs"}

    async def __call__(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        headers = self.auth | kwargs.pop("headers", {})
        return await self.client.request(method, url, headers=headers, **kwargs)

    async def audited(self, foundation: Foundation) -> list[AuditEvent]:
        """The day's audit record, oldest first, once this dashboard's records are written."""
        await audit.settled(self.app)
        events, _ = await AuditLog(foundation.store).day(NOW.date())
        return list(reversed(events))


@pytest.fixture
async def admin(foundation: Foundation, unique_id: str) -> AsyncIterator[Admin]:
    await TokenStore(foundation.readmodel).add(
        TokenRecord(
            name=f"ops-{unique_id}",
            digest=token_digest(TOKEN),
            role=Role.ADMIN,
            scope=("*",),
            created_at=NOW,
            created_by="test",
        )
    )
    clock = FakeClock(NOW)
    app = create_app(
        DashboardSettings(bucket=foundation.bucket, table=foundation.table),
        clients=foundation.clients,
        clock=clock,
    )
    app.state.tokens.take_stored(await TokenStore(foundation.readmodel).listed(now=NOW), NOW)
    changes: list[Change] = []

    async def announce(change: Change) -> None:  # what the live feed publishes on NATS
        changes.append(change)

    app.state.reader.readmodel.changes = announce

    async def tick(_: httpx.Request) -> None:
        clock.advance(timedelta(seconds=1))

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://dash", event_hooks={"request": [tick]}
    ) as client:
        yield Admin(client, app, changes)


async def test_an_admin_registers_replaces_disables_enables_and_deletes_a_job(
    admin: Admin, foundation: Foundation, unique_id: str
) -> None:
    job_id = f"noted-{unique_id}"
    made = await admin("POST", "/api/jobs", json=job(job_id))
    assert made.status_code == 201, made.text
    assert made.headers["location"] == f"/api/jobs/{job_id}"
    assert made.headers["etag"] == '"1"' and made.json()["version"] == 1

    replaced = await admin(
        "PUT",
        f"/api/jobs/{job_id}",
        json=job(job_id, job_name="Renamed"),
        headers={"If-Match": '"1"'},
    )
    assert replaced.status_code == 200, replaced.text
    assert (replaced.json()["job_name"], replaced.json()["version"]) == ("Renamed", 2)
    stale = await admin(
        "PUT", f"/api/jobs/{job_id}", json=job(job_id, job_name="Lost"), headers={"If-Match": '"1"'}
    )
    assert stale.status_code == 412 and stale.json()["error"] == "version_changed"

    disabled = await admin("POST", f"/api/jobs/{job_id}/disable")
    assert disabled.json()["is_enabled"] is False
    listed = (await admin("GET", "/api/jobs")).json()["jobs"]
    assert [(j["id"], j["state"], j["version"]) for j in listed] == [(job_id, "disabled", 3)]
    assert (await admin("POST", f"/api/jobs/{job_id}/enable")).json()["version"] == 4
    assert (await admin("DELETE", f"/api/jobs/{job_id}")).json()["is_active"] is False
    assert (await admin("GET", "/api/jobs")).json()["jobs"] == []
    kept = (await admin("GET", "/api/jobs?deleted=true")).json()["jobs"]
    assert [(j["id"], j["state"], j["version"]) for j in kept] == [(job_id, "deleted", 5)]
    stored = await JobStore(foundation.readmodel, lambda: NOW).get(job_id)
    assert stored is not None and stored.job_name == "Renamed" and stored.version == 5

    # each write announced as the orchestrators hear `aegis jobs`' (INSERT, then MODIFYs)
    assert [(c.entity, c.event_name) for c in admin.changes] == [("orch_job", "INSERT")] + [
        ("orch_job", "MODIFY")
    ] * 4
    assert admin.changes[1].old_image is not None
    assert admin.changes[1].old_image["job"]["job_name"] == "Incident noted"

    seen = [(e.action, e.outcome, e.actor, e.target) for e in await admin.audited(foundation)]
    who = f"token:ops-{unique_id}"
    assert seen == [
        ("job.register", "ok", who, job_id),
        ("job.replace", "ok", who, job_id),
        ("job.disable", "ok", who, job_id),
        ("job.enable", "ok", who, job_id),
        ("job.delete", "ok", who, job_id),
    ]


async def test_a_job_that_is_not_valid_is_refused_with_each_problem_and_where_it_is(
    admin: Admin, foundation: Foundation, unique_id: str
) -> None:
    broken = job(
        f"broken-{unique_id}",
        trigger_condition_expr='StringEQ([$.afterData.scope], "a"',
        steps=[
            {"id": "first", "step_type": "TASK", "is_start_point": True},
            {"id": "second", "step_type": "DUMMY", "catch_step_id": "nowhere"},
        ],
    )
    answer = await admin("POST", "/api/jobs", json=broken)
    assert answer.status_code == 422
    assert answer.headers["content-type"] == "application/problem+json"
    body = answer.json()
    assert (body["status"], body["error"]) == (422, "job_invalid")
    where = {(p["field"], p["reason"]) for p in body["problems"]}
    assert any(f == "trigger_condition_expr" and "line 1" in r for f, r in where), where
    assert any(f == "steps.0" and r.startswith("TASK step first needs") for f, r in where), where

    tree = job(
        f"tree-{unique_id}",
        steps=[
            {"id": "first", "step_type": "DUMMY", "is_start_point": True},
            {"id": "second", "step_type": "DUMMY", "catch_step_id": "nowhere"},
        ],
    )
    answer = await admin("POST", "/api/jobs", json=tree)
    problems = [(p["field"], p["reason"]) for p in answer.json()["problems"]]
    assert ("step second", "catch_step_id nowhere does not exist") in problems
    assert ("step second", "only a TASK or PARALLEL can have a catch path") in problems

    other = await admin("PUT", f"/api/jobs/other-{unique_id}", json=job(f"tree-{unique_id}"))
    assert other.status_code == 422
    assert other.json()["problems"][0]["field"] == "id"
    assert await JobStore(foundation.readmodel, lambda: NOW).all() == []
    assert sorted((e.action, e.outcome) for e in await admin.audited(foundation)) == [
        ("job.register", "refused"),
        ("job.register", "refused"),
        ("job.replace", "refused"),
    ]


async def test_a_job_of_a_tenant_the_tenants_file_does_not_declare_is_refused(
    admin: Admin, foundation: Foundation, unique_id: str, tmp_path: Path
) -> None:
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text("tenants:\n  aegis/plant-ops: [factory-a]\n")
    settings = admin.app.state.settings
    admin.app.state.settings = settings.model_copy(update={"orchestrator_tenants_file": tenants})
    stray = job(f"stray-{unique_id}", tenant="aegis/other")
    answer = await admin("POST", "/api/jobs", json=stray)
    assert answer.status_code == 422
    assert answer.json()["problems"] == [
        {
            "job": f"stray-{unique_id}",
            "field": "tenant",
            "reason": f"job stray-{unique_id} belongs to tenant 'aegis/other', which the "
            f"tenants file {tenants} does not declare",
        }
    ]
    assert await JobStore(foundation.readmodel, lambda: NOW).all() == []
    mine = await admin("POST", "/api/jobs", json=job(f"mine-{unique_id}", tenant="aegis/plant-ops"))
    assert mine.status_code == 201, mine.text
    assert mine.json()["tenant"] == "aegis/plant-ops"


async def test_a_second_job_on_the_same_trigger_and_a_taken_id_are_refused(
    admin: Admin, foundation: Foundation, unique_id: str
) -> None:
    first = await admin("POST", "/api/jobs", json=job(f"first-{unique_id}"))
    assert first.status_code == 201
    twin = await admin("POST", "/api/jobs", json=job(f"twin-{unique_id}"))
    assert twin.status_code == 409 and "duplicates" in twin.json()["message"]
    again = await admin("POST", "/api/jobs", json=job(f"first-{unique_id}", job_name="Again"))
    assert again.status_code == 409 and "exists" in again.json()["message"]
    stored = await JobStore(foundation.readmodel, lambda: NOW).all()
    assert [(j.id, j.job_name) for j in stored] == [(f"first-{unique_id}", "Incident noted")]
    unknown = await admin("POST", "/api/jobs/no-such-job/enable")
    assert unknown.status_code == 404 and unknown.json()["error"] == "unknown_job"
    assert (await admin("GET", "/api/jobs/NOT_AN_ID")).status_code == 404


async def test_each_change_is_a_version_kept_with_who_made_it_and_two_versions_diff(
    admin: Admin, unique_id: str, aws_endpoint: str
) -> None:
    job_id = f"kept-{unique_id}"
    await admin("POST", "/api/jobs", json=job(job_id))
    await admin("PUT", f"/api/jobs/{job_id}", json=job(job_id, job_name="Renamed"))
    await admin("POST", f"/api/jobs/{job_id}/disable")
    listed = (await admin("GET", f"/api/jobs/{job_id}/versions")).json()["versions"]
    who = f"token:ops-{unique_id}"
    assert [(v["version"], v["by"]) for v in listed] == [(1, who), (2, who), (3, who)]
    before = await arequest_counts(aws_endpoint)
    first = (await admin("GET", f"/api/jobs/{job_id}/versions/1")).json()
    read = (await arequest_counts(aws_endpoint)) - before
    assert (first["job_name"], first["version"]) == ("Incident noted", 1)
    # one version is read by its key, not by reading every version of the job
    assert read.count("dynamodb", "GetItem") >= 1
    assert read.count("dynamodb", "Query") == 0
    assert (await admin("GET", f"/api/jobs/{job_id}/versions/9")).status_code == 404
    changed = (await admin("GET", f"/api/jobs/{job_id}/diff?from=1&to=3")).json()["diff"]
    removed = [ln for ln in changed.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    added = [ln for ln in changed.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert removed == ["-job_name: Incident noted", "-is_enabled: true"]
    assert added == ["+job_name: Renamed", "+is_enabled: false"]
    assert (await admin("GET", f"/api/jobs/{job_id}/diff?from=1&to=1")).json()["diff"] == ""


async def test_two_jobs_on_one_trigger_registered_at_once_are_refused_but_one(
    admin: Admin, foundation: Foundation, unique_id: str
) -> None:
    """Two registrations at the same moment both read no twin; the trigger's claim, written in
    one transaction with each job, lets one of them in."""
    answers = await asyncio.gather(
        *(admin("POST", "/api/jobs", json=job(f"{n}-{unique_id}")) for n in ("one", "two"))
    )
    assert sorted(a.status_code for a in answers) == [201, 409]
    stored = await JobStore(foundation.readmodel, lambda: NOW).all()
    assert len(stored) == 1


async def test_the_trigger_claim_alone_refuses_a_twin_and_is_released_when_its_job_leaves_it(
    foundation: Foundation, unique_id: str
) -> None:
    """Past the read check (as two writers racing are): the claim refuses the twin; once the
    first job moves to another trigger or is deleted, the twin goes in."""
    store = JobStore(foundation.readmodel, lambda: NOW)
    first = Job.model_validate(job(f"first-{unique_id}"))
    twin = Job.model_validate(job(f"twin-{unique_id}"))
    await store._put(first, None, by="test")
    with pytest.raises(DuplicateJob, match=f"duplicates first-{unique_id}"):
        await store._put(twin, None, by="test")
    moved = await store.update(first.id, by="test", trigger_sub_type="Insert")
    assert moved.version == 2
    assert (await store._put(twin, None, by="test")).version == 1
    # deleting the twin releases its trigger: the first may come back to it
    await store.update(twin.id, by="test", is_active=False)
    back = await store.update(first.id, by="test", trigger_sub_type="Update")
    assert back.trigger_sub_type == "Update"
