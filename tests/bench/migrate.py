"""Benchmark of `aegis migrate run` against `aws s3 mv --recursive` (the AWS CLI from PyPI) on one
moto_server: the same 10,000 small objects (datasets/ -> raw/, the two-tier move) in two buckets,
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
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from procstat import sample

from aegis_devstack.localservers import MotoServer, free_port, start_moto_server
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


@dataclass(frozen=True, slots=True)
class Timing:
    seconds: float
    tool_cpu_s: float  # the tool's own CPU (user + system), all its threads and children
    server_cpu_s: float  # moto_server's CPU while the tool ran
    requests: int  # HTTP requests moto_server logged while the tool ran

    def as_dict(self, objects: int) -> dict[str, float]:
        return {
            "seconds": round(self.seconds, 2),
            "objects_per_s": round(objects / self.seconds, 1),
            "tool_cpu_ms_per_object": round(self.tool_cpu_s / objects * 1000, 2),
            "server_cpu_ms_per_object": round(self.server_cpu_s / objects * 1000, 2),
            "requests_per_object": round(self.requests / objects, 3),
        }


def process_cpu_seconds(pid: int) -> float:
    return sample(pid).cpu_s


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _logged_requests(log: Path) -> int:
    # werkzeug logs one line per request: '127.0.0.1 - - [date] "METHOD /path HTTP/1.1" status -'
    with log.open("rb") as f:
        return sum(1 for line in f if b"HTTP/1.1" in line)


def timed(cmd: list[str], env: dict[str, str], server: MotoServer) -> Timing:
    assert server.process is not None and server.log_file is not None
    pid, log = server.process.pid, server.log_file
    cpu, server_cpu, requests = _children_cpu(), process_cpu_seconds(pid), _logged_requests(log)
    started = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, cwd=ROOT)
    seconds = time.perf_counter() - started
    time.sleep(0.5)  # the last request lines reach the log
    return Timing(
        seconds,
        _children_cpu() - cpu,
        process_cpu_seconds(pid) - server_cpu,
        _logged_requests(log) - requests,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "migrate.json")
    args = parser.parse_args()
    aws = awscli()
    server = start_moto_server("127.0.0.1", free_port(), latency_ms=args.latency_ms)
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
        cli = timed(
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
            server,
        )
        aegis = timed(
            [
                str(ROOT / ".venv" / "bin" / "aegis"),
                "migrate",
                "run",
                "--preset",
                "datasets-processing",
                "--no-progress",
                "--journal",
                str(journal),
            ],
            env | {"AEGIS_BUCKET": ours},
            server,
        )
        check = {b: asyncio.run(counts(endpoint, b)) for b in (ours, theirs)}
    finally:
        server.close()
    moved = {"datasets/": 0, "raw/": args.objects}
    n = args.objects
    result: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "objects": n,
        "aws_s3_mv": cli.as_dict(n),
        "aegis_migrate": aegis.as_dict(n),
        "ratio": round(cli.seconds / aegis.seconds, 2),
        "target_ratio": 3.0,
        "both_complete": all(c == moved for c in check.values()),
        "final_counts": check,
        "note": "one moto_server (requests serialized) on this shared 2-core machine; both tools "
        "include process start-up; CPU from the processes' own accounting",
    }
    args.out.write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(
        f"{'tool':<16}{'seconds':>10}{'objects/s':>12}{'tool CPU ms/obj':>17}{'server ms/obj':>15}"
    )
    for name, t in (("aws s3 mv", cli), ("aegis migrate", aegis)):
        row = t.as_dict(n)
        print(
            f"{name:<16}{row['seconds']:>10.1f}{row['objects_per_s']:>12.1f}"
            f"{row['tool_cpu_ms_per_object']:>17.2f}{row['server_cpu_ms_per_object']:>15.2f}"
            f"{row['requests_per_object']:>14.3f}"
        )
    print(f"ratio {result['ratio']}x (target >= 3x); complete: {result['both_complete']}")
    return 0 if result["both_complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
