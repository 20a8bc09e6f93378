"""``make bench``: the client CPU of AEGIS's per-message S3 calls, per S3 client.

For each client, with the settings AEGIS gives it (aiobotocore: ``aegis_storage.clients.aio_config``;
obstore: ``aegis_storage.objectclient.s3_store``), and each call of the hot path on a 600-byte
body: the put-once of raw/ (If-None-Match: * with a SHA-256 checksum S3 keeps), a plain put
(processed/, snapshots), a GET, a HEAD (aiobotocore's with ChecksumMode=ENABLED, what
``kept_sha256`` sends; obstore's plain) and a LIST of one 100-key page. The CPU is the process's
own (os.times: user + system of every thread, so obstore's Tokio threads count), divided by the
calls; the emulator runs in a process of its own and is not counted. Calls run 16 in flight.

This machine's speed drifts within minutes: every client measures every call in each round, the
clients' order alternating from round to round, and the table gives the medians of the rounds and
each client's ratio to aiobotocore's median. Prints a table, writes JSON.

By default a fresh AEGIS emulator (aegis_devstack.motoserver, which keeps and checks checksums as
S3 does) on a free port; ``--endpoint URL`` measures against another one (test credentials).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import obstore
from aiobotocore.session import get_session

sys.path.insert(0, str(Path(__file__).parent))

from procstat import machine_busy_s

from aegis_devstack.localservers import free_port, start_moto_server
from aegis_runtime.process import exit_process
from aegis_storage.clients import AwsConfig, aio_config, emulator_credentials
from aegis_storage.objectclient import s3_store

OPS = ("put_once", "put", "get", "head", "list")
BODY_BYTES = 600
LIST_KEYS = 100
READ_KEYS = 64
METADATA = {"factory-id": "factory-bench", "source-type": "factory_state"}

Call = Callable[[int], Awaitable[object]]


@dataclass(frozen=True)
class Sample:
    client: str
    op: str
    round: int
    calls: int
    cpu_ms_per_call: float
    calls_per_s: float


def body_of(i: int) -> bytes:
    head = json.dumps({"i": i, "factory_id": "factory-bench"}).encode()
    return head + b" " * (BODY_BYTES - len(head))


def aiobotocore_calls(s3: Any, bucket: str, run: str) -> dict[str, Call]:
    async def put_object(key: str, i: int, **conditions: str) -> object:
        return await s3.put_object(
            Bucket=bucket,
            Key=key,
            Body=body_of(i),
            ContentType="application/json",
            Metadata=METADATA,
            **conditions,
        )

    async def put_once(i: int) -> object:
        key = f"raw/{run}/aiobotocore/{i}.json"
        return await put_object(key, i, IfNoneMatch="*", ChecksumAlgorithm="SHA256")

    async def put(i: int) -> object:
        return await put_object(f"processed/aiobotocore/{i % READ_KEYS}.json", i)

    async def get(i: int) -> object:
        resp = await s3.get_object(Bucket=bucket, Key=f"read/{i % READ_KEYS}.json")
        async with resp["Body"] as stream:
            return await stream.read()

    async def head(i: int) -> object:
        return await s3.head_object(
            Bucket=bucket, Key=f"read/{i % READ_KEYS}.json", ChecksumMode="ENABLED"
        )

    async def list_(_: int) -> object:
        return await s3.list_objects_v2(Bucket=bucket, Prefix="list/")

    return {"put_once": put_once, "put": put, "get": get, "head": head, "list": list_}


def obstore_calls(store: Any, run: str) -> dict[str, Call]:
    attributes = {"Content-Type": "application/json", **METADATA}

    async def put_object(key: str, i: int, mode: Any) -> object:
        return await obstore.put_async(
            store, key, body_of(i), mode=mode, attributes=attributes, use_multipart=False
        )

    async def put_once(i: int) -> object:
        return await put_object(f"raw/{run}/obstore/{i}.json", i, "create")

    async def put(i: int) -> object:
        return await put_object(f"processed/obstore/{i % READ_KEYS}.json", i, "overwrite")

    async def get(i: int) -> object:
        resp = await obstore.get_async(store, f"read/{i % READ_KEYS}.json")
        return bytes(await resp.bytes_async())

    async def head(i: int) -> object:
        return await obstore.head_async(store, f"read/{i % READ_KEYS}.json")

    async def list_(_: int) -> object:
        return [m async for batch in obstore.list(store, "list/") for m in batch]

    return {"put_once": put_once, "put": put, "get": get, "head": head, "list": list_}


async def measure(
    call: Call, ids: itertools.count[int], calls: int, concurrency: int
) -> tuple[float, float]:
    """CPU ms per call and calls/s for ``calls`` calls, ``concurrency`` in flight."""
    queue = [next(ids) for _ in range(calls)]

    async def worker() -> None:
        while queue:
            await call(queue.pop())

    before, started = os.times(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    after, wall = os.times(), time.perf_counter() - started
    cpu = (after.user - before.user) + (after.system - before.system)
    return cpu * 1000 / calls, calls / wall


async def seed(s3: Any, bucket: str) -> None:
    await s3.create_bucket(
        Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": s3.meta.region_name}
    )
    for i in range(READ_KEYS):
        await s3.put_object(
            Bucket=bucket,
            Key=f"read/{i}.json",
            Body=body_of(i),
            ContentType="application/json",
            Metadata=METADATA,
            ChecksumAlgorithm="SHA256",
        )
    for i in range(LIST_KEYS):
        await s3.put_object(Bucket=bucket, Key=f"list/{i:04d}.json", Body=body_of(i))


Extra = Callable[[AwsConfig, str, str], dict[str, Call]]


async def bench(
    cfg: AwsConfig, rounds: int, calls: int, concurrency: int, extra: dict[str, Extra] | None = None
) -> dict[str, Any]:
    """``extra``: more clients to measure beside these two (name: its calls, made from the
    settings, the bucket and the run's id)."""
    bucket = f"aegis-bench-{uuid.uuid4().hex[:8]}"
    run = uuid.uuid4().hex[:8]
    session = get_session()
    async with session.create_client(
        "s3",
        region_name=cfg.region,
        endpoint_url=cfg.endpoint_url,
        config=aio_config(cfg),
        **emulator_credentials(cfg),
    ) as s3:
        await seed(s3, bucket)
        store = s3_store(cfg, bucket, emulator_credentials(cfg))
        clients = {
            "aiobotocore": aiobotocore_calls(s3, bucket, run),
            "obstore": obstore_calls(store, run),
        } | {name: make(cfg, bucket, run) for name, make in (extra or {}).items()}
        # every call once, to check it works and to warm connections and threads
        for named in clients.values():
            for op in OPS:
                await measure(named[op], itertools.count(10_000_000), concurrency, concurrency)
        head = await s3.head_object(Bucket=bucket, Key="read/0.json", ChecksumMode="ENABLED")
        assert head.get("ChecksumSHA256"), "the emulator kept no SHA-256"
        back = await s3.head_object(
            Bucket=bucket, Key=f"raw/{run}/obstore/10000000.json", ChecksumMode="ENABLED"
        )
        assert back.get("ChecksumSHA256"), "obstore's put-once carried no SHA-256"

        ids = {name: itertools.count() for name in clients}
        samples: list[Sample] = []
        busy, started = machine_busy_s(), time.monotonic()
        for r in range(rounds):
            order = list(clients) if r % 2 == 0 else list(reversed(clients))
            for op in OPS:
                for name in order:
                    cpu, rate = await measure(clients[name][op], ids[name], calls, concurrency)
                    samples.append(Sample(name, op, r, calls, round(cpu, 4), round(rate, 1)))
                    print(
                        f"  round {r + 1}/{rounds} {op:9s} {name:12s} {cpu:.3f} ms/call "
                        f"{rate:.0f}/s",
                        flush=True,
                    )
        machine_busy = (machine_busy_s() - busy) / (time.monotonic() - started)
    return {"samples": samples, "machine_busy_cores": round(machine_busy, 2)}


def summary(samples: list[Sample]) -> dict[str, dict[str, dict[str, float]]]:
    table: dict[str, dict[str, dict[str, float]]] = {}
    for op in OPS:
        base = statistics.median(
            s.cpu_ms_per_call for s in samples if s.op == op and s.client == "aiobotocore"
        )
        table[op] = {}
        for client in sorted({s.client for s in samples}):
            mine = [s for s in samples if s.op == op and s.client == client]
            cpu = statistics.median(s.cpu_ms_per_call for s in mine)
            table[op][client] = {
                "cpu_ms_per_call": round(cpu, 3),
                "ratio_to_aiobotocore": round(cpu / base, 2),
                "calls_per_s": round(statistics.median(s.calls_per_s for s in mine), 0),
            }
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-results/s3clients.json"))
    parser.add_argument("--endpoint", help="an S3 emulator to use instead of a fresh one")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=400, help="calls per client, call and round")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()

    server = None if args.endpoint else start_moto_server(port=free_port())
    endpoint = args.endpoint or (server.url if server else "")
    try:
        cfg = AwsConfig(endpoint_url=endpoint)
        result = asyncio.run(bench(cfg, args.rounds, args.calls, args.concurrency))
    finally:
        if server is not None:
            server.stop()
    table = summary(result["samples"])
    print(f"\nclient CPU per call, ms (median of {args.rounds} rounds; ratio to aiobotocore)")
    clients = sorted(next(iter(table.values())))
    print(f"{'call':10s}" + "".join(f"{c:>24s}" for c in clients))
    for op, row in table.items():
        cells = "".join(
            f"{row[c]['cpu_ms_per_call']:>16.3f} ({row[c]['ratio_to_aiobotocore']:.2f})"
            for c in clients
        )
        print(f"{op:10s}{cells}")
    print(f"machine busy meanwhile: {result['machine_busy_cores']} of {os.cpu_count()} cores")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "busy_cores": result["machine_busy_cores"],
                    "loadavg": os.getloadavg(),
                },
                "settings": {
                    "body_bytes": BODY_BYTES,
                    "calls": args.calls,
                    "concurrency": args.concurrency,
                    "rounds": args.rounds,
                    "endpoint": "given" if args.endpoint else "fresh emulator",
                    "sha256_of_body_0": hashlib.sha256(body_of(0)).hexdigest(),
                },
                "table": table,
                "samples": [asdict(s) for s in result["samples"]],
            },
            indent=2,
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
    exit_process(0)  # not finalized: the S3 client's threads could crash it (exit_process)
