"""The dashboard page in headless Chromium (Debian's, driven by Playwright through its executable
path), served by the real app on a real HTTP server over a seeded read model in the emulator,
with live updates from real NATS: a CRITICAL state made by the processor from a raw message
reaches the open page without a reload. Also: no token, no data (page and event stream), a
token given in a link never reaches a log, the incidents as the people who answer them see
them (the list, a factory's banners, Acknowledge and Resolve, a cloud check's alerting state), and
the orchestration jobs (each example job drawn as a flow chart with every step and edge, a running
execution's steps changing state on the open page, no Enable or Disable for a viewer), on a clock
the test holds still."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import struct
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from faststream.nats import NatsBroker
from nats.js import JetStreamContext
from playwright.async_api import BrowserContext, Page, expect

from aegis_contracts import incidents, keys
from aegis_contracts.cloud import CheckAlerting, CheckState, CloudCheck, CloudSnapshot
from aegis_contracts.events import ChangeEvent, ObjectCreated, RawArchived, SystemEvent
from aegis_contracts.graph import LabelStats, RiskStats, SeriesStats, WindowStats
from aegis_contracts.ids import SourceType
from aegis_contracts.items import AlertState, Graph5m, Incident
from aegis_contracts.keys import ReportArtifact
from aegis_contracts.state import Level
from aegis_contracts.subjects import (
    change_subject,
    object_created_subject,
    raw_subject,
    system_subject,
)
from aegis_contracts.times import Clock, format_ts, kst_report_date, truncate_ms, utc_now
from aegis_dashboard_api import feed as feed_module
from aegis_dashboard_api.access import COOKIE, token_digest
from aegis_dashboard_api.app import create_app
from aegis_dashboard_api.settings import DashboardSettings
from aegis_devstack.localservers import ManagedServer, free_port
from aegis_devstack.testing.builders import FakeClock, seed_latest
from aegis_devstack.testing.storage import Foundation
from aegis_devstack.testing.waiting import eventually
from aegis_orchestration.graph import EdgeKind, graph
from aegis_orchestration.model import Job
from aegis_orchestration.store import JobStore
from aegis_orchestration.yamlio import load_jobs
from aegis_runtime.bus import create_broker, ensure_streams, publish
from aegis_runtime.health import PromptServer
from aegis_runtime.service import change_message, change_sink
from aegis_runtime.settings import AegisSettings
from aegis_storage.incidents import IncidentStore
from aegis_storage.items import Change
from aegis_storage.readmodel import ReadModel

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ARTIFACTS = Path(
    os.environ.get("AEGIS_TEST_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts")
)
TOKEN = "wall-screen-7f3a9c"
WATCHED = "factory-a"
GRAPH_BUCKETS = 70  # 5 h 50 min: all inside the 6 h window


@dataclass
class Dashboard:
    url: str
    app: Any
    server: PromptServer


@pytest.fixture
async def broker(nats_url: str) -> AsyncIterator[NatsBroker]:
    broker = create_broker(AegisSettings(nats_url=nats_url), name="dashboard-page-test")
    await broker.connect()
    await ensure_streams(broker)
    yield broker
    await broker.stop()


def dashboard_settings(
    foundation: Foundation, nats_url: str, aws_endpoint: str
) -> DashboardSettings:
    return DashboardSettings(
        aws_endpoint_url=aws_endpoint,
        bucket=foundation.bucket,
        table=foundation.table,
        nats_url=nats_url,
        dashboard_tokens=f"responder:{token_digest(TOKEN)}",  # acknowledges, resolves
        dashboard_live_ping_s=0.5,
        # the tests change incidents in the table directly, announced to no one: read often
        dashboard_incidents_refresh_s=2,
    )


@asynccontextmanager
async def serving(
    settings: DashboardSettings, foundation: Foundation, clock: Clock = utc_now
) -> AsyncIterator[Dashboard]:
    """The app on a real HTTP server (uvicorn, with its access log on), on ``clock``."""
    app = create_app(settings, clients=foundation.clients, clock=clock)
    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_config=None,
        access_log=True,
        timeout_graceful_shutdown=2,
    )
    server = PromptServer(config)
    task = asyncio.create_task(server.serve())
    await eventually(lambda: server.started, within=15, what="the dashboard serving")
    try:
        yield Dashboard(f"http://127.0.0.1:{port}", app, server)
    finally:
        app.state.hub.close()
        server.exit()
        await asyncio.wait_for(task, 30)


@pytest.fixture
async def dashboard(
    foundation: Foundation, nats_url: str, aws_endpoint: str
) -> AsyncIterator[Dashboard]:
    """The dashboard with its live feed subscribed on NATS."""
    async with serving(dashboard_settings(foundation, nats_url, aws_endpoint), foundation) as dash:
        await eventually(lambda: dash.app.state.feed.connected, within=15, what="the live feed")
        yield dash


# -- the read model: factory-a made by the processor, b and c and the graphs seeded -----------


def factory_body(
    sensors: dict[str, float], detections: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {"sensors": sensors, "ai": {"model_version": "yolo-8", "detections": detections or []}}


async def send_raw(
    foundation: Foundation,
    broker: NatsBroker,
    factory_id: str,
    body: dict[str, Any],
    *,
    mid: str,
    at: datetime,
) -> None:
    """What ingest does: archive the payload under raw/, then publish its RawArchived event."""
    envelope = {
        "message_id": mid,
        "factory_id": factory_id,
        "device_id": "edge-1",
        "emitted_at": at.isoformat(),
        "schema_version": "1.0",
    }
    payload = json.dumps({**envelope, **body}).encode()
    key = keys.raw_key(factory_id, "factory_state", at, mid)
    await foundation.store.put_immutable(key, payload)
    event = RawArchived(
        message_id=mid,
        factory_id=factory_id,
        source_type=SourceType.FACTORY_STATE,
        topic=f"aegis/{factory_id}/factory_state",
        bucket=foundation.bucket,
        key=key,
        received_at=at,
        size_bytes=len(payload),
        qos=1,
    )
    await publish(broker, raw_subject(factory_id, "factory_state"), event, msg_id=key)


def seeded_latest(
    level: str, score: float, reasons: list[dict[str, Any]], at: datetime
) -> dict[str, Any]:
    return {
        "risk": {"score": score, "level": level, "reasons": reasons, "rules_version": "test"},
        "pipeline_status": {"status": "OK", "checked_at": format_ts(at)},
        "factory_state": {
            "meta": {"message_id": "seed-1", "device_id": "edge-1", "emitted_at": format_ts(at)},
            "sensors": {"co_ppm": 60.0 if level == "WARNING" else 5.0, "temperature_c": 24.0},
            "detections": [],
        },
        "last_factory_state_at": format_ts(at),
        "updated_at": format_ts(at),
    }


async def seed_graphs(foundation: Foundation, factory_id: str, now: datetime) -> int:
    """GRAPH#5M buckets (what the aggregator writes) over the last ~6 hours."""
    end = now.replace(second=0, microsecond=0) - timedelta(minutes=now.minute % 5)
    count = 0
    for i in range(GRAPH_BUCKETS):
        start = end - timedelta(minutes=5 * (GRAPH_BUCKETS - i))
        co = 5.0 + (i % 12)
        stats = WindowStats(
            window_start=start,
            window_end=start + timedelta(minutes=5),
            samples=5,
            factory_records=5,
            infra_records=5,
            coverage=1.0,
            sensors={
                "co_ppm": SeriesStats(count=5, min=co - 1, max=co + 2, avg=co, last=co),
                "temperature_c": SeriesStats(count=5, min=23, max=25, avg=24, last=24),
            },
            detections={"no_helmet": LabelStats(count=1, max_confidence=0.7)} if i % 9 == 0 else {},
            risk=RiskStats(
                max_score=10.0 + (i % 12) * 3,
                mean_score=8.0,
                worst_level="NORMAL",
                seconds_at_level={"NORMAL": 300.0},
            ),
            infra={"cpu_pct": SeriesStats(count=5, min=20, max=40, avg=30 + i % 7, last=30)},
        )
        await foundation.readmodel.put_item(
            Graph5m(
                pk=keys.factory_pk(factory_id),
                sk=keys.graph_5m_sk(start),
                factory_id=factory_id,
                bucket_start=start,
                bucket_end=start + timedelta(minutes=5),
                stats=stats,
                ttl=int((now + timedelta(hours=48)).timestamp()),
            )
        )
        count += 1
    return count


@pytest.fixture
async def processor(broker: NatsBroker, run_processor: Any) -> AsyncIterator[Any]:
    """The real processor, its consumer filtered to factory-a (older factory-a raw events of this
    session's NATS are purged first: they belong to other tests' buckets)."""
    js: JetStreamContext = broker.connection.jetstream()
    await js.purge_stream("AEGIS_RAW", subject=f"aegis.raw.{WATCHED}.>")
    async with run_processor(f"aegis.raw.{WATCHED}.>") as app:
        yield app


async def level_of(foundation: Foundation, factory_id: str) -> str | None:
    item = await foundation.readmodel.get_latest(factory_id)
    return None if item is None else (item.get("risk") or {}).get("level")


# -- the browser ----------------------------------------------------------------------------


async def sign_in(page: Page, base: str, next_path: str = "/", token: str = TOKEN) -> None:
    await page.goto(f"{base}/login?next={next_path}")
    await page.fill("#token", token)
    await page.click("button[type=submit]")


def screenshot_path(name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS / name


async def test_fleet_charts_and_a_critical_state_arriving_live(
    foundation: Foundation,
    broker: NatsBroker,
    processor: Any,
    dashboard: Dashboard,
    browser: BrowserContext,
    unique_id: str,
) -> None:
    now = truncate_ms(datetime.now(UTC))
    await send_raw(
        foundation,
        broker,
        WATCHED,
        factory_body({"co_ppm": 4.0, "temperature_c": 23.5}),
        mid=f"m-{unique_id}-1",
        at=now - timedelta(seconds=5),
    )
    await seed_latest(
        foundation.readmodel,
        "factory-b",
        seeded_latest(
            "WARNING",
            40.0,
            [
                {
                    "code": "CO_HIGH",
                    "severity": "WARNING",
                    "detail": "co_ppm 60 >= 35",
                    "value": 60.0,
                }
            ],
            now - timedelta(seconds=3),
        ),
    )
    await seed_latest(
        foundation.readmodel,
        "factory-c",
        seeded_latest(
            "CRITICAL",
            90.0,
            [{"code": "FIRE_DETECTED", "severity": "CRITICAL", "detail": "fire 0.93 on cam-2"}],
            now - timedelta(seconds=2),
        ),
    )
    await seed_graphs(foundation, WATCHED, now)

    async def a_processed() -> bool:
        return await level_of(foundation, WATCHED) == "NORMAL"

    await eventually(a_processed, within=20, what="factory-a NORMAL through the processor")

    fleet = await browser.new_page()
    await sign_in(fleet, dashboard.url)
    await expect(fleet).to_have_url(f"{dashboard.url}/")
    for fid, level in (
        ("factory-a", "NORMAL"),
        ("factory-b", "WARNING"),
        ("factory-c", "CRITICAL"),
    ):
        tile = fleet.locator(f'#fleet .tile[data-factory="{fid}"]')
        await expect(tile).to_have_attribute("data-level", level)
        # the level is also written, not shown by colour alone
        await expect(tile.locator(".badge .lv-text")).to_have_text(level.capitalize())
    await expect(fleet.locator("#live")).to_have_attribute("data-state", "open")

    detail = await browser.new_page()
    await detail.goto(f"{dashboard.url}/factories/{WATCHED}?window=6h")
    await expect(detail.locator("#charts")).to_have_attribute("data-window", "6h")
    await expect(detail.locator("#chart-risk canvas")).to_have_count(1)
    points = await detail.wait_for_function(
        "() => { const u = window.AEGIS_CHARTS && window.AEGIS_CHARTS.risk;"
        " return u && u.data[0].length > 0 && u.data[1].filter(v => v !== null).length }"
    )
    assert await points.json_value() == GRAPH_BUCKETS  # every seeded bucket is drawn
    sensors = await detail.evaluate(
        "() => Object.keys(window.AEGIS_CHARTS).filter(k => k.startsWith('sensor:')).sort()"
    )
    assert sensors == ["sensor:co_ppm", "sensor:temperature_c"]
    await expect(detail.locator("#live")).to_have_attribute("data-state", "open")
    six_hours = screenshot_path("dashboard-factory-a-6h.png")
    await detail.screenshot(path=str(six_hours), full_page=True)
    print(f"screenshot: {six_hours}")
    # the window switch without a reload: 1 h is HISTORY#STATE, the processor's one state so far
    await detail.click('.win[data-window="1h"]')
    await expect(detail).to_have_url(f"{dashboard.url}/factories/{WATCHED}?window=1h")
    await detail.wait_for_function(
        "() => { const u = window.AEGIS_CHARTS.risk; return u && u.data[0].length === 1 }"
    )

    # a fire on factory-a: through ingest's path and the processor into LATEST and the change
    # event; the open pages change within 3 s, without a reload
    marker = await fleet.evaluate("() => (window.__not_reloaded = true)")
    await detail.evaluate("() => (window.__not_reloaded = true)")
    sent = time.monotonic()
    await send_raw(
        foundation,
        broker,
        WATCHED,
        factory_body(
            {"co_ppm": 5.0, "temperature_c": 24.0},
            [{"label": "fire", "confidence": 0.92, "camera_id": "cam-1"}],
        ),
        mid=f"m-{unique_id}-2",
        at=truncate_ms(datetime.now(UTC)),
    )
    tile = fleet.locator(f'#fleet .tile[data-factory="{WATCHED}"]')
    await expect(tile).to_have_attribute("data-level", "CRITICAL", timeout=3000)
    print(f"CRITICAL on the open fleet page {time.monotonic() - sent:.2f} s after the raw event")
    await expect(tile.locator(".reasons")).to_contain_text("FIRE_DETECTED")
    await expect(detail.locator("#factory")).to_have_attribute(
        "data-level", "CRITICAL", timeout=3000
    )
    await expect(detail.locator("#factory .fh-reasons")).to_contain_text("FIRE_DETECTED")
    # the new state is the 1 h chart's next point (a LATEST is the next HISTORY#STATE item)
    last_score = await detail.wait_for_function(
        "() => { const u = window.AEGIS_CHARTS.risk;"
        " return u && u.data[0].length === 2 && u.data[1][1] }"
    )
    assert await last_score.json_value() >= 60
    assert marker is True
    assert await fleet.evaluate("() => window.__not_reloaded") is True
    assert await detail.evaluate("() => window.__not_reloaded") is True
    await expect(fleet.locator('[data-count="CRITICAL"]')).to_have_text("2")

    for page, name in ((fleet, "dashboard-fleet.png"), (detail, "dashboard-factory-a-1h.png")):
        path = screenshot_path(name)
        await page.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 10_000
        print(f"screenshot: {path}")
    # responsive: on a phone nothing runs off the side of the screen
    for page, name in (
        (fleet, "dashboard-fleet-phone.png"),
        (detail, "dashboard-factory-a-phone.png"),
    ):
        await page.set_viewport_size({"width": 390, "height": 844})
        # the charts redraw to the new width (debounced)
        await page.wait_for_function("() => document.documentElement.scrollWidth <= 390")
        await page.screenshot(path=str(screenshot_path(name)), full_page=True)


def png(width: int, height: int) -> bytes:
    """A small real PNG (what a camera frame would be, for the browser to decode)."""
    rows = b"".join(b"\x00" + bytes([200, 40, 40]) * width for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


async def test_the_alert_link_opens_the_factory_with_its_image_and_alerts_in_korean(
    foundation: Foundation, dashboard: Dashboard, browser: BrowserContext
) -> None:
    now = truncate_ms(datetime.now(UTC))
    image_key = keys.image_snapshot_key("factory-b", now, "cam-3.png")
    await foundation.store.put_bytes(image_key, png(64, 48), content_type="image/png")
    latest = seeded_latest("WARNING", 40.0, [], now - timedelta(seconds=3))
    latest["latest_image_snapshot"] = {
        "s3_key": image_key,
        "camera_id": "cam-3",
        "content_type": "image/png",
        "captured_at": format_ts(now),
    }
    await seed_latest(foundation.readmodel, "factory-b", latest)
    for scope in ("factory-b", "factory-c"):
        await foundation.readmodel.put_item(
            AlertState(
                pk=keys.alert_pk(scope),
                sk=keys.alert_sk("WARNING", "CO_HIGH", "STATE"),
                scope=scope,
                severity="WARNING",
                reason="CO_HIGH",
                status="STATE",
                firing=True,
                fired_at=now,
                ttl=int(now.timestamp()) + 3600,
            )
        )
    page = await browser.new_page()
    # the alert dispatcher's link: {AEGIS_DASHBOARD_URL}/factories/{f}
    resp = await page.goto(f"{dashboard.url}/factories/factory-b?lang=ko")
    assert resp is not None and resp.status == 401
    await expect(page.locator("h1")).to_have_text("로그인")
    await page.fill("#token", TOKEN)
    await page.click("button[type=submit]")
    await expect(page).to_have_url(f"{dashboard.url}/factories/factory-b?lang=ko")
    await expect(page.locator("#factory h1")).to_have_text("factory-b")
    await expect(page.locator("#factory .badge .lv-text").first).to_have_text("주의")
    updated = page.locator("#factory .updated time")
    assert (await updated.get_attribute("title") or "").endswith("Z UTC")
    assert "KST" in await updated.inner_text()
    # the camera image through its presigned URL (the page's CSP lets the bucket's origin in)
    image = page.locator("#camera img")
    await expect(image).to_have_count(1)
    await page.wait_for_function(
        "() => { const i = document.querySelector('#camera img'); return i && i.complete }"
    )
    assert await image.evaluate("i => [i.naturalWidth, i.naturalHeight]") == [64, 48]
    # this factory's open alerts only, the level written as well as coloured
    alerts = page.locator("#alerts li.alert")
    await expect(alerts).to_have_count(1)
    await expect(alerts).to_contain_text("CO_HIGH")
    await expect(alerts).to_contain_text("주의")
    path = screenshot_path("dashboard-factory-b-ko.png")
    await page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


@pytest.mark.parametrize(
    "auth",
    [
        {},
        {"headers": {"Authorization": "Bearer wrong"}},
        {"cookies": {COOKIE: "wrong"}},
        {"params": {"token": "wrong"}},
        {"cookies": {COOKIE: token_digest(TOKEN)}},  # the digest is not the token
    ],
)
async def test_without_a_valid_token_the_page_and_the_stream_are_401_without_data(
    foundation: Foundation, dashboard: Dashboard, auth: dict[str, Any]
) -> None:
    now = truncate_ms(datetime.now(UTC))
    secret = "smoke seen at line 7 by cam-9"
    reasons = [{"code": "SMOKE_DETECTED", "severity": "CRITICAL", "detail": secret}]
    await seed_latest(
        foundation.readmodel, "factory-c", seeded_latest("CRITICAL", 91.0, reasons, now)
    )
    async with httpx.AsyncClient(base_url=dashboard.url, cookies=auth.get("cookies")) as client:
        kwargs = {k: v for k, v in auth.items() if k != "cookies"}
        for path in ("/", "/factories/factory-c", "/cloud", "/reports", "/api/live", "/api/fleet"):
            resp = await client.get(path, **kwargs)
            assert resp.status_code == 401, path
            # nothing of the read model: (the sign-in form names the page it returns to)
            assert secret not in resp.text and "SMOKE_DETECTED" not in resp.text, path
            assert "91" not in resp.text, path


async def test_the_event_stream_retry_heartbeat_snapshot_and_last_event_id(
    foundation: Foundation, dashboard: Dashboard
) -> None:
    now = truncate_ms(datetime.now(UTC))
    await seed_latest(foundation.readmodel, "factory-c", seeded_latest("CRITICAL", 90.0, [], now))
    headers = {"Authorization": f"Bearer {TOKEN}", "Last-Event-ID": "0a1b2c-41"}
    seen: list[str] = []
    async with (
        httpx.AsyncClient(base_url=dashboard.url, timeout=10) as client,
        client.stream("GET", "/api/live", headers=headers) as resp,
    ):
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["cache-control"] == "no-store"
        async for line in resp.aiter_lines():
            seen.append(line)
            if line.startswith(": ping"):
                break
    assert "retry: 3000" in seen
    events = [line.removeprefix("event: ") for line in seen if line.startswith("event: ")]
    assert events[:3] == ["fleet", "alerts", "cloud"]
    fleet = json.loads(seen[seen.index("event: fleet") + 1].removeprefix("data: "))
    assert [f["factory_id"] for f in fleet["factories"]] == ["factory-c"]


async def test_a_token_in_a_link_becomes_the_cookie_and_is_never_logged(
    dashboard: Dashboard, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    for server_logger in ("uvicorn", "uvicorn.access", "uvicorn.error", "sse_starlette", "aegis"):
        caplog.set_level(logging.DEBUG, logger=server_logger)
    # this test's own HTTP client logs the URLs it requests (at INFO, when an earlier test left the
    # root logger there): those lines are the browser's side, not the dashboard's
    client_logs = [logging.getLogger(name) for name in ("httpx", "httpcore")]
    levels = [log.level for log in client_logs]
    for log in client_logs:
        log.setLevel(logging.WARNING)
    try:
        await _follow_a_token_link(dashboard)
    finally:
        for log, level in zip(client_logs, levels, strict=True):
            log.setLevel(level)
    out, err = capfd.readouterr()
    logged = out + err + "\n".join(r.getMessage() for r in caplog.records)
    access = [r.getMessage() for r in caplog.records if r.name == "uvicorn.access"]
    assert any("/factories/factory-x" in line for line in access)  # requests were logged
    assert TOKEN not in logged
    assert "not-it" not in logged


async def _follow_a_token_link(dashboard: Dashboard) -> None:
    async with httpx.AsyncClient(base_url=dashboard.url) as client:
        resp = await client.get("/factories/factory-x", params={"token": TOKEN, "window": "6h"})
        assert resp.status_code == 303
        assert resp.headers["location"] == "/factories/factory-x?window=6h"
        assert TOKEN not in resp.headers["location"]
        cookie = resp.headers["set-cookie"]
        assert cookie.startswith(f"{COOKIE}={TOKEN};")
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie
        # with the cookie: the page (an unknown factory is a 404 page, not the sign-in form)
        page = await client.get("/factories/factory-x?window=6h")
        assert page.status_code == 404
        bad = await client.get("/", params={"token": "not-it"})
        assert bad.status_code == 200  # the valid cookie still counts; the bad link is dropped


async def test_cloud_panel_with_each_check_and_its_history_and_a_report(
    foundation: Foundation, dashboard: Dashboard, browser: BrowserContext
) -> None:
    now = truncate_ms(datetime.now(UTC))
    ttl = int((now + timedelta(hours=6)).timestamp())
    for minutes_ago in range(30, -1, -1):
        at = now - timedelta(minutes=minutes_ago)
        lag = 1500.0 if minutes_ago < 3 else 10.0
        checks = [
            CloudCheck.ok("storage_canary", value=42.0, unit="ms"),
            CloudCheck(
                name="consumer_lag:AEGIS_RAW/processor",
                status=Level.WARNING if lag > 1000 else Level.NORMAL,
                reason="CONSUMER_LAG" if lag > 1000 else "OK",
                value=lag,
                unit="msgs",
                threshold=1000.0,
                detail="num_pending",
            ),
        ]
        await foundation.readmodel.apply_cloud(CloudSnapshot.of("fast", at, checks), ttl=ttl)
    day = kst_report_date(now - timedelta(days=1))
    report = "# factory-a daily report\n\n| hour | risk |\n|---|---|\n| 09 | 40 |\n\n<b>raw</b>\n"
    await foundation.store.put_bytes(
        keys.report_key(day, "factory-a", ReportArtifact.REPORT),
        report.encode(),
        content_type="text/markdown",
    )
    page = await browser.new_page()
    await sign_in(page, dashboard.url, "/cloud")
    await expect(page).to_have_url(f"{dashboard.url}/cloud")
    await expect(page.locator("#cloud-overall .badge")).to_have_attribute("data-level", "WARNING")
    lag_row = page.locator('[data-tier="fast"] tr[data-check="consumer_lag:AEGIS_RAW/processor"]')
    await expect(lag_row.locator(".badge")).to_have_attribute("data-level", "WARNING")
    await expect(lag_row).to_contain_text("CONSUMER_LAG")
    # the history strip: one mark per run, the last three at WARNING
    await expect(lag_row.locator(".run")).to_have_count(31)
    await expect(lag_row.locator(".run.lv-warning")).to_have_count(3)
    first = await lag_row.locator(".run").first.get_attribute("title") or ""
    assert "KST" in first and "Z UTC" in first
    await page.screenshot(path=str(screenshot_path("dashboard-cloud.png")), full_page=True)

    await page.goto(f"{dashboard.url}/reports")  # yesterday (KST) by default
    await page.click("text=factory-a")
    await expect(page.locator("#report h1")).to_have_text("factory-a daily report")
    await expect(page.locator("#report table td").first).to_have_text("09")
    assert "<b>raw</b>" in await page.locator("#report").inner_text()  # escaped, not HTML
    await page.screenshot(path=str(screenshot_path("dashboard-report.png")), full_page=True)


async def read_events(
    lines: AsyncIterator[str], wanted: set[str], seen: dict[str, list[Any]]
) -> None:
    """Collect events by name from an open stream until every ``wanted`` name has arrived."""
    name = None
    async for line in lines:
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: ") and name:
            seen.setdefault(name, []).append(json.loads(line.removeprefix("data: ")))
            if wanted <= set(seen):
                return


async def test_the_feed_relays_cloud_alert_graph_and_report_events(
    foundation: Foundation, broker: NatsBroker, dashboard: Dashboard
) -> None:
    now = truncate_ms(datetime.now(UTC))
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with (
        httpx.AsyncClient(base_url=dashboard.url, timeout=10) as client,
        client.stream("GET", "/api/live", headers=headers) as resp,
    ):
        lines = resp.aiter_lines()
        snapshot: dict[str, list[Any]] = {}
        await read_events(lines, {"fleet", "alerts", "cloud"}, snapshot)
        assert snapshot["cloud"] == [{"latest": None}] and snapshot["alerts"] == [{"alerts": []}]
        # what the collectors, the dispatcher, the aggregator and the reporter write and announce
        snap = CloudSnapshot.of("fast", now, [CloudCheck.ok("storage_canary", value=3.0)])
        await foundation.readmodel.apply_cloud(snap, ttl=int(now.timestamp()) + 3600)
        alert = AlertState(
            pk=keys.alert_pk("factory-a"),
            sk=keys.alert_sk("CRITICAL", "FIRE_DETECTED", "STATE"),
            scope="factory-a",
            severity="CRITICAL",
            reason="FIRE_DETECTED",
            status="STATE",
            firing=True,
            fired_at=now,
            ttl=int(now.timestamp()) + 3600,
        )
        await foundation.readmodel.put_item(alert)
        graph_key = "processed_agg/factory-a/metrics_5m/yyyy=2026/mm=11/dd=30/hh=03/mm=05.json"
        announcements = [
            ("cloud_infra", foundation.bucket, "processed/cloud_infra/fast/yyyy=2026/x.json"),
            ("metrics_5m", "another-bucket", graph_key.replace("factory-a", "factory-z")),
            ("metrics_5m", foundation.bucket, graph_key),
            (
                "reports",
                foundation.bucket,
                "reports/daily/yyyy=2026/mm=11/dd=29/factory-a/report.md",
            ),
        ]
        for family, bucket, key in announcements:
            created = ObjectCreated(
                bucket=bucket, key=key, size_bytes=1, producer="test", created_at=now
            )
            await publish(broker, object_created_subject(family), created, msg_id=f"{bucket}/{key}")
        sent = SystemEvent(kind="alert_sent", producer="alert-dispatcher", at=now)
        await publish(broker, system_subject("alert_sent"), sent, msg_id=f"alert-{now}")
        live: dict[str, list[Any]] = {}
        await asyncio.wait_for(
            read_events(lines, {"cloud", "alerts", "graph", "reports"}, live), 10
        )
    assert live["cloud"][0]["latest"]["overall_status"] == "NORMAL"
    assert [a["reason"] for a in live["alerts"][0]["alerts"]] == ["FIRE_DETECTED"]
    assert live["graph"] == [{"target": "factory-a", "key": graph_key}]  # not another bucket's
    assert live["reports"][0]["target"] == "factory-a"


async def test_without_nats_the_page_serves_and_stops(
    foundation: Foundation, aws_endpoint: str
) -> None:
    settings = dashboard_settings(foundation, f"nats://127.0.0.1:{free_port()}", aws_endpoint)
    now = truncate_ms(datetime.now(UTC))
    await seed_latest(foundation.readmodel, "factory-a", seeded_latest("NORMAL", 0.0, [], now))
    async with serving(settings, foundation) as dash:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=dash.url, headers=headers, timeout=10) as client:
            page = await client.get("/")
            assert page.status_code == 200 and 'data-factory="factory-a"' in page.text
            async with client.stream("GET", "/api/live") as resp:
                seen: dict[str, list[Any]] = {}
                await read_events(resp.aiter_lines(), {"fleet"}, seen)
        assert seen["fleet"][0]["factories"][0]["factory_id"] == "factory-a"
        assert not dash.app.state.feed.connected


async def test_after_a_nats_restart_every_screen_gets_the_state_again(
    foundation: Foundation, aws_endpoint: str, private_nats: ManagedServer
) -> None:
    now = truncate_ms(datetime.now(UTC))
    await seed_latest(foundation.readmodel, "factory-a", seeded_latest("NORMAL", 0.0, [], now))
    settings = dashboard_settings(foundation, private_nats.url, aws_endpoint)
    async with serving(settings, foundation) as dash:
        feed = dash.app.state.feed
        await eventually(lambda: feed.connected, within=15, what="the live feed")
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with (
            httpx.AsyncClient(base_url=dash.url, timeout=20) as client,
            client.stream("GET", "/api/live", headers=headers) as resp,
        ):
            lines = resp.aiter_lines()
            await read_events(lines, {"fleet", "alerts", "cloud"}, {})
            # while NATS is away the state changes (its change event is lost with it)
            await asyncio.to_thread(private_nats.stop)
            later = seeded_latest("WARNING", 40.0, [], now + timedelta(seconds=1))
            await seed_latest(foundation.readmodel, "factory-a", later)
            dash.app.state.reader._fleet_read_at = 0.0  # the fleet cache period has passed
            await asyncio.to_thread(private_nats.restart)
            again: dict[str, list[Any]] = {}
            await asyncio.wait_for(read_events(lines, {"fleet", "resync"}, again), 20)
        assert again["fleet"][0]["factories"][0]["level"] == "WARNING"
        assert feed.connected


@pytest.mark.parametrize(
    ("form", "headers", "status"),
    [
        ({"token": TOKEN, "next": "/cloud"}, {}, 303),
        ({"token": "wrong", "next": "/cloud"}, {}, 401),
        ({"token": "", "next": "/"}, {}, 401),
        ({"next": "/"}, {}, 401),
        ({"token": TOKEN, "next": "https://evil.example/"}, {}, 303),  # sent home instead
        ({"token": TOKEN}, {"Origin": "https://evil.example"}, 403),
        ({"token": TOKEN}, {"Origin": "null", "Sec-Fetch-Site": "cross-site"}, 403),
        (
            {"token": TOKEN, "next": "/cloud"},
            {"Origin": "null", "Sec-Fetch-Site": "same-origin"},
            303,
        ),
    ],
)
async def test_the_sign_in_form(
    dashboard: Dashboard, form: dict[str, str], headers: dict[str, str], status: int
) -> None:
    async with httpx.AsyncClient(base_url=dashboard.url) as client:
        resp = await client.post("/login", data=form, headers=headers)
    assert resp.status_code == status
    if status == 303:
        assert resp.headers["location"] == ("/cloud" if form["next"] == "/cloud" else "/")
        assert resp.headers["set-cookie"].startswith(f"{COOKIE}={TOKEN};")
    else:
        assert "set-cookie" not in resp.headers


# -- incidents ----------------------------------------------------------------------------------

ME = f"token:{token_digest(TOKEN)[:8]}"  # who this test's token is to the dashboard


@pytest.fixture
async def clocked(
    foundation: Foundation, nats_url: str, aws_endpoint: str, broker: NatsBroker
) -> AsyncIterator[tuple[Dashboard, FakeClock]]:
    """The dashboard (live feed on) on a clock that stands still where the test put it, on a bus
    whose streams exist (``broker`` makes them) as bootstrap leaves them: what it announces is
    stored, not left waiting for a stream that is not there."""
    clock = FakeClock(truncate_ms(datetime.now(UTC)))
    settings = dashboard_settings(foundation, nats_url, aws_endpoint)
    async with serving(settings, foundation, clock) as dash:
        await eventually(lambda: dash.app.state.feed.connected, within=15, what="the live feed")
        yield dash, clock


async def seed_incident(
    foundation: Foundation,
    scope: str,
    reason: str,
    severity: incidents.Severity,
    at: datetime,
    *,
    detail: str = "",
    acked_by: str | None = None,
    notified: bool = False,
) -> Incident:
    """An open incident as the dispatcher stores it (acknowledged in Slack, notified, if asked)."""
    item = incidents.open_incident(
        scope=scope, stream="STATE", reason=reason, severity=severity, at=at, detail=detail
    )
    if notified:
        item = incidents.notified(
            item, at=at + timedelta(seconds=2), receiver="oncall-slack", outcome="sent"
        )
    if acked_by is not None:
        acked = incidents.acknowledge(item, by=acked_by, via="slack", at=at + timedelta(minutes=5))
        assert acked is not None
        item = acked
    await IncidentStore(foundation.readmodel).save(item, None)
    return item


async def stored(foundation: Foundation, incident: Incident) -> Incident:
    found = await IncidentStore(foundation.readmodel).get(incident.incident_id)
    assert found is not None
    return found


async def closed_by_the_data(foundation: Foundation, incident: Incident, at: datetime) -> None:
    """What the dispatcher does when the data no longer reports it."""
    await IncidentStore(foundation.readmodel).change(
        incident.incident_id, lambda i: incidents.resolve(i, at=at)
    )


def card(page: Page, incident: Incident) -> Any:
    return page.locator(f'#incidents > [data-incident="{incident.incident_id}"]')


async def shown_ids(page: Page) -> list[str]:
    ids = await page.locator("#incidents > [data-incident]").evaluate_all(
        "rows => rows.map(r => r.dataset.incident)"
    )
    return [str(i) for i in ids]


async def test_the_incidents_page_worst_first_acknowledge_resolve_and_kept_current(
    foundation: Foundation, clocked: tuple[Dashboard, FakeClock], browser: BrowserContext
) -> None:
    dash, clock = clocked
    now = clock()
    device_text = 'co_ppm 60 >= 35 <img src=x onerror="window.__pwned=1">'
    warn_old = await seed_incident(
        foundation, "factory-b", "CO_HIGH", "WARNING", now - timedelta(hours=3), detail=device_text
    )
    crit_new = await seed_incident(
        foundation, "factory-c", "FIRE_DETECTED", "CRITICAL", now - timedelta(minutes=30)
    )
    crit_old = await seed_incident(
        foundation, "factory-a", "GAS_LEAK", "CRITICAL", now - timedelta(hours=2), notified=True
    )
    warn_acked = await seed_incident(
        foundation,
        "factory-d",
        "NO_HELMET",
        "WARNING",
        now - timedelta(hours=1),
        acked_by="slack:kim",
    )
    # the page's timers on a clock the test can move ahead (it runs on its own otherwise)
    await browser.clock.install()
    page = await browser.new_page()
    await sign_in(page, dash.url, "/incidents")
    await expect(page).to_have_url(f"{dash.url}/incidents")
    await expect(page.locator('nav a[href="/incidents"]')).to_have_attribute("aria-current", "page")
    # worst first: CRITICAL before WARNING, then the oldest
    await expect(page.locator("#incidents > [data-incident]")).to_have_count(4)
    assert await shown_ids(page) == [
        i.incident_id for i in (crit_old, crit_new, warn_old, warn_acked)
    ]
    await expect(page.locator('#incidents-summary [data-count="CRITICAL"]')).to_have_text("2")
    first = card(page, crit_old)
    await expect(first.locator(".badge .lv-text")).to_have_text("Critical")
    await expect(first.locator("a.scope")).to_have_attribute("href", "/factories/factory-a")
    await expect(first.locator("code")).to_have_text("GAS_LEAK")
    await expect(first.locator(".state")).to_have_attribute("data-state", "triggered")
    await expect(first.locator(".since")).to_have_text("2 h")  # on the dashboard's clock
    await expect(first.locator(".inc-level")).to_have_text("0")
    await expect(first.locator(".acked")).to_have_text("Nobody yet")
    slack = card(page, warn_acked)
    await expect(slack.locator(".state")).to_have_attribute("data-state", "acknowledged")
    await expect(slack.locator(".acked")).to_contain_text("slack:kim")
    await expect(slack.locator('form[data-action="ack"]')).to_have_count(0)
    # what a device wrote is shown as text, never as markup
    await expect(card(page, warn_old).locator(".inc-detail")).to_have_text(device_text)
    assert await page.locator("#incidents img").count() == 0
    assert await page.evaluate("() => window.__pwned") is None
    # the timeline: time, what, who, via, receiver, outcome
    await first.locator("details.timeline summary").click()
    lines = first.locator(".tl tbody tr")
    await expect(lines).to_have_count(2)
    await expect(lines.nth(0)).to_have_attribute("data-kind", "triggered")
    await expect(lines.nth(1).locator("td")).to_have_text(
        [re.compile("KST"), "Notified · level 0", "aegis", "data", "oncall-slack", "sent"]
    )
    await page.screenshot(path=str(screenshot_path("dashboard-incidents.png")), full_page=True)

    # Acknowledge, with a note: the card says so at once, and the stored incident is changed
    ack = first.locator('form[data-action="ack"]')
    await ack.locator('input[name="note"]').fill("on my way")
    await ack.locator("button").click()
    await expect(first.locator(".outcome")).to_have_text(f"Acknowledged by {ME}", timeout=15_000)
    await expect(first.locator(".state")).to_have_attribute("data-state", "acknowledged")
    await expect(first.locator(".acked")).to_contain_text(ME)
    await expect(first.locator('form[data-action="ack"]')).to_have_count(0)
    now_stored = await stored(foundation, crit_old)
    assert now_stored.state == "acknowledged" and now_stored.acknowledged_by == ME
    assert now_stored.acknowledged_via == "dashboard"
    assert now_stored.timeline[-1].detail == "on my way"
    # the next read brings the card with its new timeline line; the timeline stays open
    await expect(first.locator(".tl tbody tr")).to_have_count(3, timeout=15_000)
    await expect(first.locator("details.timeline")).to_have_attribute("open", "")
    await expect(first.locator(".outcome")).to_have_text(f"Acknowledged by {ME}")

    # Resolve without a note is refused in the page: nothing is sent
    posted: list[str] = []
    page.on("request", lambda r: posted.append(r.url) if r.method == "POST" else None)
    second = card(page, crit_new)
    resolve = second.locator('form[data-action="resolve"]')
    await resolve.locator('input[name="note"]').fill("   ")
    await resolve.locator("button").click()
    await expect(second.locator(".outcome")).to_have_text(
        "Write a note saying why before resolving."
    )
    await expect(resolve.locator("input")).to_have_attribute("aria-invalid", "true")
    await expect(resolve.locator("input")).to_be_focused()
    assert posted == []
    assert (await stored(foundation, crit_new)).version == crit_new.version
    # with a note it is resolved, says so, and leaves the list a moment later
    await resolve.locator('input[name="note"]').fill("false alarm: the lens was cleaned")
    await resolve.locator("button").click()
    # (a write through the emulator: it may wait behind the other worker's requests)
    await expect(second.locator(".outcome")).to_have_text(
        f"Resolved by {ME}: it leaves the list", timeout=15_000
    )
    closed = await stored(foundation, crit_new)
    assert (
        closed.state == "resolved" and closed.resolution_note == "false alarm: the lens was cleaned"
    )
    assert closed.resolved_by == ME
    # a read of the list without it (the summary comes from that read) leaves the card and what
    # it says a while, so the person reads it; a read after that takes it away
    await page.evaluate("() => document.dispatchEvent(new Event('visibilitychange'))")
    await expect(page.locator('#incidents-summary [data-count="CRITICAL"]')).to_have_text(
        "1", timeout=15_000
    )
    assert await second.count() == 1
    assert (await second.locator(".outcome").text_content() or "").startswith(f"Resolved by {ME}")
    # past the while (10 s, KEEP_RESOLVED_MS in app.js), without waiting it out
    await page.clock.fast_forward("00:11")
    await expect(second).to_have_count(0, timeout=15_000)

    # the list stays current without a reload: one is closed by the data, one opens
    await page.evaluate("() => (window.__not_reloaded = true)")
    await closed_by_the_data(foundation, warn_old, now)
    smoke = await seed_incident(
        foundation, "factory-e", "SMOKE_DETECTED", "CRITICAL", now - timedelta(minutes=1)
    )
    await expect(card(page, smoke)).to_have_count(1, timeout=15_000)
    await expect(card(page, warn_old)).to_have_count(0, timeout=15_000)
    assert await shown_ids(page) == [i.incident_id for i in (crit_old, smoke, warn_acked)]
    assert await page.evaluate("() => window.__not_reloaded") is True

    # on a phone nothing runs off the side
    await page.set_viewport_size({"width": 390, "height": 844})
    await page.wait_for_function("() => document.documentElement.scrollWidth <= 390")
    await page.screenshot(
        path=str(screenshot_path("dashboard-incidents-phone.png")), full_page=True
    )


async def test_the_list_the_page_reads_again_is_signed_in_escaped_and_under_the_csp(
    foundation: Foundation, clocked: tuple[Dashboard, FakeClock]
) -> None:
    dash, clock = clocked
    now = clock()
    gas = await seed_incident(
        foundation,
        "factory-a",
        "GAS_LEAK",
        "CRITICAL",
        now - timedelta(minutes=90),
        detail='<script>alert("x")</script>',
    )
    other = await seed_incident(foundation, "factory-b", "CO_HIGH", "WARNING", now)
    async with httpx.AsyncClient(base_url=dash.url) as client:
        signed_out = await client.get("/incidents/list")
        assert signed_out.status_code == 401
        assert gas.incident_id not in signed_out.text and "GAS_LEAK" not in signed_out.text
        headers = {"Authorization": f"Bearer {TOKEN}"}
        banners = await client.get(
            "/incidents/list", params={"view": "banners", "factory": "factory-a"}, headers=headers
        )
    assert banners.status_code == 200
    assert "script-src 'self'" in banners.headers["content-security-policy"]
    assert f'data-incident="{gas.incident_id}"' in banners.text
    assert other.incident_id not in banners.text  # another factory's
    assert "<script>alert" not in banners.text and "&lt;script&gt;" in banners.text
    assert ">1 h 30 min<" in banners.text  # on the dashboard's clock
    assert f'data-now="{format_ts(now)}"' in banners.text


async def test_an_acknowledgement_made_elsewhere_reaches_an_open_list_on_the_live_stream(
    foundation: Foundation,
    nats_url: str,
    aws_endpoint: str,
    broker: NatsBroker,
    browser: BrowserContext,
) -> None:
    """The list is not read again on a timer here (every 5 minutes): what brings the change is
    the incident's change event, announced as the dispatcher, the CLI and the dashboards do."""
    clock = FakeClock(truncate_ms(datetime.now(UTC)))
    settings = dashboard_settings(foundation, nats_url, aws_endpoint).model_copy(
        update={"dashboard_incidents_refresh_s": 300}
    )
    async with serving(settings, foundation, clock) as dash:
        await eventually(lambda: dash.app.state.feed.connected, within=15, what="the live feed")
        gas = await seed_incident(foundation, "factory-a", "GAS_LEAK", "CRITICAL", clock())
        page = await browser.new_page()
        reads: list[str] = []
        page.on("request", lambda r: reads.append(r.url) if "/incidents/list" in r.url else None)
        await sign_in(page, dash.url, "/incidents")
        await expect(page.locator("#live")).to_have_attribute("data-state", "open")
        await expect(card(page, gas).locator(".state")).to_have_attribute("data-state", "triggered")
        assert reads == []
        announced = IncidentStore(
            ReadModel(
                foundation.clients.items,
                foundation.table,
                changes=change_sink(broker, AegisSettings(service="alert-dispatcher")),
            )
        )
        await announced.change(
            gas.incident_id,
            lambda i: incidents.acknowledge(i, by="cli:kim", via="cli", at=clock(), note=None),
        )
        await expect(card(page, gas).locator(".state")).to_have_attribute(
            "data-state", "acknowledged", timeout=10_000
        )
        await expect(card(page, gas).locator(".acked")).to_contain_text("cli:kim")
        assert len(reads) >= 1  # read because it heard the change


def lost_announcements(dash: Dashboard) -> float:
    """``aegis_dashboard_change_events_lost_total`` as the dashboard's /metrics says it."""
    text = dash.app.state.metrics.metrics.render().decode()
    found = re.search(r"^aegis_dashboard_change_events_lost_total (\S+)$", text, re.MULTILINE)
    assert found is not None, "the lost-announcements counter is not exposed"
    return float(found.group(1))


async def incident_changes(bus: NatsBroker, incident: Incident) -> list[str]:
    """The states of the incident's changes on the events stream, in the order stored."""
    js: JetStreamContext = bus.connection.jetstream()
    sub = await js.pull_subscribe(change_subject("incident"), stream="AEGIS_EVENTS")
    states = []
    try:
        for msg in await sub.fetch(100, timeout=2):
            change = ChangeEvent.model_validate_json(msg.data)
            if (change.new_image or {}).get("incident_id") == incident.incident_id:
                states.append(str(change.new_image["state"]))  # type: ignore[index]
    finally:
        await sub.unsubscribe()
    return states


@dataclass
class FrozenBus:
    """A NATS of the test's own (its streams made) that the test freezes (SIGSTOP) and thaws,
    a dashboard on it, and an open incident to act on."""

    server: ManagedServer
    bus: NatsBroker
    dash: Dashboard
    incident: Incident

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        pid = self.server.process.pid  # type: ignore[union-attr]
        os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(pid, signal.SIGCONT)

    async def post(self, action: str, note: str | None = None) -> httpx.Response:
        async with httpx.AsyncClient(timeout=60) as http:
            return await http.post(
                f"{self.dash.url}/api/incidents/{self.incident.incident_id}/{action}",
                headers={"Authorization": f"Bearer {TOKEN}"},
                json={"note": note},
            )


@pytest.fixture
async def frozen_bus(
    private_nats: ManagedServer, foundation: Foundation, aws_endpoint: str
) -> AsyncIterator[FrozenBus]:
    bus = create_broker(AegisSettings(nats_url=private_nats.url), name="frozen-bus-test")
    await bus.connect()
    await ensure_streams(bus)
    clock = FakeClock(truncate_ms(datetime.now(UTC)))
    settings = dashboard_settings(foundation, private_nats.url, aws_endpoint)
    try:
        async with serving(settings, foundation, clock) as dash:
            await eventually(lambda: dash.app.state.feed.connected, within=15, what="the feed")
            gas = await seed_incident(foundation, "factory-a", "GAS_LEAK", "CRITICAL", clock())
            yield FrozenBus(private_nats, bus, dash, gas)
    finally:
        await bus.stop()


async def test_an_acknowledge_and_a_resolve_are_answered_while_the_bus_is_frozen_and_announced_in_order_after(
    foundation: Foundation, frozen_bus: FrozenBus
) -> None:
    """A person acknowledging never waits for NATS: with the server frozen (connected, taking
    nothing), both writes are answered while their announcements are still outstanding; once
    it thaws, both are announced, in the order they were made, none lost."""
    feed = frozen_bus.dash.app.state.feed
    with frozen_bus.frozen():
        acked = await frozen_bus.post("ack", "on my way")
        resolved = await frozen_bus.post("resolve", "closed")
        assert acked.status_code == resolved.status_code == 200, (acked.text, resolved.text)
        assert feed.unannounced == 2  # answered with both still to announce
    await eventually(lambda: feed.unannounced == 0, within=60, what="the announcements")
    assert lost_announcements(frozen_bus.dash) == 0
    assert (await stored(foundation, frozen_bus.incident)).state == "resolved"
    assert await incident_changes(frozen_bus.bus, frozen_bus.incident) == [
        "acknowledged",
        "resolved",
    ]


async def test_an_acknowledge_whose_announcement_is_not_confirmed_within_the_hold_stands_and_is_counted_lost(
    foundation: Foundation, frozen_bus: FrozenBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(feed_module, "ANNOUNCE_HOLD_S", 1.0)
    feed = frozen_bus.dash.app.state.feed
    with frozen_bus.frozen():
        acked = await frozen_bus.post("ack")
        assert acked.status_code == 200, acked.text
        assert feed.unannounced == 1
        await eventually(lambda: feed.unannounced == 0, within=30, what="the give-up")
    assert lost_announcements(frozen_bus.dash) == 1
    assert (await stored(foundation, frozen_bus.incident)).state == "acknowledged"  # it stands
    # what was sent into the frozen server's socket may be stored once it thaws: never twice
    assert await incident_changes(frozen_bus.bus, frozen_bus.incident) in ([], ["acknowledged"])


async def test_acknowledging_a_resolved_incident_or_signed_out_is_said_in_place_in_korean(
    foundation: Foundation, clocked: tuple[Dashboard, FakeClock], browser: BrowserContext
) -> None:
    dash, clock = clocked
    now = clock()
    gas = await seed_incident(foundation, "factory-a", "GAS_LEAK", "CRITICAL", now)
    co = await seed_incident(foundation, "factory-b", "CO_HIGH", "WARNING", now)
    page = await browser.new_page()
    # the list is never read again (its reads fail, from before the page loads, so no read is
    # under way when the data closes the incident): the card stays as the page first showed it,
    # as on a page that had not read the list since
    await page.route("**/incidents/list*", lambda route: route.abort())
    await sign_in(page, dash.url, "/incidents?lang=ko")
    await expect(page.locator("h1")).to_have_text("진행 중인 사고")
    await expect(page.locator("#live")).to_have_attribute("data-state", "open")
    await expect(card(page, gas).locator('form[data-action="ack"] button')).to_contain_text("확인")
    await closed_by_the_data(foundation, gas, now)
    await card(page, gas).locator('form[data-action="ack"] button').click()
    await expect(card(page, gas).locator(".outcome")).to_have_text(
        "이미 종료된 사고입니다. 변경된 내용이 없습니다."
    )
    await expect(card(page, gas).locator(".state")).to_have_attribute("data-state", "resolved")
    await expect(card(page, gas).locator("form")).to_have_count(0)
    # signed out meanwhile (the cookie is gone): said, with the way back, and nothing changed
    await browser.clear_cookies()
    await card(page, co).locator('form[data-action="ack"] button').click()
    outcome = card(page, co).locator(".outcome")
    await expect(outcome).to_contain_text("로그아웃되었습니다")
    await expect(outcome.locator("a")).to_have_attribute(
        "href", "/login?next=%2Fincidents%3Flang%3Dko"
    )
    assert (await stored(foundation, co)).state == "triggered"


async def test_the_factory_page_banner_of_each_open_incident_acknowledges(
    foundation: Foundation, clocked: tuple[Dashboard, FakeClock], browser: BrowserContext
) -> None:
    dash, clock = clocked
    now = clock()
    gas_reason = {"code": "GAS_LEAK", "severity": "CRITICAL", "detail": "lel 12 >= 10"}
    await seed_latest(
        foundation.readmodel, "factory-a", seeded_latest("CRITICAL", 92.0, [gas_reason], now)
    )
    co = await seed_incident(
        foundation, "factory-a", "CO_HIGH", "WARNING", now - timedelta(minutes=40)
    )
    gas = await seed_incident(
        foundation,
        "factory-a",
        "GAS_LEAK",
        "CRITICAL",
        now - timedelta(minutes=10),
        detail="lel 12 >= 10 on line 3",
    )
    elsewhere = await seed_incident(foundation, "factory-b", "FIRE_DETECTED", "CRITICAL", now)
    page = await browser.new_page()
    await sign_in(page, dash.url, "/factories/factory-a")
    await expect(page).to_have_url(f"{dash.url}/factories/factory-a")
    banners = page.locator("#incidents > [data-incident]")
    await expect(banners).to_have_count(2)
    assert await shown_ids(page) == [gas.incident_id, co.incident_id]
    assert elsewhere.incident_id not in await shown_ids(page)
    banner = card(page, gas)
    await expect(banner).to_contain_text("Open incident")
    await expect(banner.locator("code")).to_have_text("GAS_LEAK")
    await expect(banner.locator(".since")).to_have_text("10 min")
    await expect(banner.locator(".state")).to_have_attribute("data-state", "triggered")
    await page.screenshot(path=str(screenshot_path("dashboard-factory-banner.png")))
    await banner.locator('form[data-action="ack"] button').click()
    await expect(banner.locator(".outcome")).to_have_text(f"Acknowledged by {ME}")
    await expect(banner.locator(".state")).to_have_attribute("data-state", "acknowledged")
    await expect(banner.locator('form[data-action="ack"]')).to_have_count(0)
    acked = await stored(foundation, gas)
    assert acked.acknowledged_by == ME and acked.acknowledged_via == "dashboard"
    await page.screenshot(path=str(screenshot_path("dashboard-factory-banner-acked.png")))
    # resolved elsewhere: its banner goes without a reload
    await closed_by_the_data(foundation, co, now)
    await expect(card(page, co)).to_have_count(0, timeout=15_000)
    await expect(banners).to_have_count(1)


async def test_the_cloud_page_shows_where_each_check_stands_in_its_alerting_rule(
    foundation: Foundation, clocked: tuple[Dashboard, FakeClock], browser: BrowserContext
) -> None:
    dash, clock = clocked
    now = clock()
    checks = [
        CloudCheck(
            name="service:processor",
            status=Level.NORMAL,
            reason="SERVICE_DOWN",
            detail="no heartbeat",
            alerting=CheckAlerting(
                state=CheckState.PENDING,
                observed=Level.CRITICAL,
                failing_since=now - timedelta(seconds=20),
                for_s=60,
            ),
        ),
        CloudCheck(
            name="consumer_lag:AEGIS_RAW/processor",
            status=Level.WARNING,
            reason="CONSUMER_LAG",
            value=1500.0,
            unit="msgs",
            alerting=CheckAlerting(
                state=CheckState.FIRING,
                observed=Level.WARNING,
                failing_since=now - timedelta(minutes=5),
                for_s=60,
            ),
        ),
        CloudCheck(
            name="service:reporter",
            status=Level.NORMAL,
            reason="SERVICE_STARTING",
            alerting=CheckAlerting(state=CheckState.STARTING),
        ),
        CloudCheck(
            name="storage_canary",
            status=Level.WARNING,
            reason="STORAGE_SLOW",
            alerting=CheckAlerting(
                state=CheckState.CLEARING,
                failing_since=now - timedelta(minutes=9),
                passing_since=now - timedelta(seconds=30),
                clear_s=120,
            ),
        ),
        CloudCheck.ok("nats_ping", value=2.0, unit="ms").model_copy(
            update={"alerting": CheckAlerting(state=CheckState.OK)}
        ),
    ]
    snapshot = CloudSnapshot.of("fast", now, checks)
    await foundation.readmodel.apply_cloud(snapshot, ttl=int(now.timestamp()) + 6 * 3600)
    page = await browser.new_page()
    await sign_in(page, dash.url, "/cloud")
    await expect(page).to_have_url(f"{dash.url}/cloud")

    def row(name: str) -> Any:
        return page.locator(f'[data-tier="fast"] tr[data-check="{name}"]')

    for rendered_by in ("the server", "the script"):
        if rendered_by == "the script":  # the rows again from /api/cloud, as a new run would
            await expect(row("nats_ping").locator(".run")).to_have_count(1)
        pending = row("service:processor")
        await expect(pending).to_have_attribute("data-alerting", "pending")
        await expect(pending.locator(".badge")).to_have_attribute("data-alerting", "pending")
        await expect(pending.locator(".badge")).to_have_text("◔Pending")
        await expect(pending.locator("td.status")).not_to_contain_text("Normal")
        await expect(pending.locator(".al-note")).to_contain_text("failing since")
        await expect(pending.locator(".al-note time")).to_have_attribute(
            "datetime", f"{now - timedelta(seconds=20):%Y-%m-%dT%H:%M:%SZ}"
        )
        await expect(pending.locator(".al-note")).to_contain_text("reported after 1 min")
        firing = row("consumer_lag:AEGIS_RAW/processor")
        await expect(firing.locator(".badge")).to_have_attribute("data-level", "WARNING")
        await expect(firing.locator(".al-note .al-state")).to_have_text("Firing")
        await expect(row("service:reporter").locator(".badge")).to_have_text("◌Starting")
        clearing = row("storage_canary").locator(".al-note")
        await expect(clearing).to_contain_text("Clearing")
        await expect(clearing).to_contain_text("cleared after 2 min")
        await expect(row("nats_ping").locator(".badge")).to_have_attribute("data-level", "NORMAL")
        await expect(row("nats_ping").locator(".al-note")).to_have_count(0)
    await page.screenshot(path=str(screenshot_path("dashboard-cloud-alerting.png")), full_page=True)


# -- scopes on the live stream -----------------------------------------------------------------

CREW = "crew-a-token-5d1e"  # a responder of factory-a only (the tokens file)


async def lines_until(lines: AsyncIterator[str], done: str, got: list[str]) -> None:
    """Collect the stream's lines until one holds ``done``."""
    async for line in lines:
        got.append(line)
        if done in line:
            return


async def test_a_scoped_browser_gets_nothing_of_another_factory_live_or_after_a_reconnect(
    foundation: Foundation,
    nats_url: str,
    aws_endpoint: str,
    broker: NatsBroker,
    fire_alert: Callable[..., AlertState],
    tmp_path: Path,
) -> None:
    """Factory b's events (its new state, an incident change, a graph, a report, its alert in
    the alerts list) and the platform's (cloud) reach a fleet screen but never a browser scoped
    to factory-a: not live, not in the snapshot of a reconnect. The scoped browser does get
    factory-a's, and a marker published after the fleet screen had all of b's shows nothing
    of b was queued before it."""
    clock = FakeClock(datetime(2026, 11, 30, 3, 0, tzinfo=UTC))
    now = clock()
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{token_digest(CREW)} role=responder name=crew-a factories=factory-a\n")
    settings = dashboard_settings(foundation, nats_url, aws_endpoint).model_copy(
        update={"dashboard_tokens_file": tokens}
    )
    opened = {}
    for fid in ("factory-a", "factory-b"):
        await seed_latest(foundation.readmodel, fid, seeded_latest("WARNING", 50.0, [], now))
        await foundation.readmodel.put_item(
            fire_alert(fid, firing=True, version=1, ttl=int(now.timestamp()) + 3600)
        )
        opened[fid] = await seed_incident(foundation, fid, "GAS_LEAK", "CRITICAL", now)
    announcing = IncidentStore(
        ReadModel(
            foundation.clients.items,
            foundation.table,
            changes=change_sink(broker, AegisSettings(service="alert-dispatcher")),
        )
    )

    async def events_of(fid: str, tag: str) -> None:
        """What the services announce about ``fid``: its LATEST, an incident change, a graph
        and a report object."""
        latest = seeded_latest("CRITICAL", 91.0, [], now) | {"factory_id": fid}
        change = Change("factory_latest", keys.factory_pk(fid), "LATEST", "MODIFY", None, latest)
        subject, event, msg_id = change_message(
            change, table=foundation.table, producer="processor", at=now
        )
        await publish(broker, subject, event, msg_id=msg_id + tag)
        await announcing.change(
            opened[fid].incident_id,
            lambda i: incidents.acknowledge(i, by="cli:kim", via="cli", at=now, note=None),
        )
        for family, key in [
            (
                "metrics_5m",
                f"processed_agg/{fid}/metrics_5m/yyyy=2026/mm=11/dd=30/hh=03/mm={tag}.json",
            ),
            ("reports", f"reports/daily/yyyy=2026/mm=11/dd=29/{fid}/report.md"),
        ]:
            created = ObjectCreated(
                bucket=foundation.bucket, key=key, size_bytes=1, producer="test", created_at=now
            )
            await publish(broker, object_created_subject(family), created, msg_id=f"{key}{tag}")

    bearer = lambda token: {"Authorization": f"Bearer {token}"}  # noqa: E731
    async with serving(settings, foundation, clock) as dash:
        await eventually(lambda: dash.app.state.feed.connected, within=15, what="the live feed")
        async with (
            httpx.AsyncClient(base_url=dash.url, timeout=10) as client,
            client.stream("GET", "/api/live", headers=bearer(CREW)) as crew,
            client.stream("GET", "/api/live", headers=bearer(TOKEN)) as desk,
        ):
            assert crew.status_code == 200
            crew_lines, desk_lines = crew.aiter_lines(), desk.aiter_lines()
            got_crew: list[str] = []
            got_desk: list[str] = []
            await asyncio.wait_for(lines_until(crew_lines, "event: alerts", got_crew), 10)
            await asyncio.wait_for(lines_until(desk_lines, "event: cloud", got_desk), 10)
            await events_of("factory-b", "05")
            await events_of("factory-a", "10")
            await publish(
                broker,
                system_subject("alert_sent"),
                SystemEvent(kind="alert_sent", producer="alert-dispatcher", at=now),
                msg_id="alert-sent-scope",
            )
            # the fleet screen gets b's events (they were announced and relayed) ...
            await asyncio.wait_for(lines_until(desk_lines, "factory-b/report.md", got_desk), 10)
            await asyncio.wait_for(lines_until(desk_lines, "event: alerts", got_desk), 10)
            assert any("factory-b" in line and "entry" in line for line in got_desk)
            # ... and a marker after them closes what the scoped stream could have been given
            marker = "processed_agg/factory-a/metrics_5m/yyyy=2026/mm=11/dd=30/hh=03/mm=55.json"
            created = ObjectCreated(
                bucket=foundation.bucket, key=marker, size_bytes=1, producer="test", created_at=now
            )
            await publish(broker, object_created_subject("metrics_5m"), created, msg_id=marker)
            await asyncio.wait_for(lines_until(crew_lines, "mm=55.json", got_crew), 10)
    crew_text = "\n".join(got_crew)
    assert "factory-b" not in crew_text and "event: cloud" not in crew_text
    for seen in ("factory-a/report.md", "mm=10.json", '"incident_id"', '"entry"'):
        assert seen in crew_text
    alerts = [json.loads(line.removeprefix("data: ")) for line in got_crew if '"alerts"' in line]
    assert alerts and all(
        [a["scope"] for a in event["alerts"]] == ["factory-a"] for event in alerts
    )

    # a reconnect's snapshot: factory-a's fleet entry and alert, nothing of b, no cloud
    async with (
        serving(settings, foundation, clock) as dash,
        httpx.AsyncClient(base_url=dash.url, timeout=10) as client,
        client.stream("GET", "/api/live", headers=bearer(CREW)) as again,
    ):
        got: list[str] = []
        await asyncio.wait_for(lines_until(again.aiter_lines(), ": ping", got), 10)
    snapshot = "\n".join(got)
    assert "event: fleet" in snapshot and "factory-a" in snapshot
    assert "factory-b" not in snapshot and "event: cloud" not in snapshot


# -- the orchestration jobs ------------------------------------------------------------------------

EXAMPLE_JOBS = Path(__file__).parents[2] / "deploy" / "jobs" / "examples.yaml"
JOBS_NOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
VIEWER = "wall-viewer-5d1e0a"  # the whole fleet's viewer
ADMIN = "admin-desk-0c9b44"
ESCALATION = "gas-leak-escalation"
PHONE = {"width": 390, "height": 844}


@dataclass
class JobsSite:
    url: str
    store: JobStore
    jobs: list[Job]


@pytest.fixture
async def jobs_site(
    foundation: Foundation, nats_url: str, aws_endpoint: str
) -> AsyncIterator[JobsSite]:
    """The dashboard on a clock held at JOBS_NOW with the example jobs registered, for a viewer
    and an admin, reading a job's executions again every second."""
    settings = dashboard_settings(foundation, nats_url, aws_endpoint).model_copy(
        update={
            "dashboard_tokens": f"{token_digest(VIEWER)},admin:{token_digest(ADMIN)}",
            "dashboard_executions_refresh_s": 1.0,
        }
    )
    store = JobStore(foundation.readmodel, lambda: JOBS_NOW)
    jobs = load_jobs(EXAMPLE_JOBS.read_text())
    for job in jobs:
        await store.register(job)
    async with serving(settings, foundation, FakeClock(JOBS_NOW)) as dash:
        yield JobsSite(dash.url, store, jobs)


def run_log(
    job_id: str, execution_id: str, started: datetime, status: str, *steps: tuple[str, ...]
) -> dict[str, Any]:
    """An execution log item as the orchestrator's runner writes it; each step (id, status, and
    an error or, for a CHOICE, the branch taken)."""
    records = []
    for step_id, recorded, *extra in steps:
        error = {"Error": "HTTPStatusError", "Cause": extra[0]} if recorded == "FAILED" else None
        records.append(
            {
                "step_id": step_id,
                "status": recorded,
                "branch": extra[0] if extra and error is None else None,
                "attempts": 1,
                "error": error,
                "started_at": format_ts(started),
            }
        )
    return {
        "pk": keys.exec_pk(job_id),
        "sk": keys.exec_sk(started, execution_id),
        "job_id": job_id,
        "job_version": 1,
        "execution_id": execution_id,
        "trigger": {"type": "BizObject", "object_id": "factory_latest", "sub_type": "Update"},
        "status": status,
        "started_at": format_ts(started),
        "runner": "orchestrator-1",
        "steps": records,
        "ttl": int((started + timedelta(days=30)).timestamp()),
    }


# what the chart shows: each step's box (place, state, name), each edge, each retry loop, each box
# of a container with the steps it holds
DRAWN = """() => {
  const box = (el) => {
    const r = el.getBoundingClientRect();
    return [r.left, r.top, r.right, r.bottom];
  };
  const all = (what) => [...document.querySelectorAll("#job-graph " + what)];
  return {
    nodes: all(".gnode").map((n) => ({
      id: n.dataset.node, state: n.dataset.state, label: n.getAttribute("aria-label"),
      box: box(n.querySelector(".gbox")), retry: !!n.querySelector(".gretry"),
    })),
    edges: all("path.gedge[data-kind]").map((e) => [e.dataset.from, e.dataset.to, e.dataset.kind]),
    clusters: Object.fromEntries(all(".gcluster").map((c) => [c.dataset.cluster, box(c)])),
    svg: box(document.querySelector("#job-graph svg")),
  };
}"""


def overlap(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def inside(inner: list[float], outer: list[float]) -> bool:
    return (
        outer[0] <= inner[0]
        and outer[1] <= inner[1]
        and inner[2] <= outer[2]
        and inner[3] <= outer[3]
    )


async def jobs_list_as(browser: BrowserContext, site: JobsSite, token: str) -> Page:
    """A page signed in with ``token`` on the jobs list, every example job listed."""
    page = await browser.new_page()
    await sign_in(page, site.url, "/jobs", token=token)
    await expect(page.locator("[data-job-row]")).to_have_count(len(site.jobs))
    return page


async def drawn_states(page: Page) -> dict[str, str]:
    return {n["id"]: n["state"] for n in (await page.evaluate(DRAWN))["nodes"]}


async def test_the_job_page_draws_each_example_job_with_every_step_and_edge(
    jobs_site: JobsSite, browser: BrowserContext
) -> None:
    page = await jobs_list_as(browser, jobs_site, VIEWER)
    for job in jobs_site.jobs:
        await page.goto(f"{jobs_site.url}/jobs/{job.id}")
        await expect(page.locator("#job-graph")).to_have_attribute(
            "data-drawn", str(len(job.steps))
        )
        drawn = await page.evaluate(DRAWN)
        flow = graph(job)
        assert sorted(n["id"] for n in drawn["nodes"]) == sorted(s.id for s in job.steps), job.id
        drawn_edges = sorted(tuple(e) for e in drawn["edges"])
        assert drawn_edges == sorted(
            (e.source, e.target, e.kind.value) for e in flow.edges if e.kind is not EdgeKind.RETRY
        ), job.id
        retried = {e.source for e in flow.edges if e.kind is EdgeKind.RETRY}
        assert {n["id"] for n in drawn["nodes"] if n["retry"]} == retried, job.id
        boxes = {n["id"]: n["box"] for n in drawn["nodes"]}
        for n in drawn["nodes"]:
            assert n["label"].startswith(n["id"]), n  # each step named for screen readers
            assert inside(n["box"], drawn["svg"]), n
            assert not any(overlap(n["box"], b) for k, b in boxes.items() if k != n["id"]), n
        # each SEQUENCE, PARALLEL and CHOICE is a box around itself and what it holds
        for node in flow.nodes:
            if node.container:
                held = [node.id] + [m.id for m in flow.nodes if m.parent == node.id]
                assert all(inside(boxes[i], drawn["clusters"][node.id]) for i in held), node.id
        # no execution yet: said, and no step coloured
        await expect(page.locator("#graph-run")).to_contain_text("No execution yet")
        assert {n["state"] for n in drawn["nodes"]} == {""}
    escalation = next(j for j in jobs_site.jobs if j.id == ESCALATION)
    await page.goto(f"{jobs_site.url}/jobs/{escalation.id}")
    label = await page.locator('.gnode[data-node="escalate"]').get_attribute("aria-label")
    assert label is not None
    assert label.startswith("escalate: TASK · SLACK_NOTIFY") and "loops back to wait_2m" in label
    await expect(page.locator("#job-graph")).to_have_attribute(
        "data-drawn", str(len(escalation.steps))
    )
    await page.screenshot(path=screenshot_path("job-graph-desktop.png"), full_page=True)
    await page.set_viewport_size(PHONE)
    await page.reload()
    await expect(page.locator("#job-graph")).to_have_attribute(
        "data-drawn", str(len(escalation.steps))
    )
    # narrowed as far as it stays readable, then the chart scrolls sideways, not the page
    widths = await page.evaluate(
        "[document.documentElement.scrollWidth, document.getElementById('job-graph').clientWidth,"
        " document.querySelector('#job-graph svg').getBoundingClientRect().width,"
        " document.querySelector('#job-graph svg').viewBox.baseVal.width]"
    )
    assert widths[0] <= PHONE["width"] and widths[1] < PHONE["width"]
    assert widths[3] * 0.6 <= widths[2] < widths[3]
    await page.screenshot(path=screenshot_path("job-graph-phone.png"), full_page=True)
    await page.locator(".job-graph-panel").screenshot(
        path=screenshot_path("job-graph-phone-chart.png")
    )


# a job its designer laid out left to right: each step's top left corner, in the designer's pixels
PLACES = {
    "x": 120,
    "y": 40,
    "begin": {"x": 100, "y": 300},
    "fan": {"x": 340, "y": 300},
    "left": {"x": 560, "y": 200},
    "right": {"x": 560, "y": 400},
    "pick": {"x": 820, "y": 300},
    "again": {"x": 1060, "y": 220},
    "finish": {"x": 1060, "y": 380},
}


async def test_a_job_its_designer_placed_is_drawn_where_the_designer_put_each_step(
    jobs_site: JobsSite, browser: BrowserContext
) -> None:
    placed = Job.model_validate(
        {
            "id": "designer-placed",
            "job_name": "Placed by its designer",
            "trigger_type": "Automation",
            "object_id": "designer",
            "designer_offset": PLACES,
            "steps": [
                {"id": "begin", "step_type": "DUMMY", "is_start_point": True, "seq": 1},
                {"id": "fan", "step_type": "FLOW", "step_sub_type": "PARALLEL", "seq": 2},
                {"id": "left", "flow_step_id": "fan", "step_type": "DUMMY", "seq": 1},
                {"id": "right", "flow_step_id": "fan", "step_type": "DUMMY", "seq": 2},
                {"id": "pick", "step_type": "FLOW", "step_sub_type": "CHOICE", "seq": 3},
                {
                    "id": "again",
                    "flow_step_id": "pick",
                    "step_type": "DUMMY",
                    "condition_expr": 'StringEQ([$.payload.again], "yes")',
                    "next_step_id": "begin",
                },
                {"id": "finish", "step_type": "DUMMY", "seq": 4},
            ],
        }
    )
    page = await jobs_list_as(browser, jobs_site, VIEWER)
    await jobs_site.store.register(placed)
    await page.goto(f"{jobs_site.url}/jobs/{placed.id}")
    holder = page.locator("#job-graph")
    await expect(holder).to_have_attribute("data-drawn", str(len(placed.steps)))
    await expect(holder).to_have_attribute("data-placed", "designer")
    drawn = await page.evaluate(DRAWN)
    scale = await page.evaluate(
        "(() => { const s = document.querySelector('#job-graph svg');"
        " return s.getBoundingClientRect().width / s.viewBox.baseVal.width; })()"
    )
    corner = {n["id"]: (n["box"][0], n["box"][1]) for n in drawn["nodes"]}
    x0, y0 = corner["begin"]
    for step_id, (x, y) in corner.items():
        want = PLACES[step_id]
        assert isinstance(want, dict)
        dx, dy = (want["x"] - 100) * scale, (want["y"] - 300) * scale
        assert abs(x - x0 - dx) < 2 and abs(y - y0 - dy) < 2, step_id
    boxes = {n["id"]: n["box"] for n in drawn["nodes"]}
    assert all(inside(boxes[i], drawn["clusters"]["fan"]) for i in ("fan", "left", "right"))
    assert sorted(tuple(e) for e in drawn["edges"]) == sorted(
        (e.source, e.target, e.kind.value) for e in graph(placed).edges
    )
    await page.screenshot(path=screenshot_path("job-graph-designer.png"), full_page=True)


async def test_an_executions_steps_change_state_on_the_open_job_page_without_a_reload(
    jobs_site: JobsSite, browser: BrowserContext
) -> None:
    store, started = jobs_site.store, JOBS_NOW - timedelta(minutes=3)
    run = "20261130T025700-5e6f7a8b"
    await store.put_execution(
        run_log(ESCALATION, run, started, "RUNNING", ("notify", "SUCCEEDED")), new=True
    )
    page = await browser.new_page()
    await sign_in(page, jobs_site.url, f"/jobs/{ESCALATION}", token=VIEWER)
    await expect(page.locator("#job-graph")).to_have_attribute("data-execution", run)
    states = await drawn_states(page)
    assert states["notify"] == "SUCCEEDED"
    assert [states[s] for s in ("respond", "call_maintenance", "evacuate")] == ["RUNNING"] * 3
    assert states["wait_2m"] == states["done"] == "PENDING"
    await page.evaluate("window.sameDocument = true")

    # the maintenance webhook fails and the PARALLEL's catch path takes over
    await store.put_execution(
        run_log(
            ESCALATION, run, started, "RUNNING",
            ("notify", "SUCCEEDED"), ("evacuate", "SUCCEEDED"),
            ("call_maintenance", "FAILED", "maintenance answered 503"), ("respond", "CAUGHT"),
        )
    )  # fmt: skip
    node = page.locator('#job-graph .gnode[data-node="maintenance_down"]')
    await expect(node).to_have_attribute("data-state", "RUNNING", timeout=15_000)
    await expect(node).to_have_class(re.compile(r"\bgs-running\b"))
    states = await drawn_states(page)
    assert (states["call_maintenance"], states["respond"]) == ("FAILED", "CAUGHT")
    await expect(page.locator("#graph-errors")).to_contain_text("maintenance answered 503")
    failed = page.locator('#job-graph .gnode[data-node="call_maintenance"]')
    assert "maintenance answered 503" in str(await failed.get_attribute("aria-label"))
    await page.screenshot(path=screenshot_path("job-graph-running.png"), full_page=True)

    # on to the wait, then the execution ends
    await store.put_execution(
        run_log(
            ESCALATION, run, started, "FAILED",
            ("notify", "SUCCEEDED"), ("evacuate", "SUCCEEDED"),
            ("call_maintenance", "FAILED", "maintenance answered 503"), ("respond", "CAUGHT"),
            ("maintenance_down", "SUCCEEDED"), ("wait_2m", "WAITING"),
        )
    )  # fmt: skip
    row = page.locator(f'#executions tr[data-execution="{run}"]')
    await expect(row).to_have_attribute("data-status", "FAILED", timeout=15_000)
    await expect(page.locator('.gnode[data-node="wait_2m"]')).to_have_attribute(
        "data-state", "STOPPED"
    )
    await expect(page.locator('.gnode[data-node="done"]')).to_have_attribute(
        "data-state", "SKIPPED"
    )

    # a trigger skipped because the job was running ran no step: the chart stays on the one
    # that ran
    skipped = "20261130T025800-9a8b7c6d"
    await store.put_execution(
        run_log(ESCALATION, skipped, JOBS_NOW - timedelta(minutes=2), "SKIPPED_OVERLAP"), new=True
    )
    await expect(page.locator(f'#executions tr[data-execution="{skipped}"]')).to_have_count(
        1, timeout=15_000
    )
    await expect(page.locator("#job-graph")).to_have_attribute("data-execution", run)

    # a newer execution is shown as it comes; an older one chosen stays shown
    newer = "20261130T025900-0c1d2e3f"
    await store.put_execution(
        run_log(ESCALATION, newer, JOBS_NOW - timedelta(minutes=1), "RUNNING"), new=True
    )
    await expect(page.locator("#job-graph")).to_have_attribute(
        "data-execution", newer, timeout=15_000
    )
    assert (await drawn_states(page))["notify"] == "RUNNING"
    await row.locator("button.exec-pick").click()
    await expect(page.locator("#job-graph")).to_have_attribute("data-execution", run)
    await expect(row.locator("button.exec-pick")).to_have_attribute("aria-pressed", "true")
    assert (await drawn_states(page))["call_maintenance"] == "FAILED"
    assert await page.evaluate("window.sameDocument") is True  # never reloaded


async def test_a_viewer_gets_no_enable_or_disable_on_the_jobs_pages_and_an_admin_does(
    jobs_site: JobsSite, browser: BrowserContext
) -> None:
    page = await jobs_list_as(browser, jobs_site, VIEWER)
    assert await page.locator("button[data-job-action]").count() == 0
    await page.goto(f"{jobs_site.url}/jobs/{ESCALATION}")
    await expect(page.locator("#job-graph .gnode")).to_have_count(10)
    assert await page.locator("button[data-job-action], .job-act").count() == 0
    await browser.clear_cookies()
    admin = await jobs_list_as(browser, jobs_site, ADMIN)
    await expect(admin.locator("button[data-job-action]")).to_have_count(len(jobs_site.jobs))
    await admin.goto(f"{jobs_site.url}/jobs/{ESCALATION}")
    await expect(admin.locator("button[data-job-action]")).to_have_attribute(
        "data-job-action", "disable"
    )
