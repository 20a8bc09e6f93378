"""Benchmark of `aegis migrate run` against `aws s3 mv --recursive` (the AWS CLI from PyPI) on one
moto_server: the same 10,000 small objects (datasets/ -> raw/, the two-tier move) in two buckets,
each tool moves one bucket. Reports objects/s for both and the ratio (target >= 3x); writes JSON.

Two runs, each on an emulator of its own: one as fast as the emulator answers, where its single
core bounds both tools (the request count per object is what differs), and one with a modelled
round trip (``--latency-ms``, default 20: every request waits that long before the emulator
serves it, concurrent requests waiting together), where a remote S3's behaviour shows: a tool's
concurrency and its requests per object decide. Each run reports both tools' objects/s and
requests per object (counted by the emulator, per operation) and their ratios.

The AWS CLI is installed by this script into a venv of its own (.bench-awscli/): it pins botocore
to its release, which need not be the one aiobotocore needs.
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
from aegis_devstack.testing.emulator import request_counts, reset_request_counts
from aegis_runtime.process import exit_process
from aegis_storage.clients import AwsConfig, open_clients
from aegis_storage.s3 import ObjectStore

ROOT = Path(__file__).resolve().parents[2]
AWSCLI_VENV = ROOT / ".bench-awscli"
PREFIX = "datasets/country=us/category=news/date=2026-01-28/"
REGION = "ap-south-1"
AWSCLI_CONCURRENCY = 10  # `aws s3`'s default max_concurrent_requests
AEGIS_CONCURRENCY = 32  # AEGIS_MIGRATE_CONCURRENCY's default, passed as --concurrency


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
        store = {b: ObjectStore(clients, b) for b in buckets}

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
        store = ObjectStore(clients, bucket)
        return {p: len(await store.list_keys(p)) for p in ("datasets/", "raw/")}


@dataclass(frozen=True, slots=True)
class Timing:
    seconds: float
    tool_cpu_s: float  # the tool's own CPU (user + system), all its threads and children
    server_cpu_s: float  # moto_server's CPU while the tool ran
    requests: int  # AWS requests the emulator counted while the tool ran
    ops: dict[str, int]  # the same, per S3 operation
    concurrency: int  # requests the tool keeps in flight
    startup_s: float = 0.0  # the same command where there is nothing to move: its fixed cost

    def as_dict(self, objects: int) -> dict[str, Any]:
        moving = max(self.seconds - self.startup_s, 1e-3)
        return {
            "seconds": round(self.seconds, 2),
            "objects_per_s": round(objects / self.seconds, 1),
            "startup_s": round(self.startup_s, 2),
            "objects_per_s_after_startup": round(objects / moving, 1),
            "tool_cpu_ms_per_object": round(self.tool_cpu_s / objects * 1000, 2),
            "server_cpu_ms_per_object": round(self.server_cpu_s / objects * 1000, 2),
            # the emulator's CPU over the wall time: near 1, its one core is the bound
            "emulator_busy": round(self.server_cpu_s / self.seconds, 2),
            "requests_per_object": round(self.requests / objects, 3),
            "requests_by_operation": dict(sorted(self.ops.items())),
            "concurrency": self.concurrency,
        }


def process_cpu_seconds(pid: int) -> float:
    return sample(pid).cpu_s


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(
    cmd: list[str],
    env: dict[str, str],
    server: MotoServer,
    concurrency: int,
    idle: tuple[list[str], dict[str, str]],
) -> Timing:
    """Run ``cmd`` to its end; its time, CPU, the emulator's CPU and the requests it counted
    (every request is counted under the emulator's lock before it is answered). ``idle``: the
    same tool where nothing is to move, timed first: process start, imports, listings."""
    started = time.perf_counter()
    subprocess.run(idle[0], check=True, env=idle[1], stdout=subprocess.DEVNULL, cwd=ROOT)
    startup = time.perf_counter() - started
    assert server.process is not None
    pid = server.process.pid
    reset_request_counts(server.url)
    cpu, server_cpu = _children_cpu(), process_cpu_seconds(pid)
    started = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, cwd=ROOT)
    seconds = time.perf_counter() - started
    tool_cpu, used = _children_cpu() - cpu, process_cpu_seconds(pid) - server_cpu
    counted = request_counts(server.url)
    total = sum(counted.total(service) for service in counted.requests)
    return Timing(seconds, tool_cpu, used, total, counted.ops("s3"), concurrency, startup)


def measure(aws: Path, latency_ms: float, n: int, workdir: Path) -> dict[str, Any]:
    """Both tools on one fresh emulator answering after ``latency_ms``; each moves n objects."""
    server = start_moto_server("127.0.0.1", free_port(), latency_ms=latency_ms)
    try:
        endpoint = server.url
        ours, theirs, empty = "bench-aegis-migrate", "bench-aws-s3-mv", "bench-nothing-to-move"
        gen_s = asyncio.run(generate(endpoint, [ours, theirs], n))
        asyncio.run(generate(endpoint, [empty], 0))
        print(f"[{latency_ms:g} ms] generated {n} objects x 2 buckets in {gen_s:.1f} s", flush=True)
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": REGION,
            "AEGIS_AWS_ENDPOINT_URL": endpoint,
            "AEGIS_REGION": REGION,
        }
        journal = workdir / f"migrate-journal-{latency_ms:g}ms.json"
        journal.unlink(missing_ok=True)
        mv = [str(aws), "s3", "mv", "--recursive", "--only-show-errors", "--endpoint-url", endpoint]
        cli = timed(
            [*mv, f"s3://{theirs}/datasets/", f"s3://{theirs}/raw/"],
            env,
            server,
            AWSCLI_CONCURRENCY,
            idle=([*mv, f"s3://{empty}/datasets/", f"s3://{empty}/raw/"], env),
        )
        migrate = [
            str(ROOT / ".venv" / "bin" / "aegis"),
            "migrate",
            "run",
            "--preset",
            "datasets-processing",
            "--no-progress",
            "--concurrency",
            str(AEGIS_CONCURRENCY),
        ]
        idle_journal = workdir / f"migrate-journal-{latency_ms:g}ms-idle.json"
        aegis = timed(
            [*migrate, "--journal", str(journal)],
            env | {"AEGIS_BUCKET": ours},
            server,
            AEGIS_CONCURRENCY,
            idle=([*migrate, "--journal", str(idle_journal)], env | {"AEGIS_BUCKET": empty}),
        )
        idle_journal.unlink(missing_ok=True)
        check = {b: asyncio.run(counts(endpoint, b)) for b in (ours, theirs)}
    finally:
        server.close()
    moved = {"datasets/": 0, "raw/": n}
    return {
        "latency_ms": latency_ms,
        "aws_s3_mv": cli.as_dict(n),
        "aegis_migrate": aegis.as_dict(n),
        "ratios": {  # aegis migrate over aws s3 mv: how many times faster, how many fewer requests
            "objects_per_s": round(cli.seconds / aegis.seconds, 2),
            "objects_per_s_after_startup": round(
                (cli.seconds - cli.startup_s) / max(aegis.seconds - aegis.startup_s, 1e-3), 2
            ),
            "requests_per_object": round(cli.requests / aegis.requests, 2),
        },
        "both_complete": all(c == moved for c in check.values()),
        "final_counts": check,
    }


def print_run(run: dict[str, Any]) -> None:
    print(f"-- round trip {run['latency_ms']:g} ms")
    print(
        f"{'tool':<16}{'seconds':>9}{'start s':>9}{'objects/s':>11}{'net obj/s':>11}"
        f"{'req/object':>12}{'tool CPU ms/obj':>17}{'server ms/obj':>15}{'emulator busy':>15}"
    )
    for name, key in (("aws s3 mv", "aws_s3_mv"), ("aegis migrate", "aegis_migrate")):
        row = run[key]
        print(
            f"{name:<16}{row['seconds']:>9.1f}{row['startup_s']:>9.1f}"
            f"{row['objects_per_s']:>11.1f}{row['objects_per_s_after_startup']:>11.1f}"
            f"{row['requests_per_object']:>12.3f}{row['tool_cpu_ms_per_object']:>17.2f}"
            f"{row['server_cpu_ms_per_object']:>15.2f}{row['emulator_busy']:>15.2f}"
        )
    ratios = run["ratios"]
    print(
        f"ratios: objects/s {ratios['objects_per_s']}x ({ratios['objects_per_s_after_startup']}x "
        f"after start-up), requests per object {ratios['requests_per_object']}x fewer; "
        f"complete: {run['both_complete']}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=20.0,
        help="the round trip of the second run, every request delayed by it (0: no second run)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "migrate.json")
    args = parser.parse_args()
    if args.objects < 1 or args.latency_ms < 0:
        parser.error("--objects must be at least 1 and --latency-ms at least 0")
    aws = awscli()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    latencies = [0.0] + ([args.latency_ms] if args.latency_ms > 0 else [])
    runs = [measure(aws, latency, args.objects, args.out.parent) for latency in latencies]
    result: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "objects": args.objects,
        "runs": runs,
        "ratio": runs[0]["ratios"]["objects_per_s"],  # without a modelled round trip
        "target_ratio": 3.0,
        "both_complete": all(r["both_complete"] for r in runs),
        "note": "one moto_server per run (requests served one at a time; with a round trip, "
        "requests wait it out together before) on this shared 2-core machine; both tools "
        "include process start-up; CPU from the processes' own accounting; requests counted by "
        "the emulator",
    }
    args.out.write_text(json.dumps(result, indent=1), encoding="utf-8")
    for run in runs:
        print_run(run)
    return 0 if result["both_complete"] else 1


if __name__ == "__main__":
    exit_process(main())  # not finalized: the S3 client's threads could crash it
