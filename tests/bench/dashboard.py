"""``make bench``: the dashboard's fleet endpoint with 500 factories in the read model (issue 9:
target p99 < 50 ms). Seeds 500 full FACTORY LATEST items in a private emulator, starts the
dashboard API as its own process (its console script, a real HTTP server), then times sequential
``GET /api/fleet`` requests with a bearer token from this process. Prints a line, writes JSON."""

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

from pipeline import start_emulator

from aegis_contracts import keys
from aegis_contracts.times import format_ts
from aegis_runtime.localservers import free_port
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
        readmodel = ReadModel(clients.dynamodb, table)
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--factories", type=int, default=500)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    emulator = start_emulator()
    uid = uuid.uuid4().hex[:8]
    bucket, table = f"aegis-dash-{uid}", f"AEGIS-dash-{uid}"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = None
    try:
        asyncio.run(seed(emulator.url, bucket, table, args.factories))
        env = {k: v for k, v in os.environ.items() if not k.startswith("AEGIS_")} | {
            "AEGIS_AWS_ENDPOINT_URL": emulator.url,
            "AEGIS_BUCKET": bucket,
            "AEGIS_TABLE": table,
            "AEGIS_DASHBOARD_PORT": str(port),
            "AEGIS_DASHBOARD_TOKENS": hashlib.sha256(TOKEN.encode()).hexdigest(),
            "AEGIS_LOG_LEVEL": "WARNING",
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
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
        emulator.stop()
    result = {
        "factories": args.factories,
        "requests": args.requests,
        "p50_ms": round(statistics.median(samples), 2),
        "p95_ms": round(samples[int(len(samples) * 0.95) - 1], 2),
        "p99_ms": round(samples[int(len(samples) * 0.99) - 1], 2),
        "target_p99_ms": 50.0,
    }
    print(
        f"dashboard /api/fleet, {args.factories} factories: p50 {result['p50_ms']} ms, "
        f"p95 {result['p95_ms']} ms, p99 {result['p99_ms']} ms (target p99 < 50 ms)"
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
