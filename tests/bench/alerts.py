"""``make bench``: alert latency under the fleet's load, as real processes.

Ingest, the processor and the alert dispatcher (their console scripts) on private Mosquitto and
NATS JetStream servers and the S3/DynamoDB emulator; a Slack stand-in and a second receiver (a
signed webhook with two paths: ``oncall``, the policy's level 1, and ``fallback``, its fallback)
of the bench's own (:func:`aegis_devstack.testing.webhook.running_webhook`). The dispatcher runs
with an escalation file of the bench's: CRITICAL to Slack at once, to ``oncall`` after
``--escalate-after-s`` (20 s), ``fallback`` when Slack fails; the sweep every ``--tick-s`` (5 s,
the default). The fleet: ``--factories`` factories, each publishing a routine NORMAL
factory_state every 5 s (QoS 1, spread evenly over the interval). One run, in this order:

1. idle: ``--idle-fires`` fires (a factory_state with a fire detection: CRITICAL FIRE_DETECTED)
   one every 2 s with the fleet quiet, then the fleet starts;
2. under load: ``--fires`` fires at as many factories of the fleet, one every 2 s, each factory
   calm again at its next message (a RESOLVED follows). Measured: device publish -> the Slack
   stand-in receiving the post naming that factory (p50/p95/p99/max); the routine messages'
   publish -> LATEST (the platform keeps up); the dispatcher's ``alert_decisions_total`` by
   outcome: snapshots decided from the event alone (``routine``: no request) and those handled;
3. acknowledge: two factories on fire; one incident acknowledged with ``aegis incidents ack``
   (as a person would), the other left alone (the control). Measured: the ack -> the sweep
   seeing it (its ACKNOWLEDGED notification at Slack; the sweep runs a tick after the last one
   ended), the escalations ``oncall`` received for the acknowledged incident after the ack
   (must be 0) and the control's escalation, seconds after its fire;
4. Slack down (503): ``--outage-fires`` fires. Measured: fire publish -> Slack's first (refused)
   attempt -> the second receiver's first request (the fallback; or ``oncall`` when level 1 fell
   due before Slack's attempts were over: somebody was told all the same); messages
   dead-lettered (0 while a receiver works) and notifications the fallback got more than once;
5. the 1,000-factory fleet for ``--overload-s``: the routine rate offered and the rate the
   platform processed (what the emulator sustains), then everything stops.

Prints a table, writes JSON (``--out``) and the services' logs next to it. About 5 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiomqtt
import nats
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).parent))

from faults import dead_letters
from fleet import MESSAGE_INTERVAL_S, percentile
from pipeline import Services, payload
from procstat import machine_busy_s, sample

from aegis_alert_dispatcher.escalation import default_escalation_text
from aegis_contracts.ids import topic_for
from aegis_contracts.items import Incident
from aegis_contracts.keys import Dataset
from aegis_contracts.subjects import change_subject, object_created_subject
from aegis_devstack.localservers import (
    ManagedServer,
    free_port,
    start_moto_server,
    start_private_mosquitto,
    start_private_nats,
)
from aegis_devstack.testing.devices import factory_state_message
from aegis_devstack.testing.processes import SCRIPTS
from aegis_devstack.testing.waiting import eventually
from aegis_devstack.testing.webhook import FakeWebhook, Request, running_webhook
from aegis_runtime.process import exit_process
from aegis_storage.bootstrap import bootstrap
from aegis_storage.clients import AwsConfig, open_clients
from aegis_storage.incidents import IncidentStore
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore

FIRE_EVERY_S = 2.0
GOAL_P99_S = 2.0
SERVICES = ("ingest", "processor", "alert-dispatcher")
SECRET_ENV = "BENCH_WEBHOOK_SECRET"  # named by the escalation file
OVERLOAD_FACTORIES = 1000


def escalation_file(receiver_url: str, escalate_after_s: float) -> str:
    """The packaged policies, but CRITICAL's level 1 is ``oncall`` after ``escalate_after_s`` (no
    repeat) and its fallback is ``fallback``: two paths of the bench's second receiver."""
    text = default_escalation_text()
    level_1 = 'after = "5m"\nreceivers = ["slack"]\nrepeat = "30m"\n'
    if level_1 not in text or "[policies.critical]\n" not in text:
        raise RuntimeError("the packaged escalation.toml changed: adapt the bench's copy")
    text = text.replace(level_1, f'after = "{escalate_after_s:g}s"\nreceivers = ["oncall"]\n')
    text = text.replace("[policies.critical]\n", '[policies.critical]\nfallback = ["fallback"]\n')
    for name in ("oncall", "fallback"):
        text += f'\n[receivers.{name}]\ntype = "webhook"\nurl = "{receiver_url}/{name}"\n'
        text += f'secret_env = "{SECRET_ENV}"\n'
    return text


# -- the fleet -----------------------------------------------------------------------------------


@dataclass
class Fleet:
    """``factories`` each publishing a factory_state every ``interval_s``, spread evenly over the
    interval, on one MQTT connection (QoS 1): NORMAL, or a fire while a factory is ``burning``.
    ``sent`` keeps when each routine message was published (for its publish -> LATEST)."""

    client: aiomqtt.Client
    factories: list[str]
    interval_s: float = MESSAGE_INTERVAL_S
    burning: set[str] = field(default_factory=set)
    sent: dict[str, tuple[float, str]] = field(default_factory=dict)  # id -> (published, phase)
    phase: str = ""
    published: int = 0
    started: float = 0.0
    # message ids of this fleet's own: another fleet's would be duplicates of a different body
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:4])
    _seq: int = 0

    def next_slot(self, factory: str, now: float) -> float:
        """Seconds from ``now`` until ``factory``'s next message."""
        offset = self.factories.index(factory) * self.interval_s / len(self.factories)
        return (self.started + offset - now) % self.interval_s

    def calm(self, wanted: int, taken: set[str]) -> list[str]:
        """``wanted`` factories not in ``taken`` whose next message is 2 to 4 s away: a fire sent
        now is not overtaken by their next NORMAL message while it is being handled."""
        now = time.monotonic()
        found = [
            f for f in self.factories if f not in taken and 2.0 <= self.next_slot(f, now) <= 4.0
        ]
        return found[:wanted]

    async def publish(self, factory: str, *, fire: bool) -> float:
        """One message of ``factory`` now; when it was published (monotonic)."""
        self._seq += 1
        mid = f"{factory}-{self.tag}-{self._seq:08d}"
        now = datetime.now(UTC)
        body = (
            factory_state_message(factory, mid, now, fire=True)
            if fire
            else payload(factory, mid, now)
        )
        at = time.monotonic()
        if not fire:
            self.sent[mid] = (at, self.phase)
        await self.client.publish(topic_for(factory, "factory_state"), body, qos=1)
        self.published += 1
        return at

    async def run(self, stop: asyncio.Event) -> None:
        self.started = time.monotonic()
        step = self.interval_s / len(self.factories)
        n = 0
        while not stop.is_set():
            due = self.started + n * step
            if (wait := due - time.monotonic()) > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=wait)
                if stop.is_set():
                    break
            factory = self.factories[n % len(self.factories)]
            await self.publish(factory, fire=factory in self.burning)
            n += 1


@contextlib.asynccontextmanager
async def running(fleet: Fleet) -> AsyncIterator[Fleet]:
    stop = asyncio.Event()
    task = asyncio.create_task(fleet.run(stop))
    try:
        yield fleet
    finally:
        stop.set()
        await task


# -- what the platform shows ---------------------------------------------------------------------


@dataclass
class Watch:
    """Core NATS subscriptions: each LATEST change (a routine message's publish -> LATEST) and
    each state snapshot's ObjectCreated (what the dispatcher decides on)."""

    fleet: Fleet
    latest_s: dict[str, list[float]] = field(default_factory=dict)  # phase -> seconds
    applied: list[float] = field(default_factory=list)  # when each LATEST change arrived
    snapshots: Counter[str] = field(default_factory=Counter)  # phase -> state snapshots

    async def on_change(self, msg: Any) -> None:
        now = time.monotonic()
        self.applied.append(now)
        image = json.loads(msg.data).get("new_image") or {}
        mid = str(((image.get("factory_state") or {}).get("meta") or {}).get("message_id"))
        sent = self.fleet.sent.pop(mid, None)
        if sent is not None:
            self.latest_s.setdefault(sent[1], []).append(now - sent[0])

    async def on_snapshot(self, msg: Any) -> None:
        del msg
        self.snapshots[self.fleet.phase] += 1

    def applied_between(self, start: float, end: float) -> int:
        return sum(1 for t in self.applied if start <= t < end)


def scrape(port: int) -> dict[str, dict[str, float]]:
    """``alert_decisions_total`` by outcome and ``incident_sweeps_total`` by outcome."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, dict[str, float]] = {"decisions": {}, "sweeps": {}}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "aegis_alert_decisions_total":
                what = " ".join(
                    v for v in (s.labels["outcome"], s.labels["action"], s.labels["severity"]) if v
                )
                out["decisions"][what] = out["decisions"].get(what, 0) + s.value
            elif s.name == "aegis_incident_sweeps_total":
                out["sweeps"][s.labels["outcome"]] = s.value
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, int]:
    return {k: int(v - before.get(k, 0)) for k, v in sorted(after.items()) if v - before.get(k, 0)}


def names(r: Request) -> str:
    return json.dumps(r.body)


def first_post(hook: FakeWebhook, factory: str, after: float, *, text: str = "") -> Request | None:
    """The first request to ``hook`` since ``after`` naming ``factory`` (and ``text``), not a
    RESOLVED one."""
    for r in hook.requests:
        body = names(r)
        if r.at >= after and factory in body and text in body and "RESOLVED" not in body:
            return r
    return None


async def until(check: Callable[[], bool], within: float) -> bool:
    """Whether ``check`` held within ``within`` seconds (a bench reports what did not happen)."""
    try:
        await eventually(check, within=within, interval=0.1)
    except AssertionError:
        return False
    return True


def monotonic_of(at: datetime) -> float:
    """A wall-clock time of this machine (a service's) on this process's monotonic clock."""
    return time.monotonic() - (datetime.now(UTC) - at).total_seconds()


def shares(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """Cores each process kept busy over ``seconds``; ``others``: the rest of the machine's."""
    used = {k: (after[k] - before[k]) / seconds for k in before}
    used["others"] = used.pop("machine") - sum(used.values())
    return {k: round(v, 2) for k, v in used.items()}


def stats(samples: list[float]) -> dict[str, Any]:
    if not samples:
        return {"n": 0}
    return {
        "n": len(samples),
        "p50": percentile(samples, 0.5),
        "p95": percentile(samples, 0.95),
        "p99": percentile(samples, 0.99),
        "max": round(max(samples), 2),
    }


@dataclass
class Bench:
    args: argparse.Namespace
    svc: Services
    fleet: Fleet
    watch: Watch
    slack: FakeWebhook
    pager: FakeWebhook
    incidents: IncidentStore
    servers: dict[str, ManagedServer]
    used: set[str] = field(default_factory=set)
    # factories calm again (when): their RESOLVED must reach Slack before it goes down
    calmed: dict[str, float] = field(default_factory=dict)

    def metrics(self) -> dict[str, dict[str, float]]:
        return scrape(self.svc.health["alert-dispatcher"])

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of each process of the bench's, and of the whole machine."""
        pids = {s: p.pid for s, p in self.svc.procs.items()}
        pids |= {s: m.process.pid for s, m in self.servers.items() if m.process is not None}
        cpu = {s: sample(pid).cpu_s for s, pid in pids.items()}
        return cpu | {"bench": time.process_time(), "machine": machine_busy_s()}

    async def fire(self, factory: str) -> float:
        self.used.add(factory)
        return await self.fleet.publish(factory, fire=True)

    async def fires(self, count: int, *, burning: bool = False) -> dict[str, float]:
        """``count`` fires, one every 2 s, at calm factories (kept burning if ``burning``)."""
        published: dict[str, float] = {}
        for i in range(count):
            if i:
                await asyncio.sleep(FIRE_EVERY_S)
            (factory,) = self.fleet.calm(1, self.used)
            if burning:
                self.fleet.burning.add(factory)
            published[factory] = await self.fire(factory)
        return published

    async def alert_latencies(self, published: dict[str, float], within: float) -> list[float]:
        await until(lambda: all(first_post(self.slack, f, t) for f, t in published.items()), within)
        found = {f: first_post(self.slack, f, t) for f, t in published.items()}
        return [r.at - published[f] for f, r in found.items() if r is not None]

    async def open_incident(self, factory: str, within: float = 30) -> Incident:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            for incident in await self.incidents.open(now=datetime.now(UTC)):
                if incident.scope == factory:
                    return incident
            await asyncio.sleep(0.2)
        raise RuntimeError(f"no open incident of {factory} within {within} s")

    # -- the parts --------------------------------------------------------------------------

    async def idle(self) -> dict[str, Any]:
        self.fleet.phase = "idle"
        self.fleet.started = time.monotonic()  # slots as the fleet will keep them
        published = await self.fires(self.args.idle_fires)
        latencies = await self.alert_latencies(published, within=30)
        return {"fires": len(published), "latency_s": stats(latencies)}

    async def load(self) -> dict[str, Any]:
        self.fleet.phase = "settle"
        await asyncio.sleep(self.args.settle_s)
        self.fleet.phase = "load"
        before, cpu0, t0 = self.metrics(), self.cpu(), time.monotonic()
        published0 = self.fleet.published
        fired = await self.fires(self.args.fires)
        latencies = await self.alert_latencies(fired, within=30)
        await asyncio.sleep(MESSAGE_INTERVAL_S)  # the RESOLVED of the last one
        after, cpu1, t1 = self.metrics(), self.cpu(), time.monotonic()
        seconds = t1 - t0
        decisions = delta(after["decisions"], before["decisions"])
        snapshots = self.watch.snapshots["load"]
        routine = decisions.get("routine", 0)
        return {
            "factories": len(self.fleet.factories),
            "seconds": round(seconds, 1),
            "routine_messages_per_s": round(
                (self.fleet.published - published0 - len(fired)) / seconds, 1
            ),
            "fires": len(fired),
            "alerts_received": len(latencies),
            "latency_s": stats(latencies),
            "latest_s": stats(self.watch.latest_s.get("load", [])),
            # routine messages published over 5 s before the end not in LATEST at the end
            "behind_at_end": sum(1 for at, _ in self.fleet.sent.values() if at < t1 - 5),
            "state_snapshots": snapshots,
            "routine": routine,
            "handled": snapshots - routine,
            "decisions": decisions,
            "cpu_share": shares(cpu0, cpu1, seconds),
        }

    async def acknowledge(self) -> dict[str, Any]:
        self.fleet.phase = "ack"
        acked, control = self.fleet.calm(2, self.used)
        self.fleet.burning |= {acked, control}
        fired = {f: await self.fire(f) for f in (acked, control)}
        await self.alert_latencies(fired, within=30)
        incident = await self.open_incident(acked)
        control_incident = await self.open_incident(control)
        env = self.svc.env_for("alert-dispatcher") | {"AEGIS_LOG_LEVEL": "ERROR"}
        started = time.monotonic()
        done = await asyncio.to_thread(
            subprocess.run,
            [str(SCRIPTS / "aegis"), "incidents", "ack", incident.incident_id, "--as", "bench"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        returned = time.monotonic()
        if done.returncode != 0:
            raise RuntimeError(f"aegis incidents ack: {done.returncode} {done.stderr[-500:]}")
        stored = await self.incidents.get(incident.incident_id)
        assert stored is not None and stored.acknowledged_at is not None
        acked_at = monotonic_of(stored.acknowledged_at)  # the command's own clock
        # the control escalates after `after` and within a tick; both are watched that long
        wait = fired[control] + self.args.escalate_after_s + 2 * self.args.tick_s + 5
        await asyncio.sleep(max(0.0, wait - time.monotonic()))
        seen = first_post(self.slack, acked, acked_at, text="acknowledged by")
        oncall = [r for r in self.pager.requests if r.path.endswith("/oncall")]
        after_ack = [
            r
            for r in oncall
            if r.body.get("incident_id") == incident.incident_id and r.at >= acked_at
        ]
        escalated = [r for r in oncall if r.body.get("incident_id") == control_incident.incident_id]
        self.fleet.burning -= {acked, control}
        self.calmed |= dict.fromkeys((acked, control), time.monotonic())
        timeline = await self.incidents.get(incident.incident_id)
        assert timeline is not None
        return {
            "ack_command_s": round(returned - started, 2),
            "ack_to_sweep_s": None if seen is None else round(seen.at - acked_at, 2),
            "tick_s": self.args.tick_s,
            "escalations_after_ack": len(after_ack),
            "acked_state": timeline.state,
            "acked_level": timeline.level,
            "control_escalations": len(escalated),
            "control_escalated_after_fire_s": (
                round(escalated[0].at - fired[control], 2) if escalated else None
            ),
            "escalate_after_s": self.args.escalate_after_s,
        }

    async def outage(self) -> dict[str, Any]:
        self.fleet.phase = "outage"
        # the last part's RESOLVED reach Slack first (one refused now would be dead-lettered)
        await until(
            lambda: all(
                any(
                    r.at >= t and f in names(r) and "RESOLVED" in names(r)
                    for r in self.slack.requests
                )
                for f, t in self.calmed.items()
            ),
            within=60,
        )
        dead_before = await dead_letters(self.svc.nats.url)
        before, first_request = self.metrics(), len(self.slack.requests)
        self.slack.down()
        fired = await self.fires(self.args.outage_fires, burning=True)

        def told(factory: str) -> list[Request]:
            """What the second receiver got of ``factory`` (its fallback or its level 1)."""
            return [r for r in self.pager.requests if r.body.get("scope") == factory]

        await until(lambda: all(told(f) for f in fired), within=90)
        await asyncio.sleep(2 * self.args.tick_s)  # a second copy would show by now
        dead = await dead_letters(self.svc.nats.url) - dead_before
        after = self.metrics()
        self.slack.up()
        self.fleet.burning -= set(fired)
        reached, tried, by, copies, same = [], [], Counter[str](), 0, 0
        # in the order of the fires: seconds to Slack's first attempt, to the other receiver
        per_fire: list[list[Any]] = []
        # in the order of the fires: when Slack was tried, seconds after the first fire
        attempts: list[list[float]] = []
        outage_began = min(fired.values())
        for factory, at in fired.items():
            got = told(factory)
            first = first_post(self.slack, factory, at)
            if first is not None:
                tried.append(first.at - at)
            if got:
                reached.append(got[0].at - at)
                by[got[0].path.rsplit("/", 1)[1]] += 1
            per_fire.append(
                [
                    None if first is None else round(first.at - at, 2),
                    round(got[0].at - at, 2) if got else None,
                    got[0].path.rsplit("/", 1)[1] if got else None,
                ]
            )
            attempts.append(
                [
                    round(r.at - outage_began, 2)
                    for r in self.slack.requests[first_request:]
                    if factory in names(r) and r.status == 503
                ]
            )
            copies += max(0, sum(1 for r in got if r.path.endswith("/fallback")) - 1)
            deliveries = Counter(r.headers.get("X-Aegis-Delivery") for r in got)
            same += sum(n - 1 for n in deliveries.values())
        refused = [r for r in self.slack.requests[first_request:] if r.status == 503]
        return {
            "fires": len(fired),
            "reached": len(reached),
            "reached_by": dict(by),  # fallback, or oncall when level 1 fell due first
            "to_first_slack_attempt_s": stats(tried),
            "to_other_receiver_s": stats(reached),
            "per_fire_s": per_fire,
            "slack_attempts_s": attempts,
            "slack_refused": len(refused),
            "dead_lettered": dead,
            "fallback_more_than_once": copies,
            "same_notification_twice": same,
            "decisions": delta(after["decisions"], before["decisions"]),
            "sweeps": delta(after["sweeps"], before["sweeps"]),
        }


async def overload(
    bench: Bench, client: aiomqtt.Client, prefix: str, seconds: float
) -> dict[str, Any]:
    """The 1,000-factory fleet (the first of them already known): offered against processed."""
    big = Fleet(client, [f"{prefix}-{i:04d}" for i in range(OVERLOAD_FACTORIES)], phase="overload")
    bench.watch.fleet = big
    async with running(big):
        await asyncio.sleep(MESSAGE_INTERVAL_S)  # every factory met once
        start, published0, cpu0 = time.monotonic(), big.published, bench.cpu()
        await asyncio.sleep(max(0.0, seconds - MESSAGE_INTERVAL_S))
        end, published1, cpu1 = time.monotonic(), big.published, bench.cpu()
    applied = bench.watch.applied_between(start, end)
    return {
        "factories": OVERLOAD_FACTORIES,
        "seconds": round(end - start, 1),
        "offered_per_s": round((published1 - published0) / (end - start), 1),
        "processed_per_s": round(applied / (end - start), 1),
        "backlog_at_end": len(big.sent),
        "cpu_share": shares(cpu0, cpu1, end - start),
    }


async def measure(args: argparse.Namespace, servers: list[ManagedServer], logs: Path) -> Any:
    mqtt, nats_server, emulator = servers
    async with (
        running_webhook("/services/bench") as slack,
        running_webhook("") as pager,
        open_clients(AwsConfig(endpoint_url=emulator.url)) as clients,
    ):
        svc = Services(mqtt, nats_server, emulator.url)
        policies = logs / "escalation.toml"
        policies.write_text(escalation_file(pager.url, args.escalate_after_s))
        svc.extra_env = {
            "AEGIS_SLACK_WEBHOOK_URL": slack.url,
            "AEGIS_ESCALATION_FILE": str(policies),
            "AEGIS_ESCALATION_TICK_S": f"{args.tick_s:g}",
            SECRET_ENV: "bench-secret",
            "AEGIS_DASHBOARD_URL": "http://dashboard.example",
        }
        await bootstrap(clients, bucket=svc.bucket, table=svc.table)
        incidents = IncidentStore(
            ReadModel(clients.items, svc.table), ObjectStore(clients, svc.bucket)
        )
        host, port = mqtt.url.removeprefix("mqtt://").split(":")
        nc = await nats.connect(nats_server.url)
        try:
            for service in SERVICES:
                svc.start(service, logs)
            await svc.ready()
            async with aiomqtt.Client(
                host, int(port), protocol=aiomqtt.ProtocolVersion.V5, max_inflight_messages=100
            ) as client:
                prefix = f"al{svc.uid}"
                factories = [f"{prefix}-{i:04d}" for i in range(args.factories)]
                fleet = Fleet(client, factories, phase="warm-up")
                watch = Watch(fleet)
                await nc.subscribe(change_subject("factory_latest"), cb=watch.on_change)
                await nc.subscribe(
                    object_created_subject(Dataset.STATE_SNAPSHOT.value), cb=watch.on_snapshot
                )
                servers = {"mosquitto": mqtt, "nats": nats_server, "emulator": emulator}
                bench = Bench(args, svc, fleet, watch, slack, pager, incidents, servers)
                print(f"warm-up: one message from each of {len(factories)} factories", flush=True)
                for f in factories:  # every factory known before the first fire
                    await fleet.publish(f, fire=False)
                await until(lambda: not fleet.sent, within=120)
                result: dict[str, Any] = {
                    "when": datetime.now(UTC).isoformat(),
                    "cores": os.cpu_count(),
                    "load_average_1m_at_start": os.getloadavg()[0],
                }

                async def part(name: str, work: Awaitable[dict[str, Any]]) -> None:
                    print(name, flush=True)
                    result[name] = await work
                    # how busy the machine was at the end of the part (others' work too)
                    result[name]["load_average_1m"] = os.getloadavg()[0]

                await part("idle", bench.idle())
                async with running(fleet):
                    await part("load", bench.load())
                    await part("acknowledge", bench.acknowledge())
                    await part("slack_down", bench.outage())
                if args.overload_s > 0:
                    await part("overload", overload(bench, client, prefix, args.overload_s))
                result["peak_rss_mb"] = {
                    s: round(sample(p.pid).peak_rss_mb) for s, p in svc.procs.items()
                }
                return result
        finally:
            svc.stop()  # on any exit: no service outlives the bench
            await nc.close()


def rows(r: dict[str, Any]) -> Iterator[tuple[str, str]]:
    def pcts(s: dict[str, Any]) -> str:
        if not s.get("n"):
            return "-"
        return f"{s['p50']:.2f} / {s['p95']:.2f} / {s['p99']:.2f} / {s['max']:.2f} (n={s['n']})"

    def listed(values: dict[str, Any]) -> str:
        return ", ".join(f"{k} {v}" for k, v in values.items())

    load, idle, ack, down = r["load"], r["idle"], r["acknowledge"], r["slack_down"]
    fleet = f"{load['factories']} factories, {load['routine_messages_per_s']} routine msg/s"
    yield "fleet", f"{fleet}, {load['behind_at_end']} messages behind at the end"
    yield "alert latency, fleet quiet, p50/p95/p99/max s", pcts(idle["latency_s"])
    latency = pcts(load["latency_s"])
    yield "alert latency under load, p50/p95/p99/max s", f"{latency} goal p99 < {GOAL_P99_S:g}"
    yield "routine publish -> LATEST under load, s", pcts(load["latest_s"])
    snapshots = f"{load['routine']} / {load['handled']} (of {load['state_snapshots']})"
    yield "state snapshots: routine / handled", snapshots
    yield "  decisions by outcome", listed(load["decisions"])
    yield "  CPU share (cores) over the part", listed(load["cpu_share"])
    tick = f"(the sweep every {ack['tick_s']:g} s after the last one ended)"
    yield "ack -> sweep sees it (ACKNOWLEDGED at Slack), s", f"{ack['ack_to_sweep_s']} {tick}"
    yield "escalations after the ack", str(ack["escalations_after_ack"])
    level = f"(level 1 after {ack['escalate_after_s']:g} s)"
    yield "control escalated after its fire, s", f"{ack['control_escalated_after_fire_s']} {level}"
    yield "Slack down: fire -> Slack's first attempt, s", pcts(down["to_first_slack_attempt_s"])
    yield "Slack down: fire -> the other receiver, s", pcts(down["to_other_receiver_s"])
    reached = f"{down['reached']} of {down['fires']} ({listed(down['reached_by'])})"
    yield (
        "  reached / dead-lettered / fallback twice",
        (
            f"{reached} / {down['dead_lettered']} / {down['fallback_more_than_once']} "
            f"(Slack refused {down['slack_refused']} posts)"
        ),
    )
    if "overload" in r:
        o = r["overload"]
        offered = f"{o['offered_per_s']} / {o['processed_per_s']}"
        yield (
            f"{o['factories']} factories: offered / processed msg/s",
            (f"{offered} (backlog {o['backlog_at_end']})"),
        )
        yield "  CPU share (cores) over that", listed(o["cpu_share"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--factories", type=int, default=150, help="the fleet under load")
    parser.add_argument("--fires", type=int, default=20)
    parser.add_argument("--idle-fires", type=int, default=10)
    parser.add_argument("--outage-fires", type=int, default=5)
    parser.add_argument("--settle-s", type=float, default=15.0)
    parser.add_argument("--escalate-after-s", type=float, default=20.0)
    parser.add_argument("--tick-s", type=float, default=5.0, help="AEGIS_ESCALATION_TICK_S")
    parser.add_argument("--overload-s", type=float, default=30.0, help="0: not measured")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="aegis-bench-alerts-"))
    started: list[ManagedServer] = []
    try:
        started.append(start_private_mosquitto())
        started.append(start_private_nats())
        started.append(start_moto_server("127.0.0.1", free_port(), log_file=scratch / "moto.log"))
        result = asyncio.run(measure(args, started, scratch))
    finally:
        for server in started:
            server.close()
        if args.out:  # the services' logs next to the results; nothing left in the temp folder
            args.out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(scratch, args.out.parent / "alerts-logs", dirs_exist_ok=True)
        shutil.rmtree(scratch, ignore_errors=True)
    table = list(rows(result))
    width = max(len(a) for a, _ in table)
    print("\n" + "\n".join(f"{a:<{width}}  {b}" for a, b in table))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
    exit_process(0)  # not finalized: the S3 client's threads could crash it (exit_process)
