"""Benchmark of `aegis migrate run` against `aws s3 mv --recursive` (the AWS CLI from PyPI) on one
moto_server: the same 10,000 small objects (datasets/ -> raw/, seed 004's move) in two buckets,
each tool moves one bucket. Reports objects/s for both and the ratio (target >= 3x); writes JSON.

The AWS CLI is installed by this script into a venv of its own (.bench-awscli/): it pins botocore
to its release, which need not be the one aiobotocore needs. A moto_server has one core, so both
tools are measured against the same ceiling; the request count per object is what differs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aegis_runtime.localservers import free_port, start_moto_server
from aegis_storage.clients import AwsConfig, open_clients
from aegis_storage.s3 import ObjectStore

ROOT = Path(__file__).resolve().parents[2]
AWSCLI_VENV = ROOT / ".bench-awscli"
PREFIX = "datasets/country=us/category=news/date=2026-01-28/"
REGION = "ap-south-1"


def awscli() -> Path:
    exe = AWSCLI_VENV / "bin" / "aws"
    if not exe.exists():
        uv = shutil.which("uv") or "uv"
        subprocess.run([uv, "venv", "--quiet", str(AWSCLI_VENV)], check=True)
        subprocess.run(
            [
                uv,
                "pip",
                "install",
                "--quiet",
                "--python",
                str(AWSCLI_VENV / "bin" / "python"),
                "awscli",
            ],
            check=True,
        )
    return exe


async def generate(endpoint: str, buckets: list[str], count: int) -> float:
    started = time.perf_counter()
    async with open_clients(AwsConfig(endpoint_url=endpoint, max_pool_connections=32)) as clients:
        gate = asyncio.Semaphore(32)
        for bucket in buckets:
            await clients.s3.create_bucket(
                Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION}
            )
        store = {b: ObjectStore(clients.s3, b) for b in buckets}

        async def put(bucket: str, i: int) -> None:
            async with gate:
                body = json.dumps({"n": i, "pad": "x" * 64}).encode()
                await store[bucket].put_bytes(
                    f"{PREFIX}raw_{i:05d}.json", body, metadata={"n": str(i)}
                )

        async with asyncio.TaskGroup() as tasks:
            for bucket in buckets:
                for i in range(count):
                    tasks.create_task(put(bucket, i))
    return time.perf_counter() - started


async def counts(endpoint: str, bucket: str) -> dict[str, int]:
    async with open_clients(AwsConfig(endpoint_url=endpoint)) as clients:
        store = ObjectStore(clients.s3, bucket)
        return {p: len(await store.list_keys(p)) for p in ("datasets/", "raw/")}


def timed(cmd: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "migrate.json")
    args = parser.parse_args()
    aws = awscli()
    server = start_moto_server("127.0.0.1", free_port())
    try:
        endpoint = server.url
        ours, theirs = "bench-aegis-migrate", "bench-aws-s3-mv"
        gen_s = asyncio.run(generate(endpoint, [ours, theirs], args.objects))
        print(f"generated {args.objects} objects x 2 buckets in {gen_s:.1f} s", flush=True)
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": REGION,
            "AEGIS_AWS_ENDPOINT_URL": endpoint,
            "AEGIS_REGION": REGION,
        }
        journal = args.out.parent / "migrate-journal.json"
        args.out.parent.mkdir(parents=True, exist_ok=True)
        journal.unlink(missing_ok=True)
        cli_s = timed(
            [
                str(aws),
                "s3",
                "mv",
                "--recursive",
                "--only-show-errors",
                "--endpoint-url",
                endpoint,
                f"s3://{theirs}/datasets/",
                f"s3://{theirs}/raw/",
            ],
            env,
        )
        aegis_s = timed(
            [
                str(ROOT / ".venv" / "bin" / "aegis"),
                "migrate",
                "run",
                "--preset",
                "seed-004",
                "--no-progress",
                "--journal",
                str(journal),
            ],
            env | {"AEGIS_BUCKET": ours},
        )
        check = {b: asyncio.run(counts(endpoint, b)) for b in (ours, theirs)}
    finally:
        server.stop()
    moved = {"datasets/": 0, "raw/": args.objects}
    result: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "objects": args.objects,
        "aws_s3_mv": {"seconds": round(cli_s, 2), "objects_per_s": round(args.objects / cli_s, 1)},
        "aegis_migrate": {
            "seconds": round(aegis_s, 2),
            "objects_per_s": round(args.objects / aegis_s, 1),
        },
        "ratio": round(cli_s / aegis_s, 2),
        "target_ratio": 3.0,
        "both_complete": all(c == moved for c in check.values()),
        "final_counts": check,
        "note": "one moto_server (single core) on this shared 2-core machine; both tools include process start-up",
    }
    args.out.write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(f"{'tool':<16}{'seconds':>10}{'objects/s':>12}")
    print(f"{'aws s3 mv':<16}{cli_s:>10.1f}{args.objects / cli_s:>12.1f}")
    print(f"{'aegis migrate':<16}{aegis_s:>10.1f}{args.objects / aegis_s:>12.1f}")
    print(f"ratio {result['ratio']}x (target >= 3x); complete: {result['both_complete']}")
    return 0 if result["both_complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
