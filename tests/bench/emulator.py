"""``make bench``: the local emulator's memory over a long run of ``make run``'s own load.

Starts private Mosquitto and NATS servers and a moto_server of its own, runs ``aegis up`` on them
(every service, the three simulated factories: what ``make run`` runs) for ``--minutes``, and
every ``--every`` seconds reads the emulator's resident memory, the requests it has served
(``/_aegis/requests``) and the data it keeps: S3 object versions, the read model's items and
the table's stream records (a day of them, as on AWS).

The emulator must grow with the data it keeps, never with the requests it serves. Over the second
half of the run (the first is start-up and imports), the RSS it added per datum kept (an object
version, an item or a stream record) must stay under ``--bound-kb`` (a stored object costs ~6 KB,
an item ~4 KB; a Query that left 170 KB behind, or a transaction that needed a copy of the table,
pushes it far above): the script exits 1 when it does not. Prints a table and writes
JSON (``--out``). About ``--minutes`` + 1 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from procstat import sample

from aegis_devstack.localservers import (
    ManagedServer,
    free_port,
    start_moto_server,
    start_private_mosquitto,
    start_private_nats,
)
from aegis_devstack.testing.emulator import request_counts
from aegis_runtime.process import exit_process
from aegis_storage.clients import AwsClients, AwsConfig, open_client, open_clients

AEGIS = str(Path(sys.executable).parent / "aegis")
BUCKET, TABLE = "aegis-bench-emulator", "AEGIS-bench-emulator"


def served(url: str) -> int:
    """Requests the emulator has answered (every service, every operation)."""
    counts = request_counts(url, timeout=30)
    return sum(counts.total(service) for service in counts.requests)


async def stream_records(clients: AwsClients) -> int:
    """The table's stream records the emulator holds (a day of every write, as on AWS)."""
    arn = (await clients.dynamodb.describe_table(TableName=TABLE))["Table"]["LatestStreamArn"]
    async with open_client("dynamodbstreams", clients.config) as streams:
        shards = (await streams.describe_stream(StreamArn=arn))["StreamDescription"]["Shards"]
        count = 0
        for shard in shards:
            it = (
                await streams.get_shard_iterator(
                    StreamArn=arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
                )
            )["ShardIterator"]
            while it:
                page = await streams.get_records(ShardIterator=it, Limit=1000)
                count += len(page["Records"])
                it = page.get("NextShardIterator") if page["Records"] else None
        return count


async def kept(clients: AwsClients) -> tuple[int, int]:
    """S3 object versions and read-model items the emulator holds."""
    versions = 0
    pages = clients.s3.get_paginator("list_object_versions").paginate(Bucket=BUCKET)
    async for page in pages:
        versions += len(page.get("Versions", [])) + len(page.get("DeleteMarkers", []))
    items = 0
    async for page in clients.dynamodb.get_paginator("scan").paginate(
        TableName=TABLE, Select="COUNT"
    ):
        items += int(page["Count"])
    return versions, items


async def watch(
    emulator: ManagedServer, up: subprocess.Popen[bytes], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """RSS and requests served every ``--every`` s; the data kept at the middle and at the end
    only: reading every object version and stream record costs the emulator memory of its own
    (~30 MB for a few thousand), so the end's RSS is read before counting and the middle's
    again after it."""
    assert emulator.process is not None
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    half, counted = args.minutes * 30, False
    async with open_clients(AwsConfig(endpoint_url=emulator.url)) as clients:
        while (elapsed := time.monotonic() - started) < args.minutes * 60:
            await asyncio.sleep(min(args.every, args.minutes * 60 - elapsed))
            if up.poll() is not None:
                raise SystemExit(f"aegis up exited ({up.returncode})")
            row: dict[str, Any] = {
                "s": round(time.monotonic() - started),
                "rss_mb": round(sample(emulator.process.pid).rss_mb, 1),
                "requests": await asyncio.to_thread(served, emulator.url),
            }
            last = time.monotonic() - started >= args.minutes * 60
            if (not counted and row["s"] >= half) or last:
                versions, items = await kept(clients)
                row |= {
                    "object_versions": versions,
                    "items": items,
                    "stream_records": await stream_records(clients),
                    # what counting made resident is not the run's: the second half starts here
                    "rss_after_count_mb": round(sample(emulator.process.pid).rss_mb, 1),
                }
                counted = True
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def verdict(rows: list[dict[str, Any]], bound_kb: float) -> dict[str, Any]:
    """RSS added per datum and per request over the second half of the run."""
    first, last = [row for row in rows if "items" in row][-2:]
    rss_kb = (last["rss_mb"] - first["rss_after_count_mb"]) * 1024
    data = sum(last[k] - first[k] for k in ("object_versions", "items", "stream_records"))
    requests = last["requests"] - first["requests"]
    per_datum = rss_kb / max(data, 1)
    return {
        "from_s": first["s"],
        "to_s": last["s"],
        "rss_added_mb": round(rss_kb / 1024, 1),
        "data_added": data,
        "requests_served": requests,
        "kb_per_datum": round(per_datum, 2),
        "kb_per_request": round(rss_kb / max(requests, 1), 2),
        "bound_kb_per_datum": bound_kb,
        "ok": per_datum < bound_kb,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--bound-kb", type=float, default=24.0, help="RSS a datum kept may add")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="aegis-bench-emulator-"))
    started: list[ManagedServer] = []
    up: subprocess.Popen[bytes] | None = None
    try:
        mqtt, nats_server = start_private_mosquitto(), start_private_nats()
        started += [mqtt, nats_server]
        emulator = start_moto_server("127.0.0.1", free_port(), log_file=scratch / "moto.log")
        started.append(emulator)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AEGIS_")} | {
            "AEGIS_AWS_ENDPOINT_URL": emulator.url,
            "AEGIS_BUCKET": BUCKET,
            "AEGIS_TABLE": TABLE,
            "AEGIS_MQTT_URL": mqtt.url,
            "AEGIS_NATS_URL": nats_server.url,
            "AEGIS_UP_FIRST_HEALTH_PORT": "0",
            "AEGIS_DASHBOARD_PORT": str(free_port()),
        }
        with (scratch / "up.log").open("wb") as log:
            up = subprocess.Popen([AEGIS, "up"], env=env, stdout=log, stderr=subprocess.STDOUT)
        rows = asyncio.run(watch(emulator, up, args))
    finally:
        if up is not None and up.poll() is None:
            up.send_signal(signal.SIGINT)
            up.wait(60)
        for server in started:
            server.close()
        if args.out:  # aegis up's output next to the results; nothing left in the temp folder
            args.out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(scratch / "up.log", args.out.parent / "emulator-up.log")
        shutil.rmtree(scratch, ignore_errors=True)
    result = {"samples": rows, "second_half": verdict(rows, args.bound_kb)}
    print(json.dumps(result["second_half"], indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    if not result["second_half"]["ok"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
    exit_process(0)  # not finalized: the S3 client's threads could crash it (exit_process)
