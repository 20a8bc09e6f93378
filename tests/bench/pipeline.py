"""``make bench``: the data path measured on this machine's servers (DESIGN §2-§5, issue 3).

(a) the backend ceiling: the S3/DynamoDB write rate aiobotocore reaches with high concurrency,
    divided by the calls one message needs, and the client CPU those calls cost in bulk (the floor);
(b) the baseline: the same calls one message at a time (the seed's Lambda-per-message design);
(c) AEGIS end to end, MQTT publish to LATEST visible: sustained messages/s, then latency
    p50/p95/p99 at half that rate, and the RSS of each service;
(d) CPU time per message of ingest and processor, from the processes' own accounting.

Servers: private Mosquitto and NATS JetStream (the machine's binaries on free ports) and a fresh
moto_server, so the numbers are not disturbed by other state. Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiomqtt
import nats

sys.path.insert(0, str(Path(__file__).parent))

from ceiling import SAMPLE_STATE, OpRate, measure
from procstat import sample

from aegis_contracts.ids import topic_for
from aegis_contracts.times import format_ts
from aegis_runtime.localservers import (
    ManagedServer,
    free_port,
    start_managed_server,
    start_private_mosquitto,
    start_private_nats,
)
from aegis_storage.bootstrap import bootstrap
from aegis_storage.clients import AwsConfig, open_clients
from aegis_storage.readmodel import to_attributes, to_plain

# What one factory_state message costs in storage calls on the normal path (LATEST applied):
# ingest: the raw object (put-once); processor: processed factory_state + risk_score objects,
# HISTORY put-if-absent, LATEST conditional put, the state_snapshot object. (LATEST is read only
# when the processor's copy turns out stale, which one replica never sees.)
CALLS_PER_MESSAGE = {
    "s3_put_if_none_match": 1,
    "s3_put": 3,
    "ddb_put_if_absent": 2,
}
SCRIPTS = Path(sys.executable).parent


def start_emulator() -> ManagedServer:
    """moto_server with its full garbage collections deferred: moto keeps every object in one
    Python heap, and a full collection of it stalls every request for up to a second, a pause
    that AWS does not have and that would otherwise be the whole latency tail measured here.
    Applied to the one emulator every measurement uses; stalls are still probed and reported."""
    port = free_port()
    code = (
        "import gc, sys; gc.set_threshold(700, 10, 1_000_000); "
        "from moto.server import main; "
        f"main(['-H', '127.0.0.1', '-p', '{port}'])"
    )
    return start_managed_server(
        f"http://127.0.0.1:{port}",
        [sys.executable, "-c", code],
        Path(f"/tmp/aegis-bench-moto-{port}.log"),
    )


def ceiling_of(rates: dict[str, OpRate]) -> tuple[float, float]:
    """Messages/s the backend allows, and the client CPU floor per message (ms)."""
    seconds = sum(n / rates[op].per_second for op, n in CALLS_PER_MESSAGE.items())
    cpu = sum(n * rates[op].client_cpu_ms for op, n in CALLS_PER_MESSAGE.items())
    return 1 / seconds, cpu


async def baseline(endpoint: str, seconds: float) -> float:
    """The same calls, one message at a time, no concurrency."""
    bucket, table = f"aegis-base-{uuid.uuid4().hex[:8]}", f"AEGIS-base-{uuid.uuid4().hex[:8]}"
    body = json.dumps(SAMPLE_STATE["factory_state"]).encode()
    async with open_clients(AwsConfig(endpoint_url=endpoint)) as c:
        await bootstrap(c, bucket=bucket, table=table)
        stop, n = time.perf_counter() + seconds, 0
        start = time.perf_counter()
        while time.perf_counter() < stop:
            pk = {"S": f"FACTORY#f{n % 50}"}
            await c.s3.put_object(Bucket=bucket, Key=f"raw/{n}.json", Body=body, IfNoneMatch="*")
            for kind in ("factory_state", "risk_score", "state_snapshot"):
                await c.s3.put_object(Bucket=bucket, Key=f"processed/{kind}/{n}.json", Body=body)
            state = to_attributes(to_plain(SAMPLE_STATE))
            await c.dynamodb.put_item(
                TableName=table,
                Item={**state, "pk": pk, "sk": {"S": f"HISTORY#STATE#{n:09d}"}},
                ConditionExpression="attribute_not_exists(pk)",
            )
            await c.dynamodb.put_item(
                TableName=table, Item={**state, "pk": pk, "sk": {"S": "LATEST"}}
            )
            n += 1
        return n / (time.perf_counter() - start)


class Services:
    def __init__(self, mqtt: ManagedServer, nats_server: ManagedServer, endpoint: str) -> None:
        self.uid = uuid.uuid4().hex[:8]
        self.bucket, self.table = f"aegis-bench-{self.uid}", f"AEGIS-bench-{self.uid}"
        self.mqtt, self.nats, self.endpoint = mqtt, nats_server, endpoint
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.health: dict[str, int] = {}

    def start(self, service: str, logs: Path) -> None:
        self.health[service] = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("AEGIS_")} | {
            "AEGIS_AWS_ENDPOINT_URL": self.endpoint,
            "AEGIS_BUCKET": self.bucket,
            "AEGIS_TABLE": self.table,
            "AEGIS_MQTT_URL": self.mqtt.url,
            "AEGIS_NATS_URL": self.nats.url,
            "AEGIS_LOG_FORMAT": "json",
            "AEGIS_LOG_LEVEL": "WARNING",
            "AEGIS_HEALTH_PORT": str(self.health[service]),
            "AEGIS_REFRESH_ENABLED": "false",
        }
        with (logs / f"{service}.log").open("ab") as log:
            self.procs[service] = subprocess.Popen(
                [str(SCRIPTS / f"aegis-{service}")], env=env, stdout=log, stderr=subprocess.STDOUT
            )

    def ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        for service, port in self.health.items():
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{service} not ready") from None
                    time.sleep(0.1)

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def payload(factory: str, seq: int, at: datetime) -> bytes:
    return json.dumps(
        {
            "message_id": f"{factory}-{seq:08d}",
            "factory_id": factory,
            "device_id": "edge-1",
            "emitted_at": format_ts(at),
            "schema_version": "1.0",
            "sensors": {"temperature_c": 24.5, "humidity_pct": 41.0, "co_ppm": 3.1},
            "ai": {"model_version": "yolo-8", "detections": []},
        }
    ).encode()


async def run_load(
    svc: Services, *, messages: int, rate: float | None, factories: int
) -> dict[str, Any]:
    """Publish ``messages`` (at ``rate``/s, or as fast as the broker takes them); wait until every
    one is processed; return throughput, latencies (publish -> LATEST change event) and CPU."""
    host, port = svc.mqtt.url.removeprefix("mqtt://").split(":")
    run = uuid.uuid4().hex[:4]  # fresh ids each run: repeats would be de-duplicated, not processed
    names = [f"b{svc.uid}{run}-{i}" for i in range(factories)]
    sent: dict[str, float] = {}
    latencies: list[float] = []
    timeline: list[tuple[float, float]] = []  # (sent, seconds after start; latency ms)
    processed = 0
    done = asyncio.Event()
    nc = await nats.connect(svc.nats.url)

    async def on_object(msg: Any) -> None:
        nonlocal processed
        if b"/factory_state/" in msg.data:
            processed += 1
            if processed >= messages:
                done.set()

    async def on_change(msg: Any) -> None:
        event = json.loads(msg.data)
        mid = ((event.get("new_image") or {}).get("factory_state") or {}).get("meta", {})
        sent_at = sent.pop(str(mid.get("message_id")), None)
        if sent_at is not None:
            latencies.append(time.perf_counter() - sent_at)
            timeline.append((round(sent_at - t0, 3), round(latencies[-1] * 1000, 1)))

    await nc.subscribe("aegis.objects.created.factory_state", cb=on_object)
    await nc.subscribe("aegis.changes.>", cb=on_change)
    before = {s: sample(p.pid) for s, p in svc.procs.items()}
    start_at = datetime.now(UTC)
    t0 = time.perf_counter()
    probe_stop = asyncio.Event()
    stalls: list[tuple[float, float]] = []

    async def probe_backend() -> None:
        """A tiny request to the emulator every 50 ms: when it is slow too, a slow message was
        waiting for the backend, not for AEGIS."""
        async with open_clients(AwsConfig(endpoint_url=svc.endpoint)) as c:
            while not probe_stop.is_set():
                began = time.perf_counter()
                await c.s3.head_bucket(Bucket=svc.bucket)
                took = time.perf_counter() - began
                if took > 0.1:
                    stalls.append((round(began - t0, 3), round(took * 1000, 1)))
                await asyncio.sleep(0.05)

    probe = asyncio.create_task(probe_backend())
    async with aiomqtt.Client(
        host, int(port), protocol=aiomqtt.ProtocolVersion.V5, max_inflight_messages=100
    ) as client:
        for i in range(messages):
            f = names[i % factories]
            seq = i // factories
            if rate:
                await asyncio.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
            sent[f"{f}-{seq:08d}"] = time.perf_counter()
            await client.publish(
                topic_for(f, "factory_state"),
                payload(f, seq, start_at + timedelta(milliseconds=seq)),
                qos=1,
            )
        published = time.perf_counter() - t0
        await asyncio.wait_for(done.wait(), timeout=600)
    elapsed = time.perf_counter() - t0
    after = {s: sample(p.pid) for s, p in svc.procs.items()}
    probe_stop.set()
    await probe
    await nc.drain()
    lat = sorted(latencies)

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else float("nan")

    return {
        "messages": messages,
        "publish_seconds": published,
        "seconds": elapsed,
        "per_second": messages / elapsed,
        "latency_ms": {"p50": pct(0.5), "p95": pct(0.95), "p99": pct(0.99), "n": len(lat)},
        # the slowest messages and when they were sent: a cluster means a stall, not a tail
        "slowest": sorted(timeline, key=lambda t: -t[1])[:20],
        # (seconds after start, ms) of emulator requests slower than 100 ms while the load ran
        "backend_stalls": sorted(stalls, key=lambda t: -t[1])[:20],
        "cpu_ms_per_message": {
            s: (after[s].cpu_s - before[s].cpu_s) / messages * 1000 for s in svc.procs
        },
        "rss_mb": {s: after[s].rss_mb for s in svc.procs},
        "peak_rss_mb": {s: after[s].peak_rss_mb for s in svc.procs},
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    moto = start_emulator()
    mqtt, nats_server = start_private_mosquitto(), start_private_nats()
    logs = Path(args.out).parent / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    try:
        rates = await measure(
            moto.url, seconds=args.seconds, concurrency=32, ops=tuple(CALLS_PER_MESSAGE)
        )
        ceiling, floor_ms = ceiling_of(rates)
        base = await baseline(moto.url, args.seconds)
        svc = Services(mqtt, nats_server, moto.url)
        async with open_clients(AwsConfig(endpoint_url=moto.url)) as c:
            await bootstrap(c, bucket=svc.bucket, table=svc.table)
        for service in ("ingest", "processor"):
            svc.start(service, logs)
        svc.ready()
        try:
            await run_load(svc, messages=200, rate=None, factories=args.factories)  # warm-up
            sustained = await run_load(
                svc, messages=args.messages, rate=None, factories=args.factories
            )
            half = await run_load(
                svc,
                messages=args.messages // 2,
                rate=sustained["per_second"] / 2,
                factories=args.factories,
            )
        finally:
            svc.stop()
    finally:
        mqtt.stop()
        nats_server.stop()
        moto.stop()
    cpu_total = sum(sustained["cpu_ms_per_message"].values())
    return {
        "when": datetime.now(UTC).isoformat(),
        "calls_per_message": CALLS_PER_MESSAGE,
        "backend": {k: asdict(v) for k, v in rates.items()},
        "ceiling_messages_per_s": ceiling,
        "client_cpu_floor_ms_per_message": floor_ms,
        "baseline_sequential_messages_per_s": base,
        "aegis_sustained": sustained,
        "aegis_half_rate": half,
        "targets": {
            "throughput_vs_ceiling": sustained["per_second"] / ceiling,
            "throughput_vs_baseline": sustained["per_second"] / base,
            "cpu_vs_floor": cpu_total / floor_ms,
            "p99_ms_at_half_rate": half["latency_ms"]["p99"],
            "max_rss_mb": max(sustained["peak_rss_mb"].values()),
        },
    }


def table(r: dict[str, Any]) -> str:
    s, h, t = r["aegis_sustained"], r["aegis_half_rate"], r["targets"]
    rows = [
        ("backend ceiling (msg/s, moto, all calls of one message)", f"{r['ceiling_messages_per_s']:.1f}", ""),
        ("client CPU floor (ms/msg, calls in bulk)", f"{r['client_cpu_floor_ms_per_message']:.2f}", ""),
        ("baseline, one message at a time (msg/s)", f"{r['baseline_sequential_messages_per_s']:.1f}", ""),
        ("AEGIS sustained, MQTT -> LATEST (msg/s)", f"{s['per_second']:.1f}", f"{t['throughput_vs_ceiling']:.2f} x ceiling (target >= 0.8)"),
        ("  vs baseline", f"{t['throughput_vs_baseline']:.2f} x", "target > 1"),
        ("AEGIS latency at half rate p50/p95/p99 (ms)", "{p50:.0f} / {p95:.0f} / {p99:.0f}".format(**h["latency_ms"]), "target p99 <= 500"),
        ("  emulator stalls during that run (max ms, a HEAD every 50 ms)", f"{max((ms for _, ms in h['backend_stalls']), default=0):.0f}", "a tail that coincides is the backend's"),
        ("CPU per message ingest / processor (ms)", " / ".join(f"{v:.2f}" for v in s["cpu_ms_per_message"].values()), f"{t['cpu_vs_floor']:.2f} x floor (target <= 1.15)"),
        ("peak RSS ingest / processor (MB)", " / ".join(f"{v:.0f}" for v in s["peak_rss_mb"].values()), "target < 150 each"),
    ]  # fmt: skip
    width = max(len(a) for a, _, _ in rows)
    return "\n".join(f"{a:<{width}}  {b:>16}  {c}" for a, b, c in rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--factories", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=4.0, help="per backend measurement")
    parser.add_argument("--out", default="bench-results/pipeline.json")
    args = parser.parse_args()
    result = asyncio.run(main(args))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(table(result))
    print(f"\nwritten: {args.out}")
