"""``make bench``: what one ingest replica and one processor replica sustain when the backend is
not the limit.

The services run against the bench-only S3/DynamoDB responder (fastbackend/server.mjs, Node.js)
with a modelled round trip (``--rtt-ms``, default 10 ms) instead of moto_server, which serves
one request at a time and caps every figure of pipeline.py at ~40-50 messages/s. Private
Mosquitto and NATS JetStream as pipeline.py starts them; its publisher, latency probes and
service start are reused. Each round, on fresh processes:

1. ingest alone (no processor): messages published as fast as the broker takes them, until
   every raw archived event is seen: what one ingest replica sustains, its CPU per message and
   its requests per message;
2. the processor started on that backlog alone: the rate it commits LATEST at (from the first
   fifth of the backlog on, so its start-up is left out), its CPU and requests per message;
3. both, MQTT publish -> LATEST change event, as fast as possible: the sustained rate of one
   replica of each on this machine, the CPU per message of both;
4. latency p50/p95/p99 publish -> LATEST at the target rate, 250 messages/s: in every round,
   so the tail is a figure per round, not one draw (the target holds only if it holds in each);
   and in each variant's last round also at a rate just below the sustained one
   (``--latency-share``, 80 %: this VM's speed drifts by tens of per cent within minutes, and at
   90 % the processor fell behind in some runs) and at a light load (a quarter of the sustained
   rate: the round trips' floor).

Every run reports the machine's CPU split (cores used by each process, the machine's total, and
what no watched process used): this machine has 2 cores shared by Mosquitto, NATS, the
responder, the publisher and both services.

``--baseline REF`` runs the same rounds on the code of another commit, alternating (baseline,
current, baseline, current, ...): its libs/ and services/ are extracted with ``git archive``
into the temporary directory and the services started with PYTHONPATH on that copy's src
folders (ahead of the editable install); each process's log says which files it imported, and
the run stops if they are not the copy's. CPU per message is then reported as a ratio
current/baseline per round and its median, both measured in the same minutes.

The responder refusing any request (something it does not follow) or failing fails the run.
Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats

sys.path.insert(0, str(Path(__file__).parent))

from fastbackend import FastBackend, requests_of, start_fast_backend
from pipeline import Services, cpu_split, run_load
from procstat import machine_busy_s, sample

from aegis_devstack.localservers import ManagedServer, start_private_mosquitto, start_private_nats
from aegis_runtime.process import exit_process
from aegis_storage.bootstrap import bootstrap
from aegis_storage.clients import AwsConfig, open_clients

REPO = Path(__file__).resolve().parents[2]
TARGETS = {"processor_per_s": 250.0, "processor_p99_ms": 250.0, "ingest_per_s": 500.0}
WARM_MESSAGES = 200
# the processor's rate over a backlog is taken from this share of it on (start-up left out)
DRAIN_SKIP = 0.2
# a latency run at this share of the sustained rate shows the round trips' floor
LIGHT_SHARE = 0.25

# Starts a service as its console script does, after saying which files it imported (the
# baseline's processes must import the extracted copy, not the editable install).
LAUNCH = """\
import importlib, json, sys
app = importlib.import_module(sys.argv[1] + ".app")
import aegis_contracts, aegis_runtime, aegis_storage
print(json.dumps({"bench_imports": {m.__name__: m.__file__ for m in (app, aegis_contracts, aegis_runtime, aegis_storage)}}), flush=True)
sys.exit(app.main())
"""


@dataclass(frozen=True)
class Variant:
    """The code a round runs: ``current`` (this checkout) or ``baseline`` (a commit's copy)."""

    name: str
    commit: str
    root: Path  # the folder every imported AEGIS module must come from
    python_path: str | None = None


def current_variant() -> Variant:
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "libs", "services"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return Variant("current", commit + ("+changes" if dirty else ""), REPO)


def baseline_variant(ref: str, scratch: Path) -> Variant:
    """``ref``'s libs/ and services/ extracted under ``scratch`` (git archive)."""
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{ref}^{{commit}}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit, "libs", "services"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    root = scratch / f"baseline-{commit[:12]}"
    root.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        tar.extractall(root, filter="data")
    paths = sorted(str(p) for p in [*root.glob("libs/*/src"), *root.glob("services/*/src")])
    return Variant("baseline", commit, root, os.pathsep.join(paths))


class ReplicaServices(Services):
    """Services started through LAUNCH, with the variant's PYTHONPATH."""

    def __init__(
        self, mqtt: ManagedServer, nats_server: ManagedServer, endpoint: str, variant: Variant
    ) -> None:
        super().__init__(mqtt, nats_server, endpoint)
        self.variant = variant
        if variant.python_path is not None:
            self.extra_env = {"PYTHONPATH": variant.python_path}

    def command_for(self, service: str) -> list[str]:
        return [sys.executable, "-c", LAUNCH, "aegis_" + service.replace("-", "_")]


def imports_of(log: Path, variant: Variant) -> dict[str, str]:
    """The files the service logged as imported; every one must be under the variant's root."""
    for line in log.read_text(errors="replace").splitlines():
        if '"bench_imports"' in line:
            found: dict[str, str] = json.loads(line)["bench_imports"]
            stray = {m: f for m, f in found.items() if not f.startswith(str(variant.root) + "/")}
            if stray:
                raise RuntimeError(
                    f"{log.name}: the {variant.name} run imported {stray}, not files under "
                    f"{variant.root}"
                )
            return found
    raise RuntimeError(f"{log}: no bench_imports line (the service did not start?)")


def _check_responder(counters: dict[str, Any]) -> None:
    refused = sum(c["refused"] for c in counters["ops"].values())
    if refused or counters["internal"]:
        raise RuntimeError(
            f"the responder refused {refused} request(s) and failed {counters['internal']}: "
            f"{counters['refusals'][:10]}; see its log"
        )


def _per_message(requests: dict[str, int], messages: int) -> dict[str, float]:
    return {op: round(n / messages, 3) for op, n in sorted(requests.items())}


async def drain(
    svc: ReplicaServices, logs: Path, *, backlog: int, watch: dict[str, int]
) -> dict[str, Any]:
    """Start the processor on ``backlog`` raw events no one has processed yet; its rate, CPU
    per message and the machine's CPU split over the backlog from ``DRAIN_SKIP`` of it on."""
    skip = max(1, int(backlog * DRAIN_SKIP))
    seen = 0
    marks: dict[str, Any] = {}
    done = asyncio.Event()
    nc = await nats.connect(svc.nats.url)

    def mark(name: str) -> None:
        pids = {s: p.pid for s, p in svc.procs.items()} | watch
        marks[name] = (time.perf_counter(), {s: sample(pid) for s, pid in pids.items()})
        marks[name + "_busy"] = machine_busy_s()

    async def on_object(msg: Any) -> None:
        nonlocal seen
        if b"/factory_state/" in msg.data:
            seen += 1
            if seen == skip:
                mark("from")
            if seen >= backlog:
                mark("to")
                done.set()

    await nc.subscribe("aegis.objects.created.factory_state", cb=on_object)
    began = time.perf_counter()
    svc.start("processor", logs)
    await svc.ready()
    await asyncio.wait_for(done.wait(), timeout=600)
    await nc.drain()
    (t0, s0), (t1, s1) = marks["from"], marks["to"]
    counted = backlog - skip
    return {
        "backlog": backlog,
        "counted": counted,
        "seconds": t1 - t0,
        "per_second": counted / (t1 - t0),
        "start_to_last_s": t1 - began,
        "cpu_ms_per_message": {
            "processor": (s1["processor"].cpu_s - s0["processor"].cpu_s) / counted * 1000
        },
        "cpu_cores": cpu_split(s0, s1, marks["to_busy"] - marks["from_busy"], t1 - t0),
        "peak_rss_mb": {"processor": s1["processor"].peak_rss_mb},
    }


async def measure_round(
    variant: Variant,
    servers: dict[str, ManagedServer],
    backend: FastBackend,
    logs: Path,
    args: argparse.Namespace,
    latency_rates: Callable[[float], list[float]] | None = None,
) -> dict[str, Any]:
    """One round on fresh service processes (and a fresh bucket and table): ingest alone, the
    processor on ingest's backlog, both; with ``latency_rates``, then latency at the rates it
    gives for this round's sustained rate of both."""
    os.makedirs(logs, exist_ok=True)
    watch = {
        "mosquitto": servers["mqtt"].process.pid,
        "nats": servers["nats"].process.pid,
        "responder": backend.pid,
        "bench (publisher)": os.getpid(),
    }
    svc = ReplicaServices(servers["mqtt"], servers["nats"], backend.url, variant)
    async with open_clients(AwsConfig(endpoint_url=backend.url)) as c:
        await bootstrap(c, bucket=svc.bucket, table=svc.table)
    load = {"factories": args.factories, "probe": False, "watch": watch}
    out: dict[str, Any] = {"variant": variant.name, "commit": variant.commit}
    try:
        svc.start("ingest", logs)
        await svc.ready()
        out["imports"] = {"ingest": imports_of(logs / "ingest.log", variant)}
        await run_load(svc, messages=WARM_MESSAGES, rate=None, until="raw", **load)
        c0 = backend.counters()
        out["ingest"] = await run_load(svc, messages=args.messages, rate=None, until="raw", **load)
        c1 = backend.counters()
        backlog = WARM_MESSAGES + args.messages
        out["processor_alone"] = await drain(svc, logs, backlog=backlog, watch=watch)
        c2 = backend.counters()
        out["imports"]["processor"] = imports_of(logs / "processor.log", variant)
        out["both"] = await run_load(svc, messages=args.messages, rate=None, until="latest", **load)
        c3 = backend.counters()
        out["requests_per_message"] = {
            "ingest": _per_message(requests_of(c0, c1), args.messages),
            "processor": _per_message(requests_of(c1, c2), backlog),
            "both": _per_message(requests_of(c2, c3), args.messages),
        }
        # requests that waited for a 100 Continue (a round trip more each, as on AWS)
        out["continues_per_message"] = {
            "ingest": (c1["continues"] - c0["continues"]) / args.messages,
            "processor": (c2["continues"] - c1["continues"]) / backlog,
            "both": (c3["continues"] - c2["continues"]) / args.messages,
        }
        out["responder_connections"] = c3["connections"] - c0["connections"]
        # the responder's own CPU per request: it must stay far from being the limit
        out["responder_ms_per_request"] = {
            kind: run["cpu_cores"]["responder"] * run["seconds"] * 1000 / sum(requests.values())
            for kind, run, requests in (
                ("ingest_alone", out["ingest"], requests_of(c0, c1)),
                ("both", out["both"], requests_of(c2, c3)),
            )
        }
        out["latency"] = {}
        for rate in latency_rates(out["both"]["per_second"]) if latency_rates else []:
            messages = max(500, int(rate * args.latency_seconds))
            run = await run_load(svc, messages=messages, rate=rate, until="latest", **load)
            out["latency"][f"{rate:.0f}"] = {"offered_per_s": rate, **run}
        _check_responder(backend.counters())
    finally:
        svc.stop()
    return out


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    current = [r for r in rounds if r["variant"] == "current"]
    ingest = _median([r["ingest"]["per_second"] for r in current])
    both = _median([r["both"]["per_second"] for r in current])
    alone = _median([r["processor_alone"]["per_second"] for r in current])
    median_round = sorted(current, key=lambda r: r["both"]["per_second"])[len(current) // 2]
    target_key = f"{TARGETS['processor_per_s']:.0f}"
    latency = current[-1]["latency"]
    p99s = [r["latency"][target_key]["latency_ms"]["p99"] for r in current]
    summary: dict[str, Any] = {
        "ingest_per_s": ingest,
        "both_per_s": both,
        "processor_alone_per_s": alone,
        "cpu_ms_per_message": {
            "ingest": _median([r["ingest"]["cpu_ms_per_message"]["ingest"] for r in current]),
            "processor": _median([r["both"]["cpu_ms_per_message"]["processor"] for r in current]),
            "processor_alone": _median(
                [r["processor_alone"]["cpu_ms_per_message"]["processor"] for r in current]
            ),
        },
        "requests_per_message": median_round["requests_per_message"],
        "responder_ms_per_request": median_round["responder_ms_per_request"],
        "continues_per_message": median_round["continues_per_message"],
        "cpu_cores": {
            "ingest_alone": median_round["ingest"]["cpu_cores"],
            "processor_alone": median_round["processor_alone"]["cpu_cores"],
            "both": median_round["both"]["cpu_cores"],
        },
        "latency_ms": {rate: run["latency_ms"] for rate, run in latency.items()},
        "targets": {
            "ingest_per_s": {
                "target": TARGETS["ingest_per_s"],
                "measured": ingest,
                "met": ingest >= TARGETS["ingest_per_s"],
            },
            "processor_per_s": {
                "target": TARGETS["processor_per_s"],
                "measured": both,
                "met": both >= TARGETS["processor_per_s"],
            },
            "processor_p99_ms": {
                "target": TARGETS["processor_p99_ms"],
                "at_per_s": TARGETS["processor_per_s"],
                # every round's, and met only when each round's is under the target
                "rounds": p99s,
                "measured": _median(p99s),
                "worst": max(p99s),
                "met": max(p99s) < TARGETS["processor_p99_ms"],
            },
        },
    }
    baseline = [r for r in rounds if r["variant"] == "baseline"]
    if baseline:
        pairs = list(zip(baseline, current, strict=False))

        def ratios(pick: Any) -> list[float]:
            return [pick(c) / pick(b) for b, c in pairs]

        kinds = {
            "ingest": lambda r: r["ingest"]["cpu_ms_per_message"]["ingest"],
            "processor": lambda r: r["both"]["cpu_ms_per_message"]["processor"],
            "processor_alone": lambda r: r["processor_alone"]["cpu_ms_per_message"]["processor"],
            "both": lambda r: sum(r["both"]["cpu_ms_per_message"].values()),
        }
        summary["cpu_ratio_current_vs_baseline"] = {
            name: {"rounds": ratios(pick), "median": _median(ratios(pick))}
            for name, pick in kinds.items()
        }
        summary["baseline"] = {
            "commit": baseline[0]["commit"],
            "p99_ms_at_target_rounds": [
                r["latency"][target_key]["latency_ms"]["p99"] for r in baseline
            ],
            "latency_ms": {
                rate: run["latency_ms"] for rate, run in baseline[-1]["latency"].items()
            },
            "ingest_per_s": _median([r["ingest"]["per_second"] for r in baseline]),
            "both_per_s": _median([r["both"]["per_second"] for r in baseline]),
            "processor_alone_per_s": _median(
                [r["processor_alone"]["per_second"] for r in baseline]
            ),
            "cpu_ms_per_message": {
                name: _median([pick(r) for r in baseline]) for name, pick in kinds.items()
            },
        }
    return summary


def at_target_rate(_sustained: float) -> list[float]:
    return [TARGETS["processor_per_s"]]


def latency_rates_for(done: list[float], share: float) -> Callable[[float], list[float]]:
    """The latency runs' rates of a variant's last round, given the sustained rates of both
    measured so far (``done``) and of this round: ``share`` of their median, the target rate
    (every round runs that one), and a light load (a quarter of it: the round trips' floor,
    with no batch waiting for the CPU)."""

    def rates(this: float) -> list[float]:
        sustained = statistics.median([*done, this])
        below = share * sustained
        target = TARGETS["processor_per_s"]
        return [below, target, LIGHT_SHARE * sustained]

    return rates


async def main(args: argparse.Namespace) -> dict[str, Any]:
    out_dir = Path(args.out).parent
    out_dir.mkdir(parents=True, exist_ok=True)
    logs = out_dir / "replicas-logs"
    shutil.rmtree(logs, ignore_errors=True)
    scratch = Path(tempfile.mkdtemp(prefix="aegis-bench-replicas-"))
    load_before = os.getloadavg()
    started = datetime.now(UTC)
    backend = start_fast_backend(rtt_ms=args.rtt_ms, log_file=out_dir / "fastbackend.log")
    servers = {"mqtt": start_private_mosquitto(), "nats": start_private_nats()}
    rounds: list[dict[str, Any]] = []
    try:
        variants = [current_variant()]
        if args.baseline:
            variants.insert(0, baseline_variant(args.baseline, scratch))
        order = [v for _ in range(args.rounds) for v in variants]
        for i, variant in enumerate(order):
            # every round measures latency at the target rate; each variant's last round at
            # the other rates too
            last = i >= len(order) - len(variants)
            done = [r["both"]["per_second"] for r in rounds if r["variant"] == variant.name]
            result = await measure_round(
                variant,
                servers,
                backend,
                logs / f"{i + 1:02d}-{variant.name}",
                args,
                latency_rates=(
                    latency_rates_for(done, args.latency_share) if last else at_target_rate
                ),
            )
            rounds.append(result)
            print(
                f"round {i + 1}/{len(order)} {variant.name}: ingest {result['ingest']['per_second']:.0f}/s, "
                f"processor alone {result['processor_alone']['per_second']:.0f}/s, both {result['both']['per_second']:.0f}/s; "
                f"CPU ms/msg ingest {result['ingest']['cpu_ms_per_message']['ingest']:.2f}, "
                f"processor {result['both']['cpu_ms_per_message']['processor']:.2f}",
                flush=True,
            )
    finally:
        for server in servers.values():
            server.close()
        final = backend.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return {
        "when": started.isoformat(),
        "machine": {
            "cores": os.cpu_count(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        },
        "rtt_ms": args.rtt_ms,
        "messages_per_run": args.messages,
        "factories": args.factories,
        "rounds": rounds,
        "responder": {"connections": final["connections"], "ops": final["ops"]},
        "summary": summarize(rounds),
    }


def _cores(split: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in sorted(split.items(), key=lambda kv: -kv[1]))


def table(r: dict[str, Any]) -> str:
    s, t = r["summary"], r["summary"]["targets"]
    yes = {True: "met", False: "NOT met"}
    rows = [
        (
            f"ingest alone, publish -> raw archived (msg/s, {r['rtt_ms']:g} ms round trip)",
            f"{s['ingest_per_s']:.0f}",
            f"target >= {t['ingest_per_s']['target']:.0f}: {yes[t['ingest_per_s']['met']]}",
        ),
        (
            "ingest + processor, publish -> LATEST (msg/s)",
            f"{s['both_per_s']:.0f}",
            f"target >= {t['processor_per_s']['target']:.0f}: {yes[t['processor_per_s']['met']]}",
        ),
        (
            "processor alone on a backlog (msg/s)",
            f"{s['processor_alone_per_s']:.0f}",
            "the processor with the machine to itself",
        ),
    ]
    for rate, lat in s["latency_ms"].items():
        rows.append(
            (
                f"latency publish -> LATEST at {rate} msg/s p50/p95/p99 (ms)",
                "{p50:.0f} / {p95:.0f} / {p99:.0f}".format(**lat),
                "",
            )
        )
    p99 = t["processor_p99_ms"]
    rows.append(
        (
            f"  p99 at {p99['at_per_s']:.0f} msg/s, every round (ms)",
            ", ".join(f"{v:.0f}" for v in p99["rounds"]),
            f"target < {p99['target']:.0f} ms in each: {yes[p99['met']]}",
        )
    )
    cpu = s["cpu_ms_per_message"]
    rows += [
        (
            "CPU per message ingest / processor (ms)",
            f"{cpu['ingest']:.2f} / {cpu['processor']:.2f}",
            f"processor alone {cpu['processor_alone']:.2f}",
        ),
        (
            "  with a core to itself (1000 / CPU ms): ingest / processor (msg/s)",
            f"{1000 / cpu['ingest']:.0f} / {1000 / cpu['processor_alone']:.0f}",
            "each service is one Python process: one core at most",
        ),
        ("requests per message, ingest", json.dumps(s["requests_per_message"]["ingest"]), ""),
        ("requests per message, processor", json.dumps(s["requests_per_message"]["processor"]), ""),
        (
            "  of which waited for a 100 Continue, ingest / processor",
            " / ".join(f"{s['continues_per_message'][k]:.2f}" for k in ("ingest", "processor")),
            "a round trip more each (botocore's PutObject sends Expect: 100-continue)",
        ),
        (
            "responder CPU per request, ingest alone / both (ms)",
            " / ".join(f"{v:.3f}" for v in s["responder_ms_per_request"].values()),
            "its own cost: ~0.1 ms is ~10,000 requests per core-second",
        ),
        ("CPU split, ingest alone (cores)", _cores(s["cpu_cores"]["ingest_alone"]), ""),
        ("CPU split, processor alone (cores)", _cores(s["cpu_cores"]["processor_alone"]), ""),
        ("CPU split, both (cores)", _cores(s["cpu_cores"]["both"]), ""),
    ]
    if "cpu_ratio_current_vs_baseline" in s:
        b = s["baseline"]
        rows.append(
            (
                f"baseline {b['commit'][:12]}: ingest / both / processor alone (msg/s)",
                f"{b['ingest_per_s']:.0f} / {b['both_per_s']:.0f} / {b['processor_alone_per_s']:.0f}",
                "",
            )
        )
        for rate, lat in b["latency_ms"].items():
            rows.append(
                (
                    f"baseline latency at {rate} msg/s p50/p95/p99 (ms)",
                    "{p50:.0f} / {p95:.0f} / {p99:.0f}".format(**lat),
                    "",
                )
            )
        rows.append(
            (
                f"  baseline p99 at {p99['at_per_s']:.0f} msg/s, every round (ms)",
                ", ".join(f"{v:.0f}" for v in b["p99_ms_at_target_rounds"]),
                "",
            )
        )
        for name, ratio in s["cpu_ratio_current_vs_baseline"].items():
            rounds = ", ".join(f"{x:.2f}" for x in ratio["rounds"])
            rows.append(
                (
                    f"CPU per message current / baseline, {name}",
                    f"{ratio['median']:.2f}",
                    f"rounds {rounds}",
                )
            )
    width = max(len(a) for a, _, _ in rows)
    return "\n".join(f"{a:<{width}}  {b}  {c}".rstrip() for a, b, c in rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000, help="per run (ingest alone, both)")
    parser.add_argument("--rounds", type=int, default=3, help="of each variant")
    parser.add_argument("--factories", type=int, default=100)
    parser.add_argument(
        "--rtt-ms", type=float, default=10.0, help="modelled round trip of every request"
    )
    parser.add_argument(
        "--latency-seconds", type=float, default=20.0, help="length of each latency run"
    )
    parser.add_argument(
        "--latency-share",
        type=float,
        default=0.8,
        help="the latency run's rate, as a share of the sustained rate of both",
    )
    parser.add_argument(
        "--baseline", metavar="REF", help="also run the code of this git ref, alternating"
    )
    parser.add_argument("--out", default="bench-results/replicas.json")
    args = parser.parse_args()
    result = asyncio.run(main(args))
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(table(result))
    print(f"\nwritten: {args.out}")
    exit_process(0)  # not finalized: the S3 client's threads could crash it (exit_process)
