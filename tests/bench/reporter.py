"""``make bench`` (reporter): one factory-day of 17,280 factory_state snapshots (one every 5 s)
plus their 17,280 risk_score records in a fresh emulator, then ``aegis report`` for that day in a
child process, two ways on the same data: from the aggregator's 5-minute windows (after
``aegis aggregate`` has folded the day's 288 windows), and object by object (the windows removed).
For each: wall time, the S3 requests it sent (counted by the emulator), and its RSS sampled
through the run (peak and at each quarter), so a memory that grew with the input would show; then
the same date again (every hour reused).

Generating 34,560 objects in moto is the slow part (~400 puts/s here): they are written 64 at a
time and the time it takes is reported too. Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from procstat import sample

from aegis_contracts import keys
from aegis_contracts.keys import Dataset
from aegis_contracts.times import format_ts, kst_day_bounds
from aegis_devstack.localservers import free_port, start_moto_server
from aegis_devstack.testing.emulator import request_counts, reset_request_counts
from aegis_runtime.process import exit_process
from aegis_storage.bootstrap import bootstrap
from aegis_storage.clients import AwsConfig, open_clients
from aegis_storage.s3 import ObjectStore

DAY = date(2026, 11, 30)
FACTORY = "bench-factory"
CADENCE_S = 5
SCRIPTS = Path(sys.executable).parent


def bodies(i: int, at: datetime) -> tuple[bytes, bytes]:
    """Snapshot ``i``: a CO excursion every 4 hours (WARNING for 10 minutes)."""
    mid = f"bench-{i:08d}"
    meta = {
        "message_id": mid,
        "device_id": "edge-01",
        "emitted_at": format_ts(at),
        "event_time": format_ts(at),
        "received_at": format_ts(at),
        "raw_key": f"raw/{FACTORY}/factory_state/yyyy=2026/mm=11/dd=30/{mid}.json",
        "schema_version": "1.0",
    }
    warning = (i * CADENCE_S) % 14_400 < 600
    co = 50.0 + i % 7 if warning else 3.0 + (i % 50) / 10
    sensors = {
        "temperature_c": 22.0 + (i % 300) / 100,
        "humidity_pct": 45.0 + (i % 200) / 20,
        "co_ppm": co,
        "smoke_obscuration_pct": 0.1,
        "vibration_mm_s": 1.0 + (i % 90) / 100,
        "noise_db": 70.0 + (i % 40) / 4,
    }
    fs = {"meta": meta, "sensors": sensors, "model_version": "yolo-1", "detections": []}
    reasons = (
        [
            {
                "code": "CO_HIGH",
                "severity": "WARNING",
                "detail": f"co_ppm {co:g} ppm",
                "value": co,
                "threshold": 35.0,
            }
        ]
        if warning
        else []
    )
    risk = {
        "meta": meta,
        "risk": {
            "score": 40.0 if warning else 0.0,
            "level": "WARNING" if warning else "NORMAL",
            "reasons": reasons,
        },
    }
    return json.dumps(fs).encode(), json.dumps(risk).encode()


async def generate(endpoint: str, bucket: str, table: str, concurrency: int) -> dict[str, Any]:
    start, _ = kst_day_bounds(DAY)
    count = 86_400 // CADENCE_S
    async with open_clients(
        AwsConfig(endpoint_url=endpoint, max_pool_connections=concurrency)
    ) as c:
        await bootstrap(c, bucket=bucket, table=table)
        slots = asyncio.Semaphore(concurrency)

        async def put(key: str, body: bytes) -> None:
            async with slots:
                await c.s3.put_object(Bucket=bucket, Key=key, Body=body)

        t0 = time.perf_counter()
        for chunk in range(0, count, 2_000):  # bounded set of pending tasks
            tasks = []
            for i in range(chunk, min(count, chunk + 2_000)):
                at = start + timedelta(seconds=i * CADENCE_S)
                fs, risk = bodies(i, at)
                mid = f"bench-{i:08d}"
                tasks.append(put(keys.processed_key(FACTORY, Dataset.FACTORY_STATE, at, mid), fs))
                tasks.append(put(keys.processed_key(FACTORY, Dataset.RISK_SCORE, at, mid), risk))
            await asyncio.gather(*tasks)
        took = time.perf_counter() - t0
    return {
        "snapshots": count,
        "objects": 2 * count,
        "seconds": round(took, 1),
        "puts_per_s": round(2 * count / took, 1),
    }


def run_report(env: dict[str, str], command: list[str] | None = None) -> dict[str, Any]:
    """``command`` (default: ``aegis report`` of the day) in a child process: wall time, RSS, and
    the requests the emulator served meanwhile."""
    endpoint = env["AEGIS_AWS_ENDPOINT_URL"]
    reset_request_counts(endpoint)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        command
        or [
            str(SCRIPTS / "aegis"),
            "report",
            "--date",
            DAY.isoformat(),
            "--factory",
            FACTORY,
            "--no-events",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    rss: list[tuple[float, float]] = []
    peak = 0.0
    while proc.poll() is None:
        try:
            s = sample(proc.pid)
        except (FileNotFoundError, ProcessLookupError, IndexError):
            break
        rss.append((time.perf_counter() - t0, s.rss_mb))
        peak = max(peak, s.peak_rss_mb)
        time.sleep(0.2)
    out = proc.communicate()[0].decode()
    took = time.perf_counter() - t0
    counts = request_counts(endpoint)
    if proc.returncode != 0:
        raise SystemExit(f"{proc.args} failed:\n{out}")
    quarters = []
    for q in (0.25, 0.5, 0.75, 1.0):
        before = [mb for t, mb in rss if t <= q * took]
        quarters.append(round(before[-1], 1) if before else None)
    return {
        "seconds": round(took, 1),
        "s3_requests": counts.total("s3"),
        "s3_gets": counts.count("s3", "GetObject"),
        "s3_lists": counts.count("s3", "ListObjectsV2"),
        "s3_puts": counts.count("s3", "PutObject"),
        "dynamodb_requests": counts.total("dynamodb"),
        "peak_rss_mb": round(peak, 1),
        "rss_mb_at_quarters": quarters,
        "output": out.strip().splitlines()[-2:],
    }


def show(label: str, run: dict[str, Any]) -> None:
    print(
        f"{label}: {run['seconds']} s, {run['s3_requests']:,} S3 requests ({run['s3_gets']:,} GET,"
        f" {run['s3_lists']:,} LIST, {run['s3_puts']:,} PUT), peak RSS {run['peak_rss_mb']} MB,"
        f" RSS at quarters {run['rss_mb_at_quarters']}",
        flush=True,
    )


async def remove(endpoint: str, bucket: str, prefix: str) -> int:
    async with open_clients(AwsConfig(endpoint_url=endpoint)) as c:
        found = [o async for o in ObjectStore(c, bucket).list_objects(prefix)]
        await ObjectStore(c, bucket).delete_many([o.key for o in found])
    return len(found)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="aegis-bench-reporter-", dir=Path.cwd()))
    emulator = start_moto_server("127.0.0.1", free_port(), log_file=folder / "moto.log")
    try:
        bucket, table = "aegis-bench-reports", "AEGIS-bench-reports"
        generated = await generate(emulator.url, bucket, table, args.concurrency)
        print(
            f"generated {generated['objects']:,} objects in {generated['seconds']} s ({generated['puts_per_s']} puts/s)",
            flush=True,
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("AEGIS_")} | {
            "AEGIS_AWS_ENDPOINT_URL": emulator.url,
            "AEGIS_BUCKET": bucket,
            "AEGIS_TABLE": table,
            "AEGIS_LOG_FORMAT": "json",
            "AEGIS_LOG_LEVEL": "WARNING",
        }
        start, end = kst_day_bounds(DAY)
        aggregated = run_report(
            env,
            [
                str(SCRIPTS / "aegis"),
                "aggregate",
                "--from",
                format_ts(start),
                "--to",
                format_ts(end),
                "--factory",
                FACTORY,
                "--no-events",
            ],
        )
        show(
            "aggregate the day's 288 windows (each object read once, spread over the day)",
            aggregated,
        )
        from_windows = run_report(env)
        show("report from the windows", from_windows)
        removed = await remove(emulator.url, bucket, keys.report_prefix(DAY, FACTORY))
        removed += await remove(emulator.url, bucket, f"{keys.PROCESSED_AGG_PREFIX}{FACTORY}/")
        by_object = run_report(env)
        show("report object by object (windows and report removed)", by_object)
        again = run_report(env)
        show("re-run (hours reused)", again)
        ratio = by_object["s3_requests"] / max(1, from_windows["s3_requests"])
        print(
            f"report requests, object by object / from windows: {ratio:.1f}x"
            f" ({removed} objects removed between the two)",
            flush=True,
        )
    finally:
        emulator.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "day": DAY.isoformat(),
        "generate": generated,
        "aggregate_day": aggregated,
        "report_from_windows": from_windows,
        "report": by_object,
        "rerun": again,
        "requests_ratio_objects_vs_windows": round(ratio, 1),
        "concurrency": {"generate": args.concurrency, "report_reads": 32},
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-results/reporter.json")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--cadence", type=int, default=CADENCE_S, help="seconds between snapshots (5: a full day)"
    )
    args = parser.parse_args()
    CADENCE_S = args.cadence
    result = asyncio.run(main(args))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    exit_process(0)  # not finalized: the S3 client's threads could crash it (exit_process)
