"""Incidents through the dashboard: the API behind the token, and Slack's Acknowledge button as
Slack sends it (a signed form POST over real HTTP to the dashboard under uvicorn, the message
updated through a ``response_url`` served by a stand-in), with forged, stale and replayed
requests refused and changing nothing."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from aiohttp import web
from slack_sdk.signature import SignatureVerifier

from aegis_contracts import incidents
from aegis_contracts.items import Incident
from aegis_dashboard_api.access import token_digest
from aegis_dashboard_api.app import create_app
from aegis_dashboard_api.settings import DashboardSettings
from aegis_devstack.localservers import free_port
from aegis_devstack.testing.builders import FakeClock
from aegis_devstack.testing.storage import Foundation
from aegis_devstack.testing.webhook import serving
from aegis_storage.incidents import IncidentStore

pytestmark = pytest.mark.integration

NOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
TOKEN = "responder-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SECRET = "8f742231b10e8888abcd99yyyzzz85a5"


async def opened(f: Foundation, factory: str, reason: str = "GAS_LEAK") -> Incident:
    item = incidents.open_incident(
        scope=factory, stream="STATE", reason=reason, severity="CRITICAL", at=NOW
    )
    await IncidentStore(f.readmodel, f.store).save(item, None)
    return item


@pytest.fixture
async def client(foundation: Foundation) -> AsyncIterator[httpx.AsyncClient]:
    settings = DashboardSettings(
        bucket=foundation.bucket,
        table=foundation.table,
        dashboard_tokens=f"responder:{token_digest(TOKEN)}",
    )
    app = create_app(settings, clients=foundation.clients, clock=FakeClock(NOW))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://dash") as c:
        yield c


async def test_the_open_incidents_are_listed_and_one_is_read_with_its_timeline(
    client: httpx.AsyncClient, foundation: Foundation, unique_id: str
) -> None:
    gas = await opened(foundation, unique_id)
    other = await opened(foundation, f"{unique_id}-2", "FIRE_DETECTED")
    listed = (await client.get("/api/incidents", headers=AUTH)).json()["incidents"]
    assert {i["incident_id"] for i in listed} >= {gas.incident_id, other.incident_id}
    mine = (await client.get(f"/api/incidents?factory={unique_id}", headers=AUTH)).json()
    assert [i["incident_id"] for i in mine["incidents"]] == [gas.incident_id]
    one = (await client.get(f"/api/incidents/{gas.incident_id}", headers=AUTH)).json()
    assert one["state"] == "triggered" and one["timeline"][0]["kind"] == "triggered"
    assert (await client.get("/api/incidents/20261130-00000000", headers=AUTH)).status_code == 404
    assert (await client.get("/api/incidents/not-an-id", headers=AUTH)).status_code == 404


async def test_acknowledge_once_then_resolve_with_a_note_then_no_more_acknowledging(
    client: httpx.AsyncClient, foundation: Foundation, unique_id: str
) -> None:
    gas = await opened(foundation, unique_id)
    url = f"/api/incidents/{gas.incident_id}"
    first = await client.post(f"{url}/ack", headers=AUTH, json={"note": "on my way"})
    assert first.status_code == 200 and first.json()["changed"] is True
    who = f"token:{token_digest(TOKEN)[:8]}"
    assert first.json()["incident"]["acknowledged_by"] == who
    assert first.json()["incident"]["acknowledged_via"] == "dashboard"
    again = await client.post(f"{url}/ack", headers=AUTH)
    assert again.status_code == 200 and again.json()["changed"] is False
    assert (await client.post(f"{url}/resolve", headers=AUTH, json={})).status_code == 422
    closed = await client.post(f"{url}/resolve", headers=AUTH, json={"note": "valve closed"})
    assert closed.json()["incident"]["state"] == "resolved"
    assert closed.json()["incident"]["resolution_note"] == "valve closed"
    late = await client.post(f"{url}/ack", headers=AUTH)
    assert late.status_code == 409 and late.json()["error"] == "incident_resolved"
    stored = await IncidentStore(foundation.readmodel).get(gas.incident_id)
    assert stored is not None and [e.kind for e in stored.timeline] == [
        "triggered",
        "acknowledged",
        "resolved",
    ]


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}]
)
async def test_without_a_valid_token_no_incident_is_read_or_acknowledged(
    client: httpx.AsyncClient, foundation: Foundation, unique_id: str, headers: dict[str, str]
) -> None:
    gas = await opened(foundation, unique_id)
    for method, path in (
        ("GET", "/api/incidents"),
        ("GET", f"/api/incidents/{gas.incident_id}"),
        ("POST", f"/api/incidents/{gas.incident_id}/ack"),
        ("POST", f"/api/incidents/{gas.incident_id}/resolve"),
    ):
        resp = await client.request(method, path, headers=headers, json={"note": "x"})
        assert resp.status_code == 401, path
        assert gas.incident_id not in resp.text
    stored = await IncidentStore(foundation.readmodel).get(gas.incident_id)
    assert stored is not None and stored.version == gas.version


# -- Slack ------------------------------------------------------------------------------------


class SlackStandIn:
    """The ``response_url`` end of Slack: records each message update it is sent."""

    def __init__(self) -> None:
        self.updates: list[dict[str, Any]] = []
        self.base = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.updates.append(await request.json())
        return web.Response(text="ok")


@pytest.fixture
async def slack() -> AsyncIterator[SlackStandIn]:
    stand_in = SlackStandIn()
    app = web.Application()
    app.router.add_post("/{tail:.*}", stand_in.handle)
    async with serving(app) as base:
        stand_in.base = base
        yield stand_in


@pytest.fixture
def dashboard(
    aws_endpoint: str, foundation: Foundation, slack: SlackStandIn, uvicorn_served: Any
) -> Callable[[FakeClock], AbstractContextManager[str]]:
    """``with dashboard(clock) as base_url``: the dashboard under uvicorn on a free port (its own
    thread, clients and lifespan), taking Slack's requests signed with :data:`SECRET`."""

    def run(clock: FakeClock) -> AbstractContextManager[str]:
        settings = DashboardSettings(
            aws_endpoint_url=aws_endpoint,
            bucket=foundation.bucket,
            table=foundation.table,
            dashboard_host="127.0.0.1",
            dashboard_port=free_port(),
            dashboard_tokens=f"responder:{token_digest(TOKEN)}",
            dashboard_live=False,
            health_port=free_port(),
            slack_signing_secret=SECRET,
            slack_response_url_prefix=slack.base + "/",
        )
        served: AbstractContextManager[str] = uvicorn_served(
            create_app(settings, clock=clock), settings
        )
        return served

    return run


def click(incident: Incident, response_url: str, *, user: str = "kim") -> bytes:
    """The form body Slack POSTs when someone clicks an alert's Acknowledge button."""
    payload = {
        "type": "block_actions",
        "user": {"id": "U024BE7LH", "username": user, "name": user, "team_id": "T0"},
        "team": {"id": "T0", "domain": "plant"},
        "response_url": response_url,
        "message": {
            "text": "AEGIS CRITICAL",
            "blocks": [
                {"type": "header", "text": {"type": "plain_text", "text": "AEGIS CRITICAL"}},
                {
                    "type": "actions",
                    "block_id": "aegis_actions",
                    "elements": [
                        {
                            "type": "button",
                            "action_id": f"aegis_ack:{incident.incident_id}",
                            "value": incident.incident_id,
                            "text": {"type": "plain_text", "text": "Acknowledge"},
                        },
                        {
                            "type": "button",
                            "action_id": "aegis_open",
                            "url": "http://dash/x",
                            "text": {"type": "plain_text", "text": "Open"},
                        },
                    ],
                },
            ],
        },
        "actions": [
            {
                "action_id": f"aegis_ack:{incident.incident_id}",
                "block_id": "aegis_actions",
                "value": incident.incident_id,
                "type": "button",
            }
        ],
    }
    return urlencode({"payload": json.dumps(payload)}).encode()


def signed(body: bytes, at: datetime, secret: str = SECRET) -> dict[str, str]:
    """The headers Slack sends: its timestamp and ``v0=`` HMAC-SHA256 of ``v0:{ts}:{body}``."""
    timestamp = str(int(at.timestamp()))
    signature = SignatureVerifier(secret).generate_signature(timestamp=timestamp, body=body)
    assert signature is not None
    return {
        "X-Slack-Request-Timestamp": timestamp,
        "X-Slack-Signature": signature,
        "Content-Type": "application/x-www-form-urlencoded",
    }


async def test_the_slack_button_acknowledges_as_the_user_who_clicked_and_updates_the_message(
    dashboard: Any, foundation: Foundation, slack: SlackStandIn, unique_id: str
) -> None:
    gas = await opened(foundation, unique_id)
    body = click(gas, f"{slack.base}/actions/T0/1/abc")
    with dashboard(FakeClock(NOW + timedelta(seconds=40))) as base:
        async with httpx.AsyncClient(base_url=base) as http:
            resp = await http.post("/slack/interactions", content=body, headers=signed(body, NOW))
    assert resp.status_code == 200, resp.text
    stored = await IncidentStore(foundation.readmodel).get(gas.incident_id)
    assert stored is not None and stored.state == "acknowledged"
    assert (stored.acknowledged_by, stored.acknowledged_via) == ("slack:kim", "slack")
    assert stored.acknowledged_at == NOW + timedelta(seconds=40)
    (update,) = slack.updates
    assert update["replace_original"] is True
    actions = next(b for b in update["blocks"] if b["type"] == "actions")
    assert [e["action_id"] for e in actions["elements"]] == ["aegis_open"]  # no button left
    said = update["blocks"][-1]["elements"][0]["text"]
    assert "Acknowledged by <@U024BE7LH>" in said and gas.incident_id in said


async def test_a_forged_a_stale_and_a_replayed_slack_request_are_refused_and_change_nothing(
    dashboard: Any, foundation: Foundation, slack: SlackStandIn, unique_id: str
) -> None:
    gas = await opened(foundation, unique_id)
    other = await opened(foundation, unique_id, "FIRE_DETECTED")
    body = click(gas, f"{slack.base}/actions/1")
    clock = FakeClock(NOW)
    with dashboard(clock) as base:
        async with httpx.AsyncClient(base_url=base) as http:

            async def post(content: bytes, headers: dict[str, str]) -> httpx.Response:
                return await http.post("/slack/interactions", content=content, headers=headers)

            tries = {
                "wrong secret": (body, signed(body, NOW, secret="not-the-secret")),
                "body changed after signing": (
                    click(other, f"{slack.base}/actions/1"),
                    signed(body, NOW),
                ),
                "no signature": (body, {"Content-Type": "application/x-www-form-urlencoded"}),
                "six minutes old": (body, signed(body, NOW - timedelta(minutes=6))),
                "six minutes ahead": (body, signed(body, NOW + timedelta(minutes=6))),
                "timestamp not a number": (
                    body,
                    signed(body, NOW) | {"X-Slack-Request-Timestamp": "1e9"},
                ),
            }
            for name, (content, headers) in tries.items():
                resp = await post(content, headers)
                assert resp.status_code == 401, name
            # the genuine request, then the same bytes again (a captured request replayed)
            genuine = signed(body, NOW)
            assert (await post(body, genuine)).status_code == 200
            clock.advance(timedelta(minutes=2))
            replayed = await post(body, genuine)
            assert replayed.status_code == 409 and replayed.json()["error"] == "replayed"
    assert len(slack.updates) == 1  # only the genuine one updated the message
    untouched = await IncidentStore(foundation.readmodel).get(other.incident_id)
    assert untouched is not None and untouched.version == other.version
    acked = await IncidentStore(foundation.readmodel).get(gas.incident_id)
    assert acked is not None and acked.version == gas.version + 1


async def test_a_silence_is_created_listed_and_ended_and_the_guard_refuses_with_reasons(
    client: httpx.AsyncClient, foundation: Foundation, unique_id: str
) -> None:
    refused = await client.post(
        "/api/silences", headers=AUTH, json={"matchers": ["factory=~.*"], "duration": "12h"}
    )
    assert refused.status_code == 422 and refused.json()["error"] == "silence_refused"
    problems = " ".join(refused.json()["problems"])
    assert "reason" in problems and "8h" in problems.replace(" ", "")
    bad = await client.post(
        "/api/silences", headers=AUTH, json={"matchers": ["factory=~("], "duration": "1h"}
    )
    assert bad.status_code == 422
    made = await client.post(
        "/api/silences",
        headers=AUTH,
        json={"matchers": [f"factory={unique_id}"], "duration": "2h", "reason": "relining"},
    )
    assert made.status_code == 201, made.text
    silence = made.json()
    assert silence["created_by"] == f"token:{token_digest(TOKEN)[:8]}"
    assert silence["ends_at"].startswith("2026-11-30T05:00:00")
    listed = (await client.get("/api/silences", headers=AUTH)).json()["silences"]
    assert [s["id"] for s in listed] == [silence["id"]]
    ended = await client.delete(f"/api/silences/{silence['id']}", headers=AUTH)
    assert ended.status_code == 200 and ended.json()["expired_at"] is not None
    assert (await client.get("/api/silences", headers=AUTH)).json()["silences"] == []
    assert (await client.delete("/api/silences/s-000000000000", headers=AUTH)).status_code == 404
    for method, path in (("GET", "/api/silences"), ("DELETE", f"/api/silences/{silence['id']}")):
        assert (await client.request(method, path)).status_code == 401
    unauthorised = await client.post("/api/silences", json={"matchers": ["factory=x"]})
    assert unauthorised.status_code == 401
