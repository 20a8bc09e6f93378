"""``make bench``: the dashboard's fleet endpoint with 500 factories in the read model (target:
p99 < 50 ms). Seeds 500 full FACTORY LATEST items in a private emulator, starts the
dashboard API as its own process (its console script, a real HTTP server), then times sequential
``GET /api/fleet`` requests with a bearer token from this process.

Then the live fan-out: ``--screens`` event streams open at once (``/api/live``), ``--events``
change events published on a private NATS (core, as the processor's reach a core subscriber) at
``--rate`` per second, each a full LATEST; per event and screen, the time from publish to arrival
in this process (which also parses every stream, so it measures itself too), the screens
dropped, and the dashboard process's CPU per event. Prints lines, writes JSON."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import httpx
import nats
from pipeline import start_emulator
from procstat import sample

from aegis_contracts import keys
from aegis_contracts.events import ChangeEvent
from aegis_contracts.times import format_ts
from aegis_devstack.localservers import free_port, start_private_nats
from aegis_runtime.process import exit_process
from aegis_storage.bootstrap import bootstrap
from aegis_storage.clients import AwsConfig, open_clients
from aegis_storage.readmodel import ReadModel

SCRIPTS = Path(sys.executable).parent
TOKEN = "bench-wall-screen"


def latest(i: int, now: datetime) -> dict[str, Any]:
    """A LATEST the size the processor writes: state, infra, risk with reasons, pipeline."""
    factory = f"factory-{i:03d}"
    at = format_ts(now - timedelta(seconds=i % 30))
    meta = {
        "message_id": f"{factory}-m-{i:08d}",
        "device_id": "edge-01",
        "emitted_at": at,
        "event_time": at,
        "received_at": at,
        "raw_key": f"raw/{factory}/factory_state/yyyy=2026/mm=11/dd=30/{factory}-m-{i:08d}.json",
        "schema_version": "1.0",
    }
    level = ("NORMAL", "WARNING", "CRITICAL")[i % 3]
    return {
        "pk": keys.factory_pk(factory),
        "sk": keys.LATEST_SK,
        "factory_id": factory,
        "factory_state": {
            "meta": meta,
            "sensors": {
                "temperature_c": 24.5,
                "humidity_pct": 41.0,
                "co_ppm": 3.0 + i % 40,
                "smoke_obscuration_pct": 0.1,
                "vibration_mm_s": 1.2,
                "noise_db": 71.0,
            },
            "model_version": "yolo-1",
            "detections": [{"label": "no_helmet", "confidence": 0.81, "camera_id": "cam-1"}],
        },
        "infra_state": {
            "meta": meta,
            "host": {"cpu_pct": 31.0, "mem_pct": 52.0, "disk_pct": 70.0},
            "network": {"rtt_ms": 12.0, "loss_pct": 0.0},
            "cameras": {"cam-1": "online", "cam-2": "online"},
            "pipeline": {"detector": "ok"},
        },
        "risk": {
            "score": (0, 40, 85)[i % 3],
            "level": level,
            "reasons": []
            if level == "NORMAL"
            else [
                {
                    "code": "CO_HIGH",
                    "severity": level,
                    "detail": "co_ppm 60 ppm >= threshold 50",
                    "value": 60.0,
                    "threshold": 50.0,
                    "source": "sensors.co_ppm",
                }
            ],
        },
        "pipeline_status": {"status": "OK", "checked_at": at, "factory_state_age_s": 1.0},
        "last_factory_state_at": at,
        "last_infra_state_at": at,
        "updated_at": at,
    }


async def seed(endpoint: str, bucket: str, table: str, factories: int) -> None:
    now = datetime.now(UTC)
    async with open_clients(AwsConfig(endpoint_url=endpoint)) as clients:
        await bootstrap(clients, bucket=bucket, table=table)
        readmodel = ReadModel(clients.items, table)
        slots = asyncio.Semaphore(32)

        async def one(i: int) -> None:
            async with slots:
                await readmodel.put_item(latest(i, now))

        await asyncio.gather(*(one(i) for i in range(factories)))


def wait_ready(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the dashboard did not become ready at {url}")


def measure(url: str, requests: int) -> list[float]:
    request = urllib.request.Request(
        f"{url}/api/fleet", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    samples = []
    for _ in range(requests):
        start = time.perf_counter()
        with urllib.request.urlopen(request, timeout=10) as resp:
            body = resp.read()
        samples.append((time.perf_counter() - start) * 1000)
    assert json.loads(body), "an empty fleet"
    return samples


async def fan_out(
    url: str, nats_url: str, table: str, pid: int, screens: int, events: int, rate: float
) -> dict[str, Any]:
    """Open ``screens`` streams, publish ``events`` changes, time each arrival on each screen."""
    sent: dict[int, float] = {}
    delays: list[float] = []
    ended = 0
    ready = asyncio.Event()
    opened = 0
    now = datetime.now(UTC)

    async def screen(client: httpx.AsyncClient) -> None:
        nonlocal opened, ended
        got = 0
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with client.stream("GET", "/api/live", headers=headers) as resp:
            name = None
            async for line in resp.aiter_lines():
                if line.startswith("event: "):
                    name = line[7:]
                    if name == "cloud":  # the snapshot's last event: this screen is live
                        opened += 1
                        if opened == screens:
                            ready.set()
                elif line.startswith("data: ") and name == "factory":
                    seq = json.loads(line[6:])["latest"]["bench_seq"]
                    delays.append((time.perf_counter() - sent[seq]) * 1000)
                    got += 1
                    if got == events:
                        return
        ended += 1  # the stream ended before every event: the screen was dropped

    limits = httpx.Limits(max_connections=screens + 10)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        tasks = [asyncio.create_task(screen(client)) for _ in range(screens)]
        await asyncio.wait_for(ready.wait(), 120)
        nc = await nats.connect(nats_url)
        cpu_before = sample(pid).cpu_s
        for seq in range(events):
            image = latest(seq % 500, now) | {"bench_seq": seq}
            change = ChangeEvent(
                table=table,
                pk=image["pk"],
                sk=keys.LATEST_SK,
                event_name="MODIFY",
                new_image=image,
                producer="bench",
                at=now,
            )
            sent[seq] = time.perf_counter()
            await nc.publish("aegis.changes.factory_latest", change.model_dump_json().encode())
            await asyncio.sleep(1 / rate)
        await nc.flush()
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
        cpu = sample(pid).cpu_s - cpu_before
        await nc.close()
    delays.sort()
    return {
        "screens": screens,
        "events": events,
        "rate_per_s": rate,
        "delivered": len(delays),
        "dropped_screens": ended,
        "delivery_p50_ms": round(statistics.median(delays), 2),
        "delivery_p99_ms": round(delays[int(len(delays) * 0.99) - 1], 2),
        "dashboard_cpu_ms_per_event": round(cpu * 1000 / events, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--factories", type=int, default=500)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--screens", type=int, default=100)
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    emulator = start_emulator()
    uid = uuid.uuid4().hex[:8]
    bucket, table = f"aegis-dash-{uid}", f"AEGIS-dash-{uid}"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = None
    # a NATS of its own: the bench's made-up changes must not reach a running stack's services
    private_nats = start_private_nats()
    nats_url = private_nats.url
    try:
        asyncio.run(seed(emulator.url, bucket, table, args.factories))
        env = {k: v for k, v in os.environ.items() if not k.startswith("AEGIS_")} | {
            "AEGIS_AWS_ENDPOINT_URL": emulator.url,
            "AEGIS_BUCKET": bucket,
            "AEGIS_TABLE": table,
            "AEGIS_DASHBOARD_PORT": str(port),
            "AEGIS_DASHBOARD_TOKENS": "responder:" + hashlib.sha256(TOKEN.encode()).hexdigest(),
            "AEGIS_LOG_LEVEL": "WARNING",
            "AEGIS_NATS_URL": nats_url,
        }
        server = subprocess.Popen(
            [str(SCRIPTS / "aegis-dashboard-api")],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_ready(url)
        measure(url, 20)  # warm-up: connections, caches
        samples = sorted(measure(url, args.requests))
        live = asyncio.run(
            fan_out(url, nats_url, table, server.pid, args.screens, args.events, args.rate)
        )
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
        emulator.close()
        private_nats.close()
    result = {
        "factories": args.factories,
        "requests": args.requests,
        "p50_ms": round(statistics.median(samples), 2),
        "p95_ms": round(samples[int(len(samples) * 0.95) - 1], 2),
        "p99_ms": round(samples[int(len(samples) * 0.99) - 1], 2),
        "target_p99_ms": 50.0,
        "live": live,
    }
    print(
        f"dashboard /api/fleet, {args.factories} factories: p50 {result['p50_ms']} ms, "
        f"p95 {result['p95_ms']} ms, p99 {result['p99_ms']} ms (target p99 < 50 ms)"
    )
    print(
        f"dashboard /api/live, {live['screens']} screens, {live['events']} changes at "
        f"{live['rate_per_s']:g}/s: {live['delivered']} deliveries, publish to arrival p50 "
        f"{live['delivery_p50_ms']} ms, p99 {live['delivery_p99_ms']} ms, "
        f"{live['dropped_screens']} screens dropped, dashboard CPU "
        f"{live['dashboard_cpu_ms_per_event']} ms per change"
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
    exit_process(0)  # not finalized: the S3 client's threads could crash it (exit_process)
