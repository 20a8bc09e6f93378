"""The read API against a seeded read model and bucket in the real S3/DynamoDB emulator."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, date, datetime, timedelta
from typing import Any

import httpx
import pytest

from aegis_contracts import keys
from aegis_contracts.keys import ReportArtifact
from aegis_contracts.people import Role
from aegis_contracts.times import format_ts
from aegis_dashboard_api.access import token_digest
from aegis_dashboard_api.app import create_app
from aegis_dashboard_api.settings import DashboardSettings
from aegis_devstack.localservers import free_port
from aegis_devstack.testing.builders import FakeClock, seed_latest
from aegis_devstack.testing.storage import Foundation
from aegis_storage.clients import AwsConfig, open_clients

pytestmark = pytest.mark.integration

NOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
TOKEN = "wall-screen-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
IMAGE = b"\xff\xd8\xff\xe0 a camera frame \x00\x01\x02"
REPORT = "# factory daily report\n\n- gas leak at **09:12** KST\n<script>x</script>\n\nend \u2713\n"
DAY = date(2026, 11, 29)


def _ttl(delta: timedelta) -> int:
    return int((NOW + delta).timestamp())


LIVE, EXPIRED = _ttl(timedelta(hours=1)), _ttl(-timedelta(seconds=1))


async def seed(f: Foundation, fid: str) -> dict[str, Any]:
    """LATEST, history (live, expired, out of window), cloud, alerts, an image, a report."""
    rm, pk = f.readmodel, keys.factory_pk(fid)
    captured = NOW - timedelta(minutes=1)
    image_key = keys.image_snapshot_key(fid, captured, "cam-1.jpg")
    await f.store.put_bytes(image_key, IMAGE, content_type="image/jpeg")
    await seed_latest(
        rm,
        fid,
        {
            "risk": {"score": 87.5, "level": "CRITICAL", "reasons": [{"code": "GAS_LEAK"}]},
            "pipeline_status": {"status": "OK", "checked_at": format_ts(NOW)},
            "last_factory_state_at": format_ts(NOW - timedelta(seconds=12)),
            "latest_image_snapshot": {
                "s3_key": image_key,
                "camera_id": "cam-1",
                "content_type": "image/jpeg",
                "size_bytes": len(IMAGE),
                "captured_at": format_ts(captured),
            },
            "updated_at": format_ts(NOW),
        },
    )
    series = [  # (sort key, name, ttl): HISTORY#STATE for 1h, GRAPH#5M for the longer windows
        (keys.history_state_sk(NOW - timedelta(minutes=10)), "live", LIVE),
        (keys.history_state_sk(NOW - timedelta(minutes=20)), "expired", EXPIRED),
        (keys.history_state_sk(NOW - timedelta(minutes=90)), "too_old", LIVE),
        (keys.graph_5m_sk(NOW - timedelta(hours=3)), "3h", LIVE),
        (keys.graph_5m_sk(NOW - timedelta(hours=2)), "2h_expired", EXPIRED),
        (keys.graph_5m_sk(NOW - timedelta(hours=8)), "8h", LIVE),
        (keys.graph_5m_sk(NOW - timedelta(hours=20)), "20h", LIVE),
    ]
    for sk, name, ttl in series:
        await rm.put_item({"pk": pk, "sk": sk, "name": name, "ttl": ttl})
    await rm.put_item({"pk": keys.CLOUD_PK, "sk": keys.LATEST_SK, "overall_status": "WARNING"})
    for tier, name, at, ttl in [
        ("fast", "fast_live", NOW - timedelta(hours=1), LIVE),
        ("fast", "fast_expired", NOW - timedelta(hours=2), EXPIRED),
        ("slow", "slow_live", NOW - timedelta(hours=20), LIVE),
    ]:
        sk = keys.cloud_history_sk(tier, at)
        await rm.put_item({"pk": keys.CLOUD_PK, "sk": sk, "name": name, "ttl": ttl})
    for severity, firing, ttl in [
        ("CRITICAL", True, LIVE),
        ("WARNING", True, EXPIRED),
        ("WARNING", False, LIVE),
    ]:
        await rm.put_item(
            {
                "pk": keys.alert_pk(fid),
                "sk": keys.alert_sk(severity, "GAS_LEAK", "OPEN"),
                "firing": firing,
                "ttl": ttl,
            }
        )
    await f.store.put_bytes(
        keys.report_key(DAY, fid, ReportArtifact.REPORT),
        REPORT.encode(),
        content_type="text/markdown",
    )
    return {"image_key": image_key}


@pytest.fixture
async def client(foundation: Foundation) -> AsyncIterator[httpx.AsyncClient]:
    settings = DashboardSettings(
        bucket=foundation.bucket,
        table=foundation.table,
        dashboard_tokens=f"{'0' * 64}, {token_digest(TOKEN)}",
    )
    app = create_app(settings, clients=foundation.clients, clock=FakeClock(NOW))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://dash") as c:
        yield c


async def test_fleet_shows_level_score_reasons_freshness_pipeline(
    client: httpx.AsyncClient, foundation: Foundation, unique_id: str
) -> None:
    await seed(foundation, unique_id)
    resp = await client.get("/api/fleet", headers=AUTH)
    assert resp.status_code == 200
    (entry,) = resp.json()["factories"]
    assert entry["factory_id"] == unique_id
    assert (entry["level"], entry["score"]) == ("CRITICAL", 87.5)
    assert entry["reasons"] == [{"code": "GAS_LEAK"}]
    assert entry["age_s"] == 12.0
    assert entry["pipeline_status"] == "OK"


async def test_empty_read_model_is_an_empty_result(client: httpx.AsyncClient) -> None:
    assert (await client.get("/api/fleet", headers=AUTH)).json()["factories"] == []
    cloud = (await client.get("/api/cloud", headers=AUTH)).json()
    assert cloud == {"latest": None, "fast": [], "slow": []}
    assert (await client.get("/api/alerts", headers=AUTH)).json() == {"alerts": []}
    reports = await client.get("/api/reports", params={"date": "2026-11-29"}, headers=AUTH)
    assert reports.json() == {"day": "2026-11-29", "reports": []}


async def test_factory_latest_and_unknown_factory_is_404(
    client: httpx.AsyncClient, foundation: Foundation, unique_id: str
) -> None:
    await seed(foundation, unique_id)
    resp = await client.get(f"/api/factories/{unique_id}", headers=AUTH)
    assert resp.status_code == 200
    assert resp.json()["latest"]["risk"]["level"] == "CRITICAL"
    for fid in ("factory-nope", "Not_Valid", "cloud-infra"):
        for path in ("", "/history", "/images/latest"):
            missing = await client.get(f"/api/factories/{fid}{path}", headers=AUTH)
            assert missing.status_code == 404, (fid, path)
            assert missing.json()["error"] == "unknown_factory"
            assert fid in missing.json()["message"]


@pytest.mark.parametrize(
    ("window", "family", "names"),
    [
        ("1h", "HISTORY#STATE#", ["live"]),
        ("6h", "GRAPH#5M#", ["3h"]),
        ("12h", "GRAPH#5M#", ["8h", "3h"]),
        ("24h", "GRAPH#5M#", ["20h", "8h", "3h"]),
    ],
)
async def test_history_reads_the_window_key_family_without_expired_items(
    client: httpx.AsyncClient,
    foundation: Foundation,
    unique_id: str,
    window: str,
    family: str,
    names: list[str],
) -> None:
    await seed(foundation, unique_id)
    resp = await client.get(
        f"/api/factories/{unique_id}/history", params={"window": window}, headers=AUTH
    )
    assert resp.status_code == 200
    body = resp.json()
    assert (body["window"], body["family"]) == (window, family)
    assert [i["name"] for i in body["items"]] == names
    assert all(i["sk"].startswith(family) for i in body["items"])


async def test_history_refuses_an_unknown_window(
    client: httpx.AsyncClient, foundation: Foundation, unique_id: str
) -> None:
    await seed(foundation, unique_id)
    resp = await client.get(
        f"/api/factories/{unique_id}/history", params={"window": "2h"}, headers=AUTH
    )
    assert resp.status_code == 422


async def test_cloud_latest_and_history_without_expired(
    client: httpx.AsyncClient, foundation: Foundation, unique_id: str
) -> None:
    await seed(foundation, unique_id)
    body = (await client.get("/api/cloud", headers=AUTH)).json()
    assert body["latest"]["overall_status"] == "WARNING"
    assert [i["name"] for i in body["fast"]] == ["fast_live"]
    assert [i["name"] for i in body["slow"]] == ["slow_live"]


async def test_alerts_are_the_live_firing_ones(
    client: httpx.AsyncClient, foundation: Foundation, unique_id: str
) -> None:
    await seed(foundation, unique_id)
    (alert,) = (await client.get("/api/alerts", headers=AUTH)).json()["alerts"]
    assert alert["pk"] == keys.alert_pk(unique_id)
    assert alert["sk"].startswith("CRITICAL#") and alert["firing"] is True


async def test_presigned_image_urls_download_the_image(
    client: httpx.AsyncClient, foundation: Foundation, unique_id: str
) -> None:
    seeded = await seed(foundation, unique_id)
    latest = (await client.get(f"/api/factories/{unique_id}/images/latest", headers=AUTH)).json()
    image = latest["image"]
    assert image["s3_key"] == seeded["image_key"] and image["camera_id"] == "cam-1"
    day = (
        await client.get(
            f"/api/factories/{unique_id}/images", params={"date": "2026-11-30"}, headers=AUTH
        )
    ).json()
    assert [i["s3_key"] for i in day["images"]] == [seeded["image_key"]]
    async with httpx.AsyncClient() as outside:  # no token: the URL alone grants the read
        for url in (image["url"], day["images"][0]["url"]):
            got = await outside.get(url)
            assert got.status_code == 200
            assert got.content == IMAGE
    other_day = await client.get(
        f"/api/factories/{unique_id}/images", params={"date": "2026-11-29"}, headers=AUTH
    )
    assert other_day.json()["images"] == []


async def test_latest_image_is_null_when_there_is_none(
    client: httpx.AsyncClient, foundation: Foundation, unique_id: str
) -> None:
    await seed_latest(foundation.readmodel, unique_id, {"updated_at": format_ts(NOW)})
    resp = await client.get(f"/api/factories/{unique_id}/images/latest", headers=AUTH)
    assert resp.json() == {"factory_id": unique_id, "image": None}


async def test_report_served_byte_for_byte_and_as_html(
    client: httpx.AsyncClient, foundation: Foundation, unique_id: str
) -> None:
    await seed(foundation, unique_id)
    listing = (await client.get("/api/reports", params={"date": "2026-11-29"}, headers=AUTH)).json()
    assert listing["reports"] == [{"target": unique_id, "artifacts": ["report.md"]}]
    md = await client.get(f"/api/reports/2026-11-29/{unique_id}", headers=AUTH)
    assert md.status_code == 200
    assert md.headers["content-type"].startswith("text/markdown")
    assert md.content == REPORT.encode()
    html = await client.get(
        f"/api/reports/2026-11-29/{unique_id}", params={"format": "html"}, headers=AUTH
    )
    assert html.headers["content-type"].startswith("text/html")
    assert "<h1>factory daily report</h1>" in html.text
    assert "<strong>09:12</strong>" in html.text
    assert "<script>" not in html.text  # raw HTML in a report is escaped
    missing = await client.get(f"/api/reports/2026-11-28/{unique_id}", headers=AUTH)
    assert missing.status_code == 404 and missing.json()["error"] == "no_report"


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": f"Bearer {token_digest(TOKEN)}"},  # the digest is not the token
        {"Authorization": "Bearer "},
    ],
)
async def test_without_a_valid_token_401_and_no_data(
    client: httpx.AsyncClient, foundation: Foundation, unique_id: str, headers: dict[str, str]
) -> None:
    await seed(foundation, unique_id)
    for path in (
        "/api/fleet",
        f"/api/factories/{unique_id}",
        f"/api/factories/{unique_id}/history?window=6h",
        "/api/cloud",
        "/api/alerts",
        f"/api/factories/{unique_id}/images/latest",
        f"/api/factories/{unique_id}/images?date=2026-11-30",
        "/api/reports?date=2026-11-29",
        f"/api/reports/2026-11-29/{unique_id}",
        "/api/factories/factory-nope",
    ):
        resp = await client.get(path, headers=headers)
        assert resp.status_code == 401, path
        assert resp.json() == {
            "error": "unauthorized",
            "message": "a valid bearer token or a signed-in session is required",
        }
        assert unique_id not in resp.text


async def test_health_is_open_and_cors_closed_by_default(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).status_code == 200
    assert (await client.get("/readyz")).json() == {"ready": True}
    resp = await client.get("/api/fleet", headers={**AUTH, "Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in resp.headers


async def test_openapi_documents_every_endpoint(client: httpx.AsyncClient) -> None:
    schema = (await client.get("/openapi.json")).json()
    assert set(schema["paths"]) == {
        "/api/fleet",
        "/api/factories/{factory_id}",
        "/api/factories/{factory_id}/history",
        "/api/cloud",
        "/api/alerts",
        "/api/factories/{factory_id}/images/latest",
        "/api/factories/{factory_id}/images",
        "/api/reports",
        "/api/reports/{report_date}/{target}",
        "/api/incidents",
        "/api/incidents/{incident_id}",
        "/api/incidents/{incident_id}/ack",
        "/api/incidents/{incident_id}/resolve",
        "/api/silences",
        "/api/silences/{silence_id}",
        "/api/audit",
        "/api/jobs",
        "/api/jobs/{job_id}",
        "/api/jobs/{job_id}/executions",
        "/api/jobs/{job_id}/versions",
        "/api/jobs/{job_id}/versions/{version}",
        "/api/jobs/{job_id}/diff",
        "/api/jobs/{job_id}/enable",
        "/api/jobs/{job_id}/disable",
    }


def test_tokens_setting_takes_digests_each_optionally_after_a_role() -> None:
    with pytest.raises(ValueError, match="AEGIS_DASHBOARD_TOKENS"):
        DashboardSettings(dashboard_tokens="plain-token")
    with pytest.raises(ValueError, match="'owner' is not a role"):
        DashboardSettings(dashboard_tokens=f"owner:{token_digest(TOKEN)}")
    assert DashboardSettings(dashboard_tokens="").token_grants == ()
    wall, desk = DashboardSettings(
        dashboard_tokens=f"{token_digest(TOKEN)}, RESPONDER:{token_digest('desk')}"
    ).token_grants
    assert (wall.identity.role, wall.identity.scope) == (Role.VIEWER, ("*",))
    assert (desk.identity.role, desk.digest) == (Role.RESPONDER, token_digest("desk"))


async def test_storage_down_is_503_with_a_clear_body() -> None:
    dead = AwsConfig(endpoint_url=f"http://127.0.0.1:{free_port()}", max_attempts=1)
    async with open_clients(dead) as clients:
        settings = DashboardSettings(dashboard_tokens=token_digest(TOKEN))
        app = create_app(settings, clients=clients, clock=FakeClock(NOW))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://dash") as c:
            resp = await c.get("/api/fleet", headers=AUTH)
            assert resp.status_code == 503
            assert resp.json()["error"] == "storage_unavailable"
            assert (await c.get("/readyz")).status_code == 503


def fleet_app(foundation: Foundation, *, cache_s: float, idle_s: float = 60.0) -> Any:
    settings = DashboardSettings(
        bucket=foundation.bucket,
        table=foundation.table,
        dashboard_tokens=token_digest(TOKEN),
        dashboard_fleet_cache_s=cache_s,
        dashboard_fleet_idle_s=idle_s,
    )
    return create_app(settings, clients=foundation.clients, clock=FakeClock(NOW))


@asynccontextmanager
async def kept_warm(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A client of ``app`` with its fleet kept warm in the background meanwhile."""
    stop = asyncio.Event()
    warm = asyncio.create_task(app.state.reader.keep_fleet_warm(stop))
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://dash") as c:
            yield c
    finally:
        stop.set()
        await warm


async def test_the_fleet_is_read_once_per_cache_period_for_every_screen(
    foundation: Foundation, unique_id: str
) -> None:
    app = fleet_app(foundation, cache_s=60)
    scans = 0
    reader = app.state.reader
    scan = reader.readmodel.factory_latest_items

    async def counted() -> list[dict[str, Any]]:
        nonlocal scans
        scans += 1
        return await scan()

    reader.readmodel.factory_latest_items = counted
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://dash") as c:
        screens = await asyncio.gather(*(c.get("/api/fleet", headers=AUTH) for _ in range(20)))
        assert {r.status_code for r in screens} == {200} and scans == 1
        await seed(foundation, unique_id)  # inside the period: the cached fleet is served
        assert (await c.get("/api/fleet", headers=AUTH)).json()["factories"] == []
        reader._fleet_read_at = 0.0  # the period has passed
        (entry,) = (await c.get("/api/fleet", headers=AUTH)).json()["factories"]
        assert entry["factory_id"] == unique_id and scans == 2


async def test_kept_warm_the_fleet_never_waits_for_a_scan_nor_loses_a_newer_event(
    foundation: Foundation, unique_id: str
) -> None:
    app = fleet_app(foundation, cache_s=0.2)
    reader = app.state.reader
    scan = reader.readmodel.factory_latest_items
    await seed(foundation, unique_id)
    gate, scanning = asyncio.Event(), asyncio.Event()
    scans = 0

    async def held_scan() -> list[dict[str, Any]]:
        nonlocal scans
        scans += 1
        items = await scan()  # read now, returned when the test lets it: a slow scan
        if scans > 1:
            scanning.set()
            await gate.wait()
        return items

    reader.readmodel.factory_latest_items = held_scan
    async with kept_warm(app) as c:
        try:  # the gate opens on any failure too: the warming task must end with the test
            # a screen asks (the first read; warming starts), then the next scan hangs
            (before,) = (await c.get("/api/fleet", headers=AUTH)).json()["factories"]
            await asyncio.wait_for(scanning.wait(), 10)
            # a change event heard meanwhile, newer than what the hanging scan read
            newer = dict(await reader.latest(unique_id))
            newer["updated_at"] = "2099-01-01T00:00:00.000Z"
            newer["risk"] = {**newer["risk"], "level": "CRITICAL", "score": 99.5}
            reader.note_latest(newer)
            screens = await asyncio.wait_for(
                asyncio.gather(*(c.get("/api/fleet", headers=AUTH) for _ in range(5))), 5
            )  # served from the cache while the scan hangs
            assert {r.json()["factories"][0]["score"] for r in screens} == {99.5}
            gate.set()
            await asyncio.sleep(0.5)  # the scan lands, and the next ones
            (after,) = (await c.get("/api/fleet", headers=AUTH)).json()["factories"]
            assert before["score"] != 99.5 and after["score"] == 99.5
        finally:
            gate.set()


async def test_nobody_looking_the_fleet_is_not_read(foundation: Foundation, unique_id: str) -> None:
    # idle after 3 s without a screen: room for several 0.2 s periods on a loaded machine
    app = fleet_app(foundation, cache_s=0.2, idle_s=3.0)
    reader = app.state.reader
    scan = reader.readmodel.factory_latest_items
    await seed(foundation, unique_id)
    scans = 0
    scanned = asyncio.Condition()

    async def counted() -> list[dict[str, Any]]:
        nonlocal scans
        items = await scan()
        async with scanned:
            scans += 1
            scanned.notify_all()
        return items

    async def scans_reach(n: int) -> None:
        async with scanned:
            await asyncio.wait_for(scanned.wait_for(lambda: scans >= n), 10)

    reader.readmodel.factory_latest_items = counted
    async with kept_warm(app) as c:
        await asyncio.sleep(1.0)  # five cache periods with no screen: nothing read
        assert scans == 0
        (entry,) = (await c.get("/api/fleet", headers=AUTH)).json()["factories"]
        assert entry["factory_id"] == unique_id
        await scans_reach(3)  # a screen asked: kept warm, re-read every period
        await asyncio.sleep(3.5)  # idle again once no screen asked for 3 s
        idle = scans
        await asyncio.sleep(1.0)
        assert scans == idle


@pytest.mark.parametrize(
    "path",
    [
        "/api/reports?date=0",  # pydantic alone would read seconds since 1970
        "/api/reports?date=2026-02-31",
        "/api/reports?date=29-11-2026",
        "/api/reports",
        "/api/reports/0/factory-a",
        "/api/reports/2026-13-01/factory-a",
        "/api/factories/factory-a/images?date=1700000000",
    ],
)
async def test_a_date_is_yyyy_mm_dd_or_422(client: httpx.AsyncClient, path: str) -> None:
    resp = await client.get(path, headers=AUTH)
    assert resp.status_code == 422, resp.text
