"""Who may see and do what, route by route: every route of the app names its permission, and
every operation of the OpenAPI schema is tried with a token of each role scoped to factory A,
against factory B (out of scope), in the real S3/DynamoDB emulator. The pages too."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, Literal

import httpx
import pytest
from fastapi import Depends, FastAPI
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute, Mount

from aegis_contracts import incidents, keys
from aegis_contracts.items import Incident
from aegis_contracts.keys import ReportArtifact
from aegis_contracts.people import Act, Role, TokenRecord
from aegis_contracts.silences import Silence, new_silence
from aegis_contracts.times import format_ts
from aegis_dashboard_api import audit
from aegis_dashboard_api.access import token_digest
from aegis_dashboard_api.app import create_app
from aegis_dashboard_api.authz import Permission, public
from aegis_dashboard_api.settings import DashboardSettings
from aegis_devstack.testing.builders import FakeClock, seed_latest
from aegis_devstack.testing.cli import invoke_in_thread
from aegis_devstack.testing.storage import Foundation
from aegis_orchestration.model import Job
from aegis_orchestration.store import JobStore
from aegis_storage.audit import AuditLog
from aegis_storage.incidents import IncidentStore
from aegis_storage.silences import SilenceStore
from aegis_storage.tokens import TokenStore

pytestmark = pytest.mark.integration

NOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
DAY = date(2026, 11, 29)
LIVE = int((NOW + timedelta(hours=1)).timestamp())


# -- every route names what it does ------------------------------------------------------------


# FastAPI's own documentation of the API: open, as the schema itself is no data
DOCS = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}


def routes_of(app: FastAPI) -> list[tuple[str, BaseRoute]]:
    """Every route of ``app`` with its full path, routers included by ``include_router``
    walked into (with their prefix and their own dependencies)."""
    found: list[tuple[str, BaseRoute]] = []

    def walk(routes: list[BaseRoute], prefix: str, depends: list[Any]) -> None:
        for route in routes:
            included = getattr(route, "original_router", None)
            if included is not None:
                context = route.include_context  # type: ignore[attr-defined]
                walk(included.routes, prefix + context.prefix, depends + context.dependencies)
            else:
                route.inherited = depends  # type: ignore[attr-defined]
                found.append((prefix + getattr(route, "path", ""), route))

    walk(app.routes, "", [])
    return found


def unguarded(app: FastAPI) -> list[str]:
    """The routes of ``app`` with neither a :class:`Permission` nor :func:`public` among their
    dependencies (however deep, their routers' included), FastAPI's docs aside; a static
    files mount is no route of ours."""

    def guarded(dependant: Any) -> bool:
        return any(
            isinstance(d.call, Permission) or d.call is public or guarded(d)
            for d in dependant.dependencies
        )

    missing = []
    for path, route in routes_of(app):
        if isinstance(route, Mount) and path == "/static":
            continue
        if isinstance(route, APIRoute):
            inherited = [d.dependency for d in route.inherited]  # type: ignore[attr-defined]
            if guarded(route.dependant) or any(
                isinstance(d, Permission) or d is public for d in inherited
            ):
                continue
        elif path in DOCS:
            continue
        missing.append(f"{sorted(getattr(route, 'methods', None) or [])} {path}")
    return missing


def test_every_route_names_its_permission_or_says_it_is_public() -> None:
    app = create_app(DashboardSettings(bucket="b", table="t"))
    assert unguarded(app) == []
    walked = {path for path, route in routes_of(app) if isinstance(route, APIRoute)}
    assert set(app.openapi()["paths"]) <= walked
    assert {"/", "/factories/{factory_id}", "/api/live", "/login"} <= walked  # pages walked


def test_a_route_added_without_a_permission_is_found() -> None:
    app = create_app(DashboardSettings(bucket="b", table="t"))

    @app.get("/api/forgotten")
    async def forgotten() -> dict[str, str]:
        return {}

    @app.get("/api/guarded", dependencies=[Depends(Permission(Act.READ, "platform"))])
    async def guarded() -> dict[str, str]:
        return {}

    assert unguarded(app) == ["['GET'] /api/forgotten"]


# -- a world of two factories ------------------------------------------------------------------


@dataclass
class World:
    a: str
    b: str
    incident: dict[str, Incident]
    silence: dict[str, Silence]
    tokens: dict[str, str]  # name -> token
    job: str  # a registered job's id


async def factory(f: Foundation, fid: str) -> tuple[Incident, Silence]:
    image = keys.image_snapshot_key(fid, NOW - timedelta(minutes=1), "cam-1.jpg")
    await f.store.put_bytes(image, b"\xff\xd8 frame", content_type="image/jpeg")
    await seed_latest(
        f.readmodel,
        fid,
        {
            "risk": {"score": 90.0, "level": "CRITICAL", "reasons": [{"code": "GAS_LEAK"}]},
            "latest_image_snapshot": {"s3_key": image, "captured_at": format_ts(NOW)},
            "updated_at": format_ts(NOW),
        },
    )
    await f.readmodel.put_item(
        {
            "pk": keys.alert_pk(fid),
            "sk": keys.alert_sk("CRITICAL", "GAS_LEAK", "STATE"),
            "scope": fid,
            "firing": True,
            "ttl": LIVE,
        }
    )
    await f.store.put_bytes(keys.report_key(DAY, fid, ReportArtifact.REPORT), f"# {fid}\n".encode())
    opened = incidents.open_incident(
        scope=fid, stream="STATE", reason="GAS_LEAK", severity="CRITICAL", at=NOW
    )
    await IncidentStore(f.readmodel, f.store).save(opened, None)
    quiet = new_silence(
        matchers=[f"factory={fid}", "severity=WARNING"],
        by="test",
        now=NOW,
        duration=timedelta(hours=1),
    )
    await SilenceStore(f.readmodel).add(quiet)
    return opened, quiet


# name -> (role, scope)
PEOPLE: dict[str, tuple[Role, tuple[str, ...]]] = {
    "viewer-a": (Role.VIEWER, ("{a}",)),
    "responder-a": (Role.RESPONDER, ("{a}",)),
    "responder-pattern": (Role.RESPONDER, ("{a}*",)),  # A and A-anything, not B
    "admin": (Role.ADMIN, ()),
    # the whole fleet's, below admin: may read jobs, not change them
    "viewer-fleet": (Role.VIEWER, ("*",)),
    "responder-fleet": (Role.RESPONDER, ("*",)),
}


def job_document(job_id: str, *, name: str = "Incident noted") -> dict[str, Any]:
    return {
        "id": job_id,
        "job_name": name,
        "trigger_type": "BizObject",
        "object_id": "incident",
        "trigger_sub_type": "Update",
        "trigger_condition_expr": f'StringEQ([$.afterData.job], "{job_id}")',
        "steps": [{"id": "noted", "step_type": "DUMMY", "is_start_point": True}],
    }


@pytest.fixture
async def world(foundation: Foundation, unique_id: str) -> World:
    a, b = f"{unique_id}-a", f"{unique_id}-b"
    made = {fid: await factory(foundation, fid) for fid in (a, b)}
    await foundation.readmodel.put_item(
        {"pk": keys.CLOUD_PK, "sk": keys.LATEST_SK, "overall_status": "WARNING"}
    )
    store = TokenStore(foundation.readmodel)
    tokens = {}
    for name, (role, scope) in PEOPLE.items():
        tokens[name] = f"token-of-{name}-{unique_id}"
        await store.add(
            TokenRecord(
                name=f"{name}-{unique_id}".lower(),
                digest=token_digest(tokens[name]),
                role=role,
                scope=tuple(s.format(a=a) for s in scope),
                created_at=NOW,
                created_by="test",
            )
        )
    job = f"job-{unique_id}"
    await JobStore(foundation.readmodel, lambda: NOW).register(
        Job.model_validate(job_document(job))
    )
    return World(
        a,
        b,
        incident={fid: made[fid][0] for fid in made},
        silence={fid: made[fid][1] for fid in made},
        tokens=tokens,
        job=job,
    )


@pytest.fixture
async def client(foundation: Foundation) -> AsyncIterator[httpx.AsyncClient]:
    settings = DashboardSettings(bucket=foundation.bucket, table=foundation.table)
    clock = FakeClock(NOW)
    app = create_app(settings, clients=foundation.clients, clock=clock)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport,
        base_url="http://dash",
        # each request a second after the one before: what a person does has its own time
        event_hooks={"request": [lambda _: _tick(clock)]},
    ) as c:
        c.app = app  # type: ignore[attr-defined]
        yield c


async def _tick(clock: FakeClock) -> None:
    clock.advance(timedelta(seconds=1))


async def take_tokens(client: httpx.AsyncClient, foundation: Foundation) -> None:
    """What the dashboard's token watch does every few seconds, once."""
    app: FastAPI = client.app  # type: ignore[attr-defined]
    kept = await TokenStore(foundation.readmodel).listed(now=NOW)
    app.state.tokens.take_stored(kept, NOW)


# -- every operation of the schema, by role and scope ------------------------------------------

Kind = Literal["factory", "listed", "platform", "respond", "silence", "admin"]


@dataclass(frozen=True)
class Case:
    kind: Kind
    request: Callable[[World, str], tuple[str, str, dict[str, Any]]]  # (method, url, kwargs)


CASES: dict[tuple[str, str], Case] = {
    ("GET", "/api/fleet"): Case("listed", lambda w, f: ("GET", "/api/fleet", {})),
    ("GET", "/api/factories/{factory_id}"): Case(
        "factory", lambda w, f: ("GET", f"/api/factories/{f}", {})
    ),
    ("GET", "/api/factories/{factory_id}/history"): Case(
        "factory", lambda w, f: ("GET", f"/api/factories/{f}/history", {})
    ),
    ("GET", "/api/cloud"): Case("platform", lambda w, f: ("GET", "/api/cloud", {})),
    ("GET", "/api/alerts"): Case("listed", lambda w, f: ("GET", "/api/alerts", {})),
    ("GET", "/api/factories/{factory_id}/images/latest"): Case(
        "factory", lambda w, f: ("GET", f"/api/factories/{f}/images/latest", {})
    ),
    ("GET", "/api/factories/{factory_id}/images"): Case(
        "factory", lambda w, f: ("GET", f"/api/factories/{f}/images?date=2026-11-30", {})
    ),
    ("GET", "/api/reports"): Case("listed", lambda w, f: ("GET", f"/api/reports?date={DAY}", {})),
    ("GET", "/api/reports/{report_date}/{target}"): Case(
        "factory", lambda w, f: ("GET", f"/api/reports/{DAY}/{f}", {})
    ),
    ("GET", "/api/incidents"): Case("listed", lambda w, f: ("GET", "/api/incidents", {})),
    ("GET", "/api/incidents/{incident_id}"): Case(
        "factory", lambda w, f: ("GET", f"/api/incidents/{w.incident[f].incident_id}", {})
    ),
    ("POST", "/api/incidents/{incident_id}/ack"): Case(
        "respond",
        lambda w, f: ("POST", f"/api/incidents/{w.incident[f].incident_id}/ack", {"json": {}}),
    ),
    ("POST", "/api/incidents/{incident_id}/resolve"): Case(
        "respond",
        lambda w, f: (
            "POST",
            f"/api/incidents/{w.incident[f].incident_id}/resolve",
            {"json": {"note": "handled"}},
        ),
    ),
    ("GET", "/api/silences"): Case("listed", lambda w, f: ("GET", "/api/silences", {})),
    ("POST", "/api/silences"): Case(
        "silence",
        lambda w, f: (
            "POST",
            "/api/silences",
            {"json": {"matchers": [f"factory={f}", "severity=WARNING"], "duration": "1h"}},
        ),
    ),
    ("DELETE", "/api/silences/{silence_id}"): Case(
        "silence", lambda w, f: ("DELETE", f"/api/silences/{w.silence[f].id}", {})
    ),
    ("GET", "/api/audit"): Case("admin", lambda w, f: ("GET", "/api/audit?date=2026-11-30", {})),
    # jobs belong to no factory: the fleet's readers read them, only an admin changes them
    ("GET", "/api/jobs"): Case("platform", lambda w, f: ("GET", "/api/jobs", {})),
    ("GET", "/api/jobs/{job_id}"): Case("platform", lambda w, f: ("GET", f"/api/jobs/{w.job}", {})),
    ("GET", "/api/jobs/{job_id}/executions"): Case(
        "platform", lambda w, f: ("GET", f"/api/jobs/{w.job}/executions", {})
    ),
    ("GET", "/api/jobs/{job_id}/versions"): Case(
        "platform", lambda w, f: ("GET", f"/api/jobs/{w.job}/versions", {})
    ),
    ("GET", "/api/jobs/{job_id}/versions/{version}"): Case(
        "platform", lambda w, f: ("GET", f"/api/jobs/{w.job}/versions/1", {})
    ),
    ("GET", "/api/jobs/{job_id}/diff"): Case(
        "platform", lambda w, f: ("GET", f"/api/jobs/{w.job}/diff?from=1&to=1", {})
    ),
    ("POST", "/api/jobs"): Case(
        "admin", lambda w, f: ("POST", "/api/jobs", {"json": job_document(f"{w.job}-new")})
    ),
    ("PUT", "/api/jobs/{job_id}"): Case(
        "admin",
        lambda w, f: ("PUT", f"/api/jobs/{w.job}", {"json": job_document(w.job, name="Renamed")}),
    ),
    ("DELETE", "/api/jobs/{job_id}"): Case(
        "admin", lambda w, f: ("DELETE", f"/api/jobs/{w.job}", {})
    ),
    ("POST", "/api/jobs/{job_id}/enable"): Case(
        "admin", lambda w, f: ("POST", f"/api/jobs/{w.job}/enable", {})
    ),
    ("POST", "/api/jobs/{job_id}/disable"): Case(
        "admin", lambda w, f: ("POST", f"/api/jobs/{w.job}/disable", {})
    ),
}


def test_the_cases_cover_every_operation_of_the_schema() -> None:
    app = create_app(DashboardSettings(bucket="b", table="t"))
    operations = {
        (method.upper(), path) for path, ops in app.openapi()["paths"].items() for method in ops
    }
    assert operations == set(CASES)


async def call(
    client: httpx.AsyncClient, world: World, person: str, case: Case, fid: str
) -> httpx.Response:
    method, url, kwargs = case.request(world, fid)
    auth = {"Authorization": f"Bearer {world.tokens[person]}"}
    return await client.request(method, url, headers=auth, **kwargs)


async def unchanged(foundation: Foundation, world: World, fid: str) -> None:
    """Factory ``fid``'s incident still triggered and its silence still in force."""
    stored = await IncidentStore(foundation.readmodel).get(world.incident[fid].incident_id)
    assert stored is not None and stored.state == "triggered"
    kept = await SilenceStore(foundation.readmodel).get(world.silence[fid].id)
    assert kept is not None and kept.ends > NOW
    listed = await SilenceStore(foundation.readmodel).listed(now=NOW)
    assert sum(1 for s in listed if f"factory={fid}" in [str(m) for m in s.matchers]) == 1
    jobs = await JobStore(foundation.readmodel, lambda: NOW).all()
    assert [(j.id, j.version, j.job_name, j.fires) for j in jobs] == [
        (world.job, 1, "Incident noted", True)
    ]


@pytest.mark.parametrize("operation", sorted(CASES), ids=lambda o: f"{o[0]} {o[1]}")
async def test_each_operation_with_each_role_in_and_out_of_scope(
    client: httpx.AsyncClient, foundation: Foundation, world: World, operation: tuple[str, str]
) -> None:
    """Scoped to A, every role gets nothing of B: a route about B answers 404 (as for a
    factory that does not exist), a list leaves B out, the platform's views are 403, and a
    change to B is refused and changes nothing. In scope, a viewer reads and may not act
    (403); a responder acts. An admin reaches B. Without a token: 401."""
    await take_tokens(client, foundation)
    case = CASES[operation]
    a, b = world.a, world.b
    method, url, kwargs = case.request(world, b)
    assert (await client.request(method, url, **kwargs)).status_code == 401

    for person in ("viewer-a", "responder-a", "responder-pattern"):
        answer = await call(client, world, person, case, b)
        if case.kind == "listed":
            assert answer.status_code == 200, (person, answer.text)
            assert b not in answer.text and a in answer.text
        elif case.kind in ("platform", "admin"):
            assert answer.status_code == 403, (person, answer.text)
        elif case.kind in ("respond", "silence") and person == "viewer-a":
            assert answer.status_code == 403, (person, answer.text)  # the role, before the scope
        else:
            assert answer.status_code == 404, (person, answer.text)
        assert "GAS_LEAK" not in answer.text or case.kind == "listed"
        await unchanged(foundation, world, b)

    # in scope: a viewer reads and may not act; a responder acts
    mine = await call(client, world, "viewer-a", case, a)
    if case.kind in ("respond", "silence"):
        assert mine.status_code == 403, mine.text
        await unchanged(foundation, world, a)
        acted = await call(client, world, "responder-a", case, a)
        assert acted.status_code in (200, 201), acted.text
    elif case.kind in ("platform", "admin"):
        assert mine.status_code == 403
    else:
        assert mine.status_code == 200, mine.text

    # the whole fleet's viewer and responder read what is the platform's, and change no job
    for person in ("viewer-fleet", "responder-fleet"):
        answer = await call(client, world, person, case, b)
        if case.kind == "admin":
            assert answer.status_code == 403, (person, answer.text)
            assert "admin role" in answer.json()["message"]
            await unchanged(foundation, world, b)
        elif case.kind == "platform":
            assert answer.status_code == 200, (person, answer.text)

    # the admin reaches B
    reached = await call(client, world, "admin", case, b)
    assert reached.status_code in (200, 201), reached.text
    if case.kind in ("factory", "listed"):
        assert b in reached.text


# -- the pages ---------------------------------------------------------------------------------


async def test_the_pages_show_a_scoped_person_nothing_of_another_factory(
    client: httpx.AsyncClient, foundation: Foundation, world: World
) -> None:
    await take_tokens(client, foundation)
    a, b = world.a, world.b
    cookie = {"Cookie": f"aegis_dashboard_token={world.tokens['viewer-a']}"}
    for path in ("/", "/incidents", "/incidents/list", f"/reports?date={DAY}"):
        page = await client.get(path, headers=cookie)
        assert page.status_code == 200, path
        assert a in page.text and b not in page.text, path
    assert (await client.get(f"/factories/{a}", headers=cookie)).status_code == 200
    other = await client.get(f"/factories/{b}", headers=cookie)
    assert other.status_code == 404 and "GAS_LEAK" not in other.text
    assert (await client.get("/cloud", headers=cookie)).status_code == 403
    fleet = (await client.get("/", headers=cookie)).text
    assert 'href="/cloud"' not in fleet and 'href="/admin/audit"' not in fleet  # no way there
    admin = {"Cookie": f"aegis_dashboard_token={world.tokens['admin']}"}
    assert 'href="/admin/audit"' in (await client.get("/", headers=admin)).text
    chosen = await client.get(f"/reports?date={DAY}&target={b}", headers=cookie)
    assert f"# {b}" not in chosen.text and f"<h1>{b}</h1>" not in chosen.text
    # a viewer's incident list has no buttons; a responder's has them
    listed = await client.get("/incidents", headers=cookie)
    assert 'data-action="ack"' not in listed.text
    responder = {"Cookie": f"aegis_dashboard_token={world.tokens['responder-a']}"}
    assert 'data-action="ack"' in (await client.get("/incidents", headers=responder)).text


# -- aegis tokens ------------------------------------------------------------------------------


async def test_aegis_tokens_create_list_revoke_as_the_dashboard_takes_them(
    client: httpx.AsyncClient, foundation_env: Foundation, world: World
) -> None:
    """A token made with `aegis tokens create` reads its factories at the dashboard (and no
    other); listed without the token; revoked, it is refused. A taken name, a bad role, a
    viewer without factories are refused before anything is written."""
    foundation = foundation_env

    async def aegis(*args: str) -> Any:
        return await invoke_in_thread("tokens", *args)

    name = f"crew-{world.a}".lower()
    made = await aegis(
        "create", "--name", name, "--role", "responder", "--factories", world.a,
        "--for", "7d", "--as", "kim", "--json",
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    created = json.loads(made.stdout)
    token = created["token"]
    assert created["scope"] == [world.a] and created["created_by"] == "cli:kim"
    assert "digest" not in created

    await take_tokens(client, foundation)
    auth = {"Authorization": f"Bearer {token}"}
    mine = await client.get(f"/api/factories/{world.a}", headers=auth)
    assert mine.status_code == 200
    assert (await client.get(f"/api/factories/{world.b}", headers=auth)).status_code == 404
    incident = world.incident[world.a].incident_id
    acked = await client.post(f"/api/incidents/{incident}/ack", headers=auth, json={})
    assert acked.json()["incident"]["acknowledged_by"] == f"token:{name}"

    listed = json.loads((await aegis("list", "--json")).stdout)["tokens"]
    (row,) = [t for t in listed if t["name"] == name]
    assert row["state"] == "usable" and token not in json.dumps(listed)

    taken = await aegis("create", "--name", name, "--factories", "*")
    assert taken.exit_code == 1 and "exists" in taken.output
    assert (
        await aegis("create", "--name", "x1", "--role", "owner", "--factories", "*")
    ).exit_code == 2
    no_scope = await aegis("create", "--name", "x2")
    assert no_scope.exit_code == 2 and "--factories" in no_scope.output
    assert [t["name"] for t in json.loads((await aegis("list", "--json")).stdout)["tokens"]].count(
        name
    ) == 1

    revoked = await aegis("revoke", name, "--as", "lee", "--json")
    assert revoked.exit_code == 0 and json.loads(revoked.stdout)["revoked_by"] == "cli:lee"
    await take_tokens(client, foundation)
    assert (await client.get(f"/api/factories/{world.a}", headers=auth)).status_code == 401
    assert (await aegis("revoke", "no-such-token")).exit_code == 1
    # both on the record, by whom (the CLI runs on the wall clock: today's and yesterday's
    # days are read, in case it turned midnight meanwhile)
    today = datetime.now(UTC).date()
    events = [
        e
        for day in (today - timedelta(days=1), today)
        for e in (await AuditLog(foundation.store).day(day))[0]
        if e.target == name
    ]
    assert sorted((e.action, e.actor, e.via) for e in events) == [
        ("token.create", "cli:kim", "cli"),
        ("token.revoke", "cli:lee", "cli"),
    ]


# -- the audit record --------------------------------------------------------------------------


async def test_every_action_and_refusal_leaves_an_audit_record_naming_the_person(
    client: httpx.AsyncClient, foundation: Foundation, world: World
) -> None:
    """Acknowledge, resolve, a silence made and ended, a viewer's refused acknowledgement, a
    scoped responder's refused silence of another factory, a token sign-in and a wrong one:
    each is an event with who, what, on what and from where, read back by an admin (and only
    an admin) at /api/audit and on /admin/audit."""
    await take_tokens(client, foundation)
    a, b = world.a, world.b

    def auth(person: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {world.tokens[person]}", "User-Agent": "pytest-audit"}

    incident = world.incident[a].incident_id
    await client.post(f"/api/incidents/{incident}/ack", headers=auth("viewer-a"), json={})
    await client.post(f"/api/incidents/{incident}/ack", headers=auth("responder-a"), json={})
    await client.post(
        f"/api/incidents/{incident}/resolve", headers=auth("responder-a"), json={"note": "ok"}
    )
    made = await client.post(
        "/api/silences",
        headers=auth("responder-a"),
        json={"matchers": [f"factory={a}", "severity=WARNING"], "duration": "1h"},
    )
    await client.delete(f"/api/silences/{made.json()['id']}", headers=auth("responder-a"))
    refused = await client.post(
        "/api/silences",
        headers=auth("responder-a"),
        json={"matchers": [f"factory={b}", "severity=WARNING"], "duration": "1h"},
    )
    assert refused.status_code == 404
    signin = {"Content-Type": "application/x-www-form-urlencoded", "User-Agent": "pytest-audit"}
    ok = await client.post("/login", content=f"token={world.tokens['viewer-a']}", headers=signin)
    bad = await client.post("/login", content="token=guess", headers=signin)
    assert (ok.status_code, bad.status_code) == (303, 401)

    assert (
        await client.get("/api/audit?date=2026-11-30", headers=auth("viewer-a"))
    ).status_code == 403
    day = (await client.get("/api/audit?date=2026-11-30", headers=auth("admin"))).json()
    seen = [(e["action"], e["outcome"], e["actor"]) for e in reversed(day["events"])]
    viewer, responder = (f"token:{p}-{a.rsplit('-', 1)[0]}" for p in ("viewer-a", "responder-a"))
    assert seen == [
        ("incident.acknowledge", "refused", viewer),
        ("incident.acknowledge", "ok", responder),
        ("incident.resolve", "ok", responder),
        ("silence.create", "ok", responder),
        ("silence.end", "ok", responder),
        ("silence.create", "refused", responder),
        ("sign_in", "ok", viewer),
        ("sign_in", "refused", "unknown"),
    ]
    assert day["events"][0]["failure"] == "wrong_token"
    first = day["events"][-1]
    assert (first["target"], first["agent"], first["via"]) == (incident, "pytest-audit", "token")
    assert first["source"] and "role" in first["detail"]
    assert day["total"] == len(seen)
    # each event is its own object under audit/, written once
    keys_listed = [
        info.key async for info in foundation.store.list_objects("audit/yyyy=2026/mm=11/dd=30/")
    ]
    assert len(keys_listed) == len(seen)
    page = await client.get("/admin/audit?date=2026-11-30", headers=auth("admin"))
    assert page.status_code == 200 and page.text.count('data-action="') == len(seen)
    assert (await client.get("/admin/audit", headers=auth("responder-a"))).status_code == 403


async def test_sign_ins_refused_for_too_many_wrong_tokens_are_on_the_record_as_locked(
    foundation: Foundation, world: World
) -> None:
    settings = DashboardSettings(
        bucket=foundation.bucket, table=foundation.table, dashboard_signin_attempts=2
    )
    clock = FakeClock(NOW)
    app = create_app(settings, clients=foundation.clients, clock=clock)
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://dash",
        event_hooks={"request": [lambda _: _tick(clock)]},
    ) as client:
        answers = [
            await client.post("/login", content=f"token=guess-{n}", headers=form) for n in range(3)
        ]
        kept = await TokenStore(foundation.readmodel).listed(now=NOW)
        app.state.tokens.take_stored(kept, NOW)
        right = await client.post("/login", content=f"token={world.tokens['admin']}", headers=form)
    assert [a.status_code for a in answers] + [right.status_code] == [401, 401, 429, 429]
    await audit.settled(app)
    events, _ = await AuditLog(foundation.store).day(NOW.date())
    assert [(e.action, e.outcome, e.failure) for e in reversed(events)] == [
        ("sign_in", "refused", "wrong_token"),
        ("sign_in", "refused", "wrong_token"),
        ("sign_in", "refused", "locked"),
        ("sign_in", "refused", "locked"),  # the right token is not even looked at
    ]
