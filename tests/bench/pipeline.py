"""``make bench``: the data path measured on this machine's servers.

(a) the backend ceiling: the S3/DynamoDB write rate aiobotocore reaches with high concurrency,
    divided by the calls one message needs, and the client CPU those calls cost in bulk (the floor);
(b) the baseline: the same calls one message at a time (the Lambda-per-message design);
(c) AEGIS end to end, MQTT publish to LATEST visible: sustained messages/s, then latency
    p50/p95/p99 at half that rate, and the RSS of each service;
(d) CPU time per message of ingest and processor, from the processes' own accounting.

The floor is measured the way the services are: in a process of its own started like them
(ceiling.py), with their client settings and storage adapters, on the bytes and items they wrote
for a real message, its CPU read from /proc. This machine is a shared 2-core VM whose speed drifts
by tens of per cent within minutes, so (a) and (c) are measured in rounds, each AEGIS run between
two floors (before and after it; its ceiling and floor are their mean), and the CPU ratio is the
median of the rounds' ratios.

Servers: private Mosquitto and NATS JetStream (the machine's binaries on free ports) and a fresh
moto_server, so the numbers are not disturbed by other state. Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiomqtt
import nats

sys.path.insert(0, str(Path(__file__).parent))

from procstat import ProcSample, machine_busy_s, sample

from aegis_contracts.ids import topic_for
from aegis_contracts.keys import history_state_sk, state_snapshot_key
from aegis_contracts.subjects import RAW
from aegis_contracts.times import format_ts, parse_ts
from aegis_devstack.localservers import (
    ManagedServer,
    free_port,
    start_managed_server,
    start_private_mosquitto,
    start_private_nats,
)
from aegis_devstack.testing.processes import ServiceProcesses
from aegis_runtime.process import exit_process
from aegis_storage.bootstrap import bootstrap
from aegis_storage.clients import AwsConfig, open_clients
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore

# What one factory_state message costs in storage calls on the normal path (LATEST applied):
# ingest: the raw object (put-once); processor: processed factory_state + risk_score objects,
# HISTORY put-if-absent, LATEST conditional put, the state_snapshot object. (LATEST is read only
# when the processor's copy turns out stale, which one replica never sees.) The floor is these
# calls, whatever the services do: were they to batch some of them, the bar would stay here.
CALLS_PER_MESSAGE = {
    "s3_put_if_none_match": 1,
    "s3_put": 3,
    "ddb_put_if_absent": 1,
    "ddb_replace_latest": 1,
}
BENCH = Path(__file__).parent


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
    scratch = Path(tempfile.mkdtemp(prefix=f"aegis-bench-moto-{port}-"))
    return start_managed_server(
        f"http://127.0.0.1:{port}",
        [sys.executable, "-c", code],
        scratch / "moto.log",
        scratch=scratch,
    )


@dataclass(frozen=True)
class OpRate:
    op: str
    count: int
    seconds: float
    per_second: float
    client_cpu_ms: float


def ceiling_of(rates: dict[str, OpRate]) -> tuple[float, float]:
    """Messages/s the backend allows, and the client CPU floor per message (ms)."""
    seconds = sum(n / rates[op].per_second for op, n in CALLS_PER_MESSAGE.items())
    cpu = sum(n * rates[op].client_cpu_ms for op, n in CALLS_PER_MESSAGE.items())
    return 1 / seconds, cpu


async def samples_of(svc: Services, factory: str) -> dict[str, Any]:
    """What the services wrote for the last message of ``factory``: the raw object (bytes and
    metadata), the processed objects, the HISTORY item and LATEST; the floor writes these."""
    async with open_clients(AwsConfig(endpoint_url=svc.endpoint)) as c:
        store, readmodel = ObjectStore(c, svc.bucket), ReadModel(c.items, svc.table)
        latest = await readmodel.get_latest(factory)
        assert latest is not None, f"no LATEST for {factory}"
        at = parse_ts(str(latest["updated_at"]))
        history = await readmodel.get_item(str(latest["pk"]), history_state_sk(at))
        assert history is not None, f"no HISTORY item for {factory} at {latest['updated_at']}"
        raw_key = latest["factory_state"]["meta"]["raw_key"]
        head = await store.head(raw_key)
        assert head is not None
        mid = latest["factory_state"]["meta"]["message_id"]
        keys = [k for k in await store.list_keys(f"processed/{factory}/") if mid in k]
        keys.append(state_snapshot_key(factory, at))
        objects = {k: (await store.get_bytes(k)).decode() for k in keys}
        return {
            "raw": {
                "key": raw_key,
                "body": (await store.get_bytes(raw_key)).decode(),
                "metadata": head["Metadata"],
            },
            "objects": objects,
            "history": history,
            "latest": latest,
        }


class Floor:
    """The ceiling.py process: measures each write kind on request; its CPU comes from /proc."""

    def __init__(self, endpoint: str, samples: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(BENCH / "ceiling.py"), "--endpoint", endpoint, "--samples", str(samples)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        if json.loads(self._read()).get("ready") is not True:
            raise RuntimeError("ceiling.py did not start")

    def _read(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"ceiling.py exited ({self.proc.wait()})")
        return line

    def measure(self, op: str, *, seconds: float, concurrency: int) -> OpRate:
        assert self.proc.stdin is not None
        before = sample(self.proc.pid).cpu_s
        self.proc.stdin.write(
            json.dumps({"op": op, "seconds": seconds, "concurrency": concurrency}) + "\n"
        )
        self.proc.stdin.flush()
        answer = json.loads(self._read())
        cpu = sample(self.proc.pid).cpu_s - before
        count = answer["count"]
        return OpRate(
            op, count, answer["seconds"], count / answer["seconds"], cpu / max(count, 1) * 1000
        )

    def rates(self, *, seconds: float, concurrency: int = 32) -> dict[str, OpRate]:
        return {
            op: self.measure(op, seconds=seconds, concurrency=concurrency)
            for op in CALLS_PER_MESSAGE
        }

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()  # the worker returns at end of input
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def baseline(endpoint: str, samples: dict[str, Any], seconds: float) -> float:
    """The same calls, one message at a time, no concurrency."""
    bucket, table = f"aegis-base-{uuid.uuid4().hex[:8]}", f"AEGIS-base-{uuid.uuid4().hex[:8]}"
    raw, bodies = samples["raw"], [b.encode() for b in samples["objects"].values()]
    async with open_clients(AwsConfig(endpoint_url=endpoint)) as c:
        await bootstrap(c, bucket=bucket, table=table)
        store, readmodel = ObjectStore(c, bucket), ReadModel(c.items, table)
        stop, n = time.perf_counter() + seconds, 0
        start = time.perf_counter()
        base = datetime.now(UTC)
        while time.perf_counter() < stop:
            fid, at = f"base-{n % 50}", base + timedelta(milliseconds=n)
            await store.put_immutable(
                f"raw/{n}.json", raw["body"].encode(), metadata=raw["metadata"]
            )
            for i, body in enumerate(bodies):
                await store.put_bytes(f"processed/{i}/{n}.json", body)
            await readmodel.put_item(
                {**samples["history"], "pk": f"FACTORY#{fid}", "sk": history_state_sk(at)},
                if_absent=True,
            )
            await readmodel.put_item({**samples["latest"], "pk": f"FACTORY#{fid}"})
            n += 1
        return n / (time.perf_counter() - start)


class Services(ServiceProcesses):
    """The services of one bench run against its servers, a bucket and a table of its own."""

    def __init__(self, mqtt: ManagedServer, nats_server: ManagedServer, endpoint: str) -> None:
        self.uid = uuid.uuid4().hex[:8]
        self.bucket, self.table = f"aegis-bench-{self.uid}", f"AEGIS-bench-{self.uid}"
        self.mqtt, self.nats, self.endpoint = mqtt, nats_server, endpoint
        super().__init__(
            {
                "AEGIS_AWS_ENDPOINT_URL": endpoint,
                "AEGIS_BUCKET": self.bucket,
                "AEGIS_TABLE": self.table,
                "AEGIS_MQTT_URL": mqtt.url,
                "AEGIS_NATS_URL": nats_server.url,
                "AEGIS_LOG_FORMAT": "json",
                "AEGIS_LOG_LEVEL": "WARNING",
                "AEGIS_REFRESH_ENABLED": "false",
            }
        )


def payload(factory: str, message_id: str, at: datetime) -> bytes:
    return json.dumps(
        {
            "message_id": message_id,
            "factory_id": factory,
            "device_id": "edge-1",
            "emitted_at": format_ts(at),
            "schema_version": "1.0",
            "sensors": {"temperature_c": 24.5, "humidity_pct": 41.0, "co_ppm": 3.1},
            "ai": {"model_version": "yolo-8", "detections": []},
        }
    ).encode()


def percentiles_ms(seconds: list[float]) -> dict[str, float]:
    """p50/p95/p99 (ms) of latencies given in seconds, and how many there were."""
    lat = sorted(seconds)

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else float("nan")

    return {"p50": pct(0.5), "p95": pct(0.95), "p99": pct(0.99), "n": len(lat)}


def cpu_split(
    before: dict[str, ProcSample], after: dict[str, ProcSample], busy: float, seconds: float
) -> dict[str, float]:
    """Cores each watched process used over ``seconds``, the machine's busy cores (``machine``,
    every process on it) and what no watched process used (``other``)."""
    cores = {name: (after[name].cpu_s - before[name].cpu_s) / seconds for name in after}
    cores["machine"] = busy / seconds
    cores["other"] = cores["machine"] - sum(v for k, v in cores.items() if k != "machine")
    return cores


async def run_load(
    svc: Services,
    *,
    messages: int,
    rate: float | None,
    factories: int,
    until: str = "latest",
    probe: bool = True,
    watch: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Publish ``messages`` (at ``rate``/s, or as fast as the broker takes them); wait until every
    one is processed; return throughput, latencies and CPU. ``until``: ``latest`` waits for the
    processor (latency: publish -> LATEST change event), ``raw`` for ingest alone (publish -> raw
    archived event). ``probe``: time a tiny backend request every 50 ms. ``watch``: more
    processes (name -> pid) whose CPU is reported with the services' as ``cpu_cores``."""
    host, port = svc.mqtt.url.removeprefix("mqtt://").split(":")
    run = uuid.uuid4().hex[:4]  # fresh ids each run: repeats would be de-duplicated, not processed
    # the same fleet in every run, as a processor that keeps running sees it: it reads a factory's
    # LATEST once, at the first message of a factory it has not met (new names in every round
    # made one message in ten pay that read, which a steady fleet never does)
    names = [f"b{svc.uid}-{i}" for i in range(factories)]
    sent: dict[str, float] = {}
    latencies: list[float] = []
    timeline: list[tuple[float, float]] = []  # (sent, seconds after start; latency ms)
    processed = 0
    done = asyncio.Event()
    nc = await nats.connect(svc.nats.url)

    def arrived(message_id: object) -> None:
        sent_at = sent.pop(str(message_id), None)
        if sent_at is not None:
            latencies.append(time.perf_counter() - sent_at)
            timeline.append((round(sent_at - t0, 3), round(latencies[-1] * 1000, 1)))

    async def on_object(msg: Any) -> None:
        nonlocal processed
        if b"/factory_state/" in msg.data:
            processed += 1
            if processed >= messages:
                done.set()

    async def on_change(msg: Any) -> None:
        event = json.loads(msg.data)
        arrived(
            ((event.get("new_image") or {}).get("factory_state") or {})
            .get("meta", {})
            .get("message_id")
        )

    async def on_raw(msg: Any) -> None:
        nonlocal processed
        event = json.loads(msg.data)
        if event.get("source_type") == "factory_state" and str(event.get("message_id")) in sent:
            processed += 1
            arrived(event.get("message_id"))
            if processed >= messages:
                done.set()

    if until == "latest":
        await nc.subscribe("aegis.objects.created.factory_state", cb=on_object)
        await nc.subscribe("aegis.changes.>", cb=on_change)
    elif until == "raw":
        await nc.subscribe(f"{RAW}.>", cb=on_raw)
    else:
        raise ValueError(f"until must be latest or raw, not {until!r}")
    pids = {s: p.pid for s, p in svc.procs.items()} | (watch or {})
    before = {s: sample(pid) for s, pid in pids.items()}
    busy_before = machine_busy_s()
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

    probing = asyncio.create_task(probe_backend()) if probe else None
    async with aiomqtt.Client(
        host, int(port), protocol=aiomqtt.ProtocolVersion.V5, max_inflight_messages=100
    ) as client:
        for i in range(messages):
            f = names[i % factories]
            seq = i // factories
            if rate:
                await asyncio.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
            mid = f"{f}-{run}-{seq:08d}"
            sent[mid] = time.perf_counter()
            await client.publish(
                topic_for(f, "factory_state"),
                payload(f, mid, start_at + timedelta(milliseconds=seq)),
                qos=1,
            )
        published = time.perf_counter() - t0
        await asyncio.wait_for(done.wait(), timeout=600)
    elapsed = time.perf_counter() - t0
    after = {s: sample(pid) for s, pid in pids.items()}
    busy = machine_busy_s() - busy_before
    probe_stop.set()
    if probing is not None:
        await probing
    await nc.drain()
    result = {
        "messages": messages,
        "sample_factory": names[0],
        "publish_seconds": published,
        "seconds": elapsed,
        "per_second": messages / elapsed,
        "latency_ms": percentiles_ms(latencies),
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
    if watch:
        result["cpu_cores"] = cpu_split(before, after, busy, elapsed)
    return result


def _median_run(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The run whose ``key`` is the median (the upper one of an even count)."""
    return sorted(runs, key=lambda r: r[key])[len(runs) // 2]


async def main(args: argparse.Namespace) -> dict[str, Any]:
    moto = start_emulator()
    mqtt, nats_server = start_private_mosquitto(), start_private_nats()
    logs = Path(args.out).parent / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    floor: Floor | None = None
    try:
        svc = Services(mqtt, nats_server, moto.url)
        async with open_clients(AwsConfig(endpoint_url=moto.url)) as c:
            await bootstrap(c, bucket=svc.bucket, table=svc.table)
        for service in ("ingest", "processor"):
            svc.start(service, logs)
        await svc.ready()
        try:
            warm = await run_load(svc, messages=200, rate=None, factories=args.factories)
            samples = await samples_of(svc, warm["sample_factory"])
            samples_file = Path(args.out).parent / "floor-samples.json"
            samples_file.write_text(json.dumps(samples, indent=2))
            floor = Floor(moto.url, samples_file)
            floor.rates(seconds=1)  # warm-up: connections, code paths
            base = await baseline(moto.url, samples, args.seconds)
            rounds = []
            # the floor right before and right after each run (the one after a run is the one
            # before the next), a run compared with their mean: the machine's speed drifts
            # within a round, and a floor taken on one side only carried that drift whole
            rates = floor.rates(seconds=args.seconds)
            for _ in range(args.rounds):
                run = await run_load(
                    svc, messages=args.messages, rate=None, factories=args.factories
                )
                after = floor.rates(seconds=args.seconds)
                sides = [ceiling_of(rates), ceiling_of(after)]
                ceiling = statistics.mean(c for c, _ in sides)
                floor_ms = statistics.mean(f for _, f in sides)
                cpu = sum(run["cpu_ms_per_message"].values())
                rounds.append(
                    {
                        "backend": {k: asdict(v) for k, v in rates.items()},
                        "backend_after": {k: asdict(v) for k, v in after.items()},
                        "floor_ms_before_after": [f for _, f in sides],
                        "ceiling_messages_per_s": ceiling,
                        "client_cpu_floor_ms_per_message": floor_ms,
                        "aegis": run,
                        "aegis_cpu_ms_per_message": cpu,
                        "cpu_vs_floor": cpu / floor_ms,
                        "throughput_vs_ceiling": run["per_second"] / ceiling,
                    }
                )
                rates = after
            sustained = _median_run(rounds, "cpu_vs_floor")
            half = await run_load(
                svc,
                messages=args.messages // 2,
                rate=statistics.median(r["aegis"]["per_second"] for r in rounds) / 2,
                factories=args.factories,
            )
        finally:
            svc.stop()
    finally:
        if floor is not None:
            floor.stop()
        mqtt.close()
        nats_server.close()
        moto.close()
    ceiling = statistics.median(r["ceiling_messages_per_s"] for r in rounds)
    per_second = statistics.median(r["aegis"]["per_second"] for r in rounds)
    return {
        "when": datetime.now(UTC).isoformat(),
        "calls_per_message": CALLS_PER_MESSAGE,
        "rounds": rounds,
        "ceiling_messages_per_s": ceiling,
        "client_cpu_floor_ms_per_message": sustained["client_cpu_floor_ms_per_message"],
        "baseline_sequential_messages_per_s": base,
        "aegis_sustained": sustained["aegis"],
        "aegis_half_rate": half,
        "targets": {
            "throughput_vs_ceiling": per_second / ceiling,
            "throughput_vs_baseline": per_second / base,
            "cpu_vs_floor": sustained["cpu_vs_floor"],
            "cpu_vs_floor_rounds": [r["cpu_vs_floor"] for r in rounds],
            "p99_ms_at_half_rate": half["latency_ms"]["p99"],
            "max_rss_mb": max(
                max(r["aegis"]["peak_rss_mb"].values()) for r in [*rounds, {"aegis": half}]
            ),
        },
    }


def table(r: dict[str, Any]) -> str:
    s, h, t = r["aegis_sustained"], r["aegis_half_rate"], r["targets"]
    per_s = statistics.median(x["aegis"]["per_second"] for x in r["rounds"])
    ratios = ", ".join(f"{x:.2f}" for x in t["cpu_vs_floor_rounds"])
    rows = [
        ("backend ceiling (msg/s, moto, all calls of one message)", f"{r['ceiling_messages_per_s']:.1f}", ""),
        ("client CPU floor (ms/msg, calls in bulk; of the median round)", f"{r['client_cpu_floor_ms_per_message']:.2f}", ""),
        ("baseline, one message at a time (msg/s)", f"{r['baseline_sequential_messages_per_s']:.1f}", ""),
        ("AEGIS sustained, MQTT -> LATEST (msg/s, median of rounds)", f"{per_s:.1f}", f"{t['throughput_vs_ceiling']:.2f} x ceiling (target >= 0.8)"),
        ("  vs baseline", f"{t['throughput_vs_baseline']:.2f} x", "target > 1"),
        ("AEGIS latency at half rate p50/p95/p99 (ms)", "{p50:.0f} / {p95:.0f} / {p99:.0f}".format(**h["latency_ms"]), "target p99 <= 500"),
        ("  emulator stalls during that run (max ms, a HEAD every 50 ms)", f"{max((ms for _, ms in h['backend_stalls']), default=0):.0f}", "a tail that coincides is the backend's"),
        ("CPU per message ingest / processor (ms; the median round)", " / ".join(f"{v:.2f}" for v in s["cpu_ms_per_message"].values()), f"{t['cpu_vs_floor']:.2f} x floor (target <= 1.15)"),
        ("  CPU vs floor, each round", ratios, ""),
        ("peak RSS ingest / processor (MB)", " / ".join(f"{v:.0f}" for v in h["peak_rss_mb"].values()), "target < 150 each"),
    ]  # fmt: skip
    width = max(len(a) for a, _, _ in rows)
    return "\n".join(f"{a:<{width}}  {b:>16}  {c}" for a, b, c in rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1500, help="per sustained round")
    parser.add_argument("--rounds", type=int, default=3, help="floor + sustained run, each")
    parser.add_argument("--factories", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=3.0, help="per write kind and round")
    parser.add_argument("--out", default="bench-results/pipeline.json")
    args = parser.parse_args()
    result = asyncio.run(main(args))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(table(result))
    print(f"\nwritten: {args.out}")
    exit_process(0)  # not finalized: the S3 client's threads could crash it (exit_process)
