"""Sign-in with OpenID Connect against a real provider (oidc-provider on Node.js) and the real
S3/DynamoDB emulator: the whole flow, state and nonce, expiry on the app's clock, sign-out
everywhere, groups to roles, and a person no group lets in."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import itsdangerous
import pydantic
import pytest
from starlette.requests import Request

from aegis_contracts import incidents, keys
from aegis_contracts.audit import AuditEvent
from aegis_contracts.people import Identity, Role
from aegis_contracts.times import format_ts, utc_now
from aegis_dashboard_api import audit
from aegis_dashboard_api.app import create_app
from aegis_dashboard_api.settings import DashboardSettings
from aegis_dashboard_api.signin import FLOW_COOKIE, SESSION_COOKIE, session_identity
from aegis_devstack.testing.builders import FakeClock, seed_latest
from aegis_devstack.testing.oidc import OidcClient, OidcProvider, OidcUser, running_provider
from aegis_devstack.testing.storage import Foundation
from aegis_storage.audit import AuditLog
from aegis_storage.incidents import IncidentStore
from aegis_storage.sessions import session_digest

pytestmark = pytest.mark.integration

DASHBOARD = "http://dash"
SECRET = "a-session-secret-of-at-least-32-characters"
MAX_AGE_S = 3600
ROLES = """
[[rule]]
group = "aegis-admins"
role = "admin"

[[rule]]
group = "north-viewers"
role = "viewer"
factories = ["north-*"]

[[rule]]
group = "south-responders"
role = "responder"
factories = ["south-1", "south-2"]
"""
USERS = [
    OidcUser("ana", "Ana Admin", "ana@example.com", ["aegis-admins", "north-viewers"]),
    OidcUser("vic", "Vic Viewer", "vic@example.com", ["north-viewers", "cafeteria"]),
    OidcUser("rita", "Rita Responder", "rita@example.com", ["north-viewers", "south-responders"]),
    OidcUser("nobody", "No Body", "nobody@example.com", ["marketing"]),
]


@dataclass
class Dashboard:
    """The app (on the emulator's table, on a clock the test moves), a browser's two cookie
    jars: the dashboard's (``http``) and the provider's (``browser``)."""

    provider: OidcProvider
    settings: DashboardSettings
    clock: FakeClock
    app: Any
    http: httpx.AsyncClient
    browser: httpx.AsyncClient

    async def start(self, next_path: str = "/factories/north-1") -> str:
        """``/auth/login``: the provider's authorization URL it redirects to."""
        login = await self.http.get("/auth/login", params={"next": next_path})
        assert login.status_code == 302, login.text
        location = login.headers["location"]
        assert location.startswith(f"{self.provider.issuer}/")
        return location

    async def sign_in(self, account: str) -> httpx.Response:
        """The whole flow: login, the provider's form, the callback's answer."""
        callback = await self.provider.sign_in(self.browser, await self.start(), account)
        return await self.http.get(callback)

    def cookie(self) -> str | None:
        return self.http.cookies.get(SESSION_COOKIE)

    async def identity_of(self, cookie: str | None) -> Identity | None:
        """:func:`session_identity` of a request that carries ``cookie`` (as the access layer
        calls it)."""
        headers = [(b"cookie", f"{SESSION_COOKIE}={cookie}".encode())] if cookie else []
        scope = {"type": "http", "method": "GET", "path": "/", "headers": headers}
        return await session_identity(Request({**scope, "app": self.app, "query_string": b""}))


@pytest.fixture(scope="module")
def provider() -> Iterator[OidcProvider]:
    """One provider for the module: each test's browser has cookie jars of its own."""
    with running_provider(
        client=OidcClient(
            redirect_uris=[f"{DASHBOARD}/auth/callback", "https://dash/auth/callback"],
            post_logout_redirect_uris=[f"{DASHBOARD}/auth/signed-out"],
        ),
        users=USERS,
    ) as running:
        yield running


@pytest.fixture
async def dashboard(
    foundation: Foundation, provider: OidcProvider, tmp_path: Path
) -> AsyncIterator[Dashboard]:
    roles = tmp_path / "roles.toml"
    roles.write_text(ROLES)
    settings = DashboardSettings(
        bucket=foundation.bucket,
        table=foundation.table,
        dashboard_live=False,
        oidc_issuer=provider.issuer,
        oidc_client_id=provider.client.client_id,
        oidc_client_secret=provider.client.client_secret,
        oidc_roles_file=roles,
        dashboard_session_secret=SECRET,
        dashboard_session_max_age_s=MAX_AGE_S,
    )
    clock = FakeClock(utc_now())  # the provider's tokens are dated on the real clock
    app = create_app(settings, clients=foundation.clients, clock=clock)
    transport = httpx.ASGITransport(app=app)
    async with (
        httpx.AsyncClient(transport=transport, base_url=DASHBOARD) as http,
        httpx.AsyncClient() as browser,
    ):
        yield Dashboard(provider, settings, clock, app, http, browser)


async def test_a_full_sign_in_gives_a_session_whose_identity_has_the_groups_role_and_scope(
    dashboard: Dashboard, foundation: Foundation
) -> None:
    answer = await dashboard.sign_in("rita")
    assert answer.status_code == 303, answer.text
    assert answer.headers["location"] == "/factories/north-1"  # the login's ?next=
    expected = Identity(
        subject="rita",
        name="Rita Responder",
        via="oidc",
        role=Role.RESPONDER,
        scope=("north-*", "south-1", "south-2"),
    )
    cookie = dashboard.cookie()
    assert cookie is not None
    assert await dashboard.identity_of(cookie) == expected
    me = await dashboard.http.get("/auth/me")
    assert me.status_code == 200
    assert Identity.model_validate(me.json()) == expected
    # the cookie: only the signed random id, HttpOnly, SameSite=Lax, not Secure over http
    set_cookie = next(
        h for h in answer.headers.get_list("set-cookie") if h.startswith(f"{SESSION_COOKIE}=")
    )
    assert "httponly" in set_cookie.lower() and "samesite=lax" in set_cookie.lower()
    assert "secure" not in set_cookie.lower()
    assert f"Max-Age={MAX_AGE_S}" in set_cookie
    assert "rita" not in cookie and "responder" not in cookie.lower()
    # the table holds the session under the id's digest, the identity, an expiry and its ttl
    session_id = cookie.rsplit(".", 1)[0]
    item = await foundation.readmodel.get_item(
        keys.session_pk(session_digest(session_id)), keys.SESSION_SK
    )
    assert item is not None
    assert item["identity"]["subject"] == "rita"
    assert item["ttl"] == int((dashboard.clock() + timedelta(seconds=MAX_AGE_S)).timestamp())
    assert item["id_token"].count(".") == 2  # kept for the provider's sign-out


async def test_over_https_the_session_and_flow_cookies_are_secure(dashboard: Dashboard) -> None:
    transport = httpx.ASGITransport(app=dashboard.app)
    async with httpx.AsyncClient(transport=transport, base_url="https://dash") as http:
        login = await http.get("/auth/login")
        assert "redirect_uri=https%3A%2F%2Fdash%2Fauth%2Fcallback" in login.headers["location"]
        flow = login.headers["set-cookie"]
        assert flow.startswith(f"{FLOW_COOKIE}=") and "; secure" in flow.lower()
        assert "path=/auth" in flow.lower() and "samesite=lax" in flow.lower()
        callback = await dashboard.provider.sign_in(
            dashboard.browser, login.headers["location"], "vic"
        )
        answer = await http.get(callback)
    assert answer.status_code == 303, answer.text
    session = next(
        h for h in answer.headers.get_list("set-cookie") if h.startswith(f"{SESSION_COOKIE}=")
    )
    assert "; secure" in session.lower() and "httponly" in session.lower()


async def refusal_on_record(dashboard: Dashboard, foundation: Foundation) -> AuditEvent:
    """The one audit event of the test's day, once the dashboard has written it."""
    await audit.settled(dashboard.app)
    (refused,) = (await AuditLog(foundation.store).day(dashboard.clock().date()))[0]
    assert (refused.action, refused.outcome) == ("sign_in", "refused")
    return refused


async def test_a_callback_whose_state_is_not_the_flows_is_refused_and_recorded_as_provider_refused(
    dashboard: Dashboard, foundation: Foundation
) -> None:
    callback = await dashboard.provider.sign_in(dashboard.browser, await dashboard.start(), "ana")
    parts = urlsplit(callback)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()} | {"state": "forged-state"}
    answer = await dashboard.http.get(f"{parts.path}?{urlencode(query)}")
    assert answer.status_code == 400
    assert "Sign-in did not complete" in answer.text
    assert dashboard.cookie() is None
    assert (await dashboard.http.get("/auth/me")).status_code == 401
    assert (await refusal_on_record(dashboard, foundation)).failure == "provider_refused"


async def test_a_callback_without_a_sign_in_started_in_this_browser_is_refused(
    dashboard: Dashboard,
) -> None:
    callback = await dashboard.provider.sign_in(dashboard.browser, await dashboard.start(), "ana")
    dashboard.http.cookies.clear()  # another browser brings the code and state
    answer = await dashboard.http.get(callback)
    assert answer.status_code == 400
    assert dashboard.cookie() is None


def _edit_flow(value: str, edit: Any) -> str:
    """The flow cookie (Starlette's session: base64 JSON, signed with the session secret) with
    ``edit`` applied to Authlib's state data, signed again."""
    signer = itsdangerous.TimestampSigner(SECRET)
    data = json.loads(base64.b64decode(signer.unsign(value)))
    [state_key] = [k for k in data if k.startswith("_state_oidc_")]
    edit(data[state_key]["data"])
    return signer.sign(base64.b64encode(json.dumps(data).encode())).decode()


async def test_an_id_token_whose_nonce_is_not_the_flows_is_refused_and_recorded_as_provider_refused(
    dashboard: Dashboard, foundation: Foundation
) -> None:
    authorization = await dashboard.start()
    callback = await dashboard.provider.sign_in(dashboard.browser, authorization, "ana")
    sent_nonce = parse_qs(urlsplit(authorization).query)["nonce"][0]
    [flow] = [c for c in dashboard.http.cookies.jar if c.name == FLOW_COOKIE]
    assert flow.value is not None

    def other_nonce(state: dict[str, Any]) -> None:
        assert state["nonce"] == sent_nonce  # what the ID token carries
        state["nonce"] = "not-the-nonce-sent"

    flow.value = _edit_flow(flow.value, other_nonce)
    answer = await dashboard.http.get(callback)
    assert answer.status_code == 400
    assert dashboard.cookie() is None
    assert (await dashboard.http.get("/auth/me")).status_code == 401
    assert (await refusal_on_record(dashboard, foundation)).failure == "provider_refused"


async def test_a_session_is_refused_once_its_max_age_has_passed_on_the_apps_clock(
    dashboard: Dashboard,
) -> None:
    assert (await dashboard.sign_in("vic")).status_code == 303
    cookie = dashboard.cookie()
    dashboard.clock.advance(timedelta(seconds=MAX_AGE_S - 1))
    assert await dashboard.identity_of(cookie) is not None
    assert (await dashboard.http.get("/auth/me")).status_code == 200
    dashboard.clock.advance(timedelta(seconds=1))
    assert await dashboard.identity_of(cookie) is None
    assert (await dashboard.http.get("/auth/me")).status_code == 401


async def test_signing_out_ends_the_session_so_a_copy_of_the_cookie_is_refused_and_the_provider_signs_out_too(
    dashboard: Dashboard,
) -> None:
    assert (await dashboard.sign_in("ana")).status_code == 303
    copy = dashboard.cookie()
    assert await dashboard.identity_of(copy) is not None
    out = await dashboard.http.post("/auth/logout")
    assert out.status_code == 303
    assert dashboard.cookie() is None  # cleared in this browser
    # ended in the table: the copy taken before is refused, by this and any replica
    assert await dashboard.identity_of(copy) is None
    transport = httpx.ASGITransport(app=dashboard.app)
    async with httpx.AsyncClient(
        transport=transport, base_url=DASHBOARD, cookies={SESSION_COOKIE: copy or ""}
    ) as thief:
        assert (await thief.get("/auth/me")).status_code == 401
    # then the provider's end_session_endpoint, with the ID token as hint
    target = urlsplit(out.headers["location"])
    assert (
        f"{target.scheme}://{target.netloc}{target.path}"
        == f"{dashboard.provider.issuer}/session/end"
    )
    query = {k: v[0] for k, v in parse_qs(target.query).items()}
    assert query["post_logout_redirect_uri"] == f"{DASHBOARD}/auth/signed-out"
    assert query["client_id"] == dashboard.provider.client.client_id
    assert query["id_token_hint"].count(".") == 2
    # the provider takes them (a wrong hint or an unregistered URI would be an error page) and,
    # once its sign-out form is confirmed, sends the browser back to the dashboard
    confirm = await dashboard.browser.get(out.headers["location"])
    assert confirm.status_code == 200, confirm.text
    xsrf = re.search(r'name="xsrf" value="([^"]+)"', confirm.text)
    action = re.search(r'action="([^"]+)"', confirm.text)
    assert xsrf and action
    done = await dashboard.browser.post(
        f"{dashboard.provider.issuer}{urlsplit(action.group(1)).path}",
        data={"xsrf": xsrf.group(1), "logout": "yes"},
    )
    assert done.status_code in (302, 303), done.text
    assert done.headers["location"].startswith(f"{DASHBOARD}/auth/signed-out")
    page = await dashboard.http.get("/auth/signed-out")
    assert page.status_code == 200 and "You are signed out." in page.text


async def test_signing_out_twice_or_without_a_session_only_clears_the_cookie(
    dashboard: Dashboard,
) -> None:
    out = await dashboard.http.post("/auth/logout")
    assert out.status_code == 303
    assert out.headers["location"] == f"{DASHBOARD}/auth/signed-out"


@pytest.mark.parametrize(
    ("account", "role", "scope"),
    [
        ("ana", Role.ADMIN, ("north-*",)),
        ("vic", Role.VIEWER, ("north-*",)),
        ("rita", Role.RESPONDER, ("north-*", "south-1", "south-2")),
    ],
)
async def test_the_providers_groups_give_the_highest_role_and_the_union_of_scopes(
    dashboard: Dashboard, account: str, role: Role, scope: tuple[str, ...]
) -> None:
    assert (await dashboard.sign_in(account)).status_code == 303
    identity = await dashboard.identity_of(dashboard.cookie())
    assert identity is not None
    assert (identity.subject, identity.role, identity.scope) == (account, role, scope)


async def test_a_person_in_no_mapped_group_is_refused_with_a_page_saying_why_and_recorded_as_unknown_user(
    dashboard: Dashboard, foundation: Foundation
) -> None:
    answer = await dashboard.sign_in("nobody")
    assert answer.status_code == 403
    assert "none of the groups" in answer.text
    assert "nobody@example.com" in answer.text  # who they signed in as
    assert dashboard.cookie() is None
    assert (await dashboard.http.get("/auth/me")).status_code == 401
    refused = await refusal_on_record(dashboard, foundation)
    assert (refused.target, refused.failure) == ("nobody", "unknown_user")
    assert "nobody@example.com" in refused.detail


async def test_a_session_cookie_signed_with_another_key_is_refused(dashboard: Dashboard) -> None:
    assert (await dashboard.sign_in("ana")).status_code == 303
    session_id = (dashboard.cookie() or "").rsplit(".", 1)[0]
    forged = itsdangerous.Signer("another-key", salt="aegis-session-id").sign(session_id).decode()
    assert await dashboard.identity_of(forged) is None
    assert await dashboard.identity_of(session_id) is None  # unsigned


async def test_without_an_issuer_the_auth_routes_answer_404_and_there_is_no_session(
    foundation: Foundation,
) -> None:
    settings = DashboardSettings(bucket=foundation.bucket, table=foundation.table)
    app = create_app(settings, clients=foundation.clients)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=DASHBOARD) as http:
        for path in ("/auth/login", "/auth/callback", "/auth/me", "/auth/signed-out"):
            assert (await http.get(path)).status_code == 404, path
        assert (await http.post("/auth/logout")).status_code == 404
    request = Request({"type": "http", "method": "GET", "path": "/", "headers": [], "app": app})
    assert await session_identity(request) is None


def test_an_issuer_without_client_secret_roles_or_session_secret_is_refused_naming_them() -> None:
    with pytest.raises(pydantic.ValidationError) as refused:
        DashboardSettings(oidc_issuer="https://login.example.com", oidc_client_id="dash")
    for name in (
        "AEGIS_OIDC_CLIENT_SECRET",
        "AEGIS_OIDC_ROLES_FILE",
        "AEGIS_DASHBOARD_SESSION_SECRET",
    ):
        assert name in str(refused.value)


async def test_a_signed_in_person_reads_and_acts_as_the_groups_role_and_scope_say(
    dashboard: Dashboard, foundation: Foundation
) -> None:
    """Through the API, a session is its groups' identity: Vic (viewer of north-*) sees
    north-1, not south-1, and may not acknowledge; Rita (responder of north-* too) may, and is
    named as who did it; signed out, the API answers 401."""
    now = dashboard.clock()
    opened = {}
    for fid in ("north-1", "south-9"):
        await seed_latest(foundation.readmodel, fid, {"updated_at": format_ts(now)})
        opened[fid] = incidents.open_incident(
            scope=fid, stream="STATE", reason="GAS_LEAK", severity="CRITICAL", at=now
        )
        await IncidentStore(foundation.readmodel).save(opened[fid], None)
    ack = f"/api/incidents/{opened['north-1'].incident_id}/ack"

    assert (await dashboard.sign_in("vic")).status_code == 303
    fleet = (await dashboard.http.get("/api/fleet")).json()["factories"]
    assert [f["factory_id"] for f in fleet] == ["north-1"]
    assert (await dashboard.http.get("/api/factories/south-9")).status_code == 404
    assert (await dashboard.http.post(ack, json={})).status_code == 403
    assert (await dashboard.http.post("/auth/logout")).status_code == 303
    assert (await dashboard.http.get("/api/fleet")).status_code == 401

    dashboard.browser.cookies.clear()  # another person at the provider (its own session gone)
    assert (await dashboard.sign_in("rita")).status_code == 303
    south = f"/api/incidents/{opened['south-9'].incident_id}/ack"
    assert (await dashboard.http.post(south, json={})).status_code == 404  # not in her scope
    done = await dashboard.http.post(ack, json={})
    assert done.status_code == 200
    assert done.json()["incident"]["acknowledged_by"] == "oidc:Rita Responder"
    # the record: each sign-in, the refusals, the sign-out, the acknowledgement, by name
    await audit.settled(dashboard.app)
    events, _ = await AuditLog(foundation.store).day(now.date())
    assert sorted((e.action, e.outcome, e.actor) for e in events) == sorted(
        [
            ("sign_in", "ok", "oidc:Vic Viewer"),
            ("incident.acknowledge", "refused", "oidc:Vic Viewer"),
            ("sign_out", "ok", "oidc:Vic Viewer"),
            ("sign_in", "ok", "oidc:Rita Responder"),
            ("incident.acknowledge", "refused", "oidc:Rita Responder"),
            ("incident.acknowledge", "ok", "oidc:Rita Responder"),
        ]
    )
    assert {e.via for e in events} == {"oidc"} and {e.subject for e in events} == {"vic", "rita"}


async def test_the_sign_in_page_offers_the_provider_and_a_signed_in_page_signs_out_there(
    dashboard: Dashboard, foundation: Foundation
) -> None:
    form = await dashboard.http.get("/login", params={"next": "/incidents"})
    assert 'href="/auth/login?next=%2Fincidents"' in form.text
    await seed_latest(foundation.readmodel, "north-1", {"updated_at": format_ts(dashboard.clock())})
    assert (await dashboard.sign_in("vic")).status_code == 303
    page = await dashboard.http.get("/")
    assert page.status_code == 200 and "north-1" in page.text
    assert 'action="/auth/logout"' in page.text
