"""Backend ceiling and client-CPU floor: the writes one message needs, issued in bulk.

Runs as a process of its own, started by ``pipeline.py`` like a service and measured like one:
the same entry (``run_service``), the same client settings (``AegisSettings().aws()``), the same
storage adapters and calls the services make, with the very bytes and items the services wrote
for a real message (``--samples``). It reads one JSON line per measurement on stdin
(``{"op": ..., "seconds": ..., "concurrency": ...}``) and answers with one JSON line (how many
calls in how long); the bench takes its CPU from /proc, as it does for ingest and processor.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aegis_contracts.keys import factory_pk, history_state_sk
from aegis_contracts.times import format_ts
from aegis_runtime.lifecycle import run_service, settle_heap
from aegis_runtime.logging import configure
from aegis_runtime.settings import AegisSettings
from aegis_storage.bootstrap import bootstrap
from aegis_storage.clients import AwsClients, open_clients
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore

Call = Callable[[int], Awaitable[object]]


def calls(c: AwsClients, bucket: str, table: str, samples: dict[str, Any]) -> dict[str, Call]:
    """One callable per write kind, each the adapter call a service makes for one message."""
    store, readmodel = ObjectStore(c, bucket), ReadModel(c.items, table)
    run = uuid.uuid4().hex[:6]
    raw = samples["raw"]
    raw_body = raw["body"].encode()
    bodies = [(key, body.encode()) for key, body in samples["objects"].items()]
    history, latest = samples["history"], samples["latest"]
    start = datetime.now(UTC)
    # LATEST is replaced on condition that it is the version read: one item per worker slot,
    # each write naming the updated_at of the one before
    seen: dict[int, str | None] = {}

    async def s3_put_if_none_match(i: int) -> object:
        # ingest: the raw bytes under a new key, with its metadata
        return await store.put_immutable(
            f"floor/{run}/{i}/{raw['key']}", raw_body, metadata=raw["metadata"]
        )

    async def s3_put(i: int) -> object:
        # processor: processed factory_state, risk_score and state_snapshot, in turn
        key, body = bodies[i % len(bodies)]
        return await store.put_bytes(f"floor/{run}/{i}/{key}", body)

    async def ddb_put_if_absent(i: int) -> object:
        # processor: HISTORY#STATE#{updated_at}, if absent
        at = start + timedelta(milliseconds=i)
        item = {**history, "pk": f"{history['pk']}-{run}", "sk": history_state_sk(at)}
        return await readmodel.put_item(item, if_absent=True)

    async def ddb_replace_latest(i: int) -> object:
        # processor: the whole LATEST, on condition that it is still the version read
        slot = i % 64
        updated_at = format_ts(start + timedelta(milliseconds=i))
        fid = f"{latest['factory_id']}-{run}-{slot}"
        image = {**latest, "pk": factory_pk(fid), "updated_at": updated_at}
        expected, seen[slot] = seen.get(slot), updated_at
        return await readmodel.replace_latest(fid, image, expected=expected)

    return {
        "s3_put_if_none_match": s3_put_if_none_match,
        "s3_put": s3_put,
        "ddb_put_if_absent": ddb_put_if_absent,
        "ddb_replace_latest": ddb_replace_latest,
    }


async def drive(call: Call, ids: itertools.count[int], *, seconds: float, concurrency: int) -> int:
    """``concurrency`` workers issue ``call`` back to back for ``seconds``; how many completed."""
    stop = time.perf_counter() + seconds
    count = 0

    async def worker() -> None:
        nonlocal count
        while time.perf_counter() < stop:
            await call(next(ids))
            count += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return count


async def serve(endpoint: str, samples: dict[str, Any], stop: asyncio.Event) -> None:
    settings = AegisSettings(aws_endpoint_url=endpoint)
    bucket = f"aegis-floor-{uuid.uuid4().hex[:8]}"
    table = f"AEGIS-floor-{uuid.uuid4().hex[:8]}"
    loop = asyncio.get_running_loop()
    async with open_clients(settings.aws()) as c:
        await bootstrap(c, bucket=bucket, table=table)
        ops = calls(c, bucket, table, samples)
        ids = itertools.count()  # keys never repeat: the put-once keys must be new
        settle_heap()  # as the services do once they are up
        print(json.dumps({"ready": True}), flush=True)
        while not stop.is_set():
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            ask = json.loads(line)
            began = time.perf_counter()
            count = await drive(
                ops[ask["op"]], ids, seconds=ask["seconds"], concurrency=ask["concurrency"]
            )
            answer = {"op": ask["op"], "count": count, "seconds": time.perf_counter() - began}
            print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--samples", required=True, help="JSON file written by pipeline.py")
    args = parser.parse_args()
    samples = json.loads(Path(args.samples).read_text())
    configure("json", "WARNING", stream=sys.stderr)  # stdout carries the answers

    async def main(stop: asyncio.Event) -> None:
        await serve(args.endpoint, samples, stop)

    run_service(main, shutdown_timeout=5)
