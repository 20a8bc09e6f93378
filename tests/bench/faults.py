"""``make bench``: what each fault does to the data path under load, as real processes.

For every fault, a fresh bucket and table and fresh ingest and processor processes (their console
scripts) on private Mosquitto and NATS JetStream servers and the platform's S3/DynamoDB emulator,
reached through an outage proxy (:mod:`aegis_devstack.testing.outage`: it can refuse every
connection while the emulator keeps its data). Load: ``--factories`` devices each publishing one
factory_state a second (QoS 1, reconnecting and re-sending like a real device when the broker is
gone), plus a burst of ``--burst`` messages when the fault starts. The fault is held for its
duration, then the load runs 20 s more and stops. Measured from what the platform stored:

- lost: messages the devices had published (the broker took them) that never reached processed/
  (nothing more processed for 90 s);
- duplicated: messages applied to LATEST more than once (two HISTORY#STATE items of one message);
- dead-lettered: messages on the dead-letter stream (a transient fault should leave none);
- recovery: seconds from the end of the fault until every message published so far is processed;
- peak RSS of ingest and processor (the live process at the end; after a kill, the new one).

Faults: the S3/DynamoDB endpoint refusing connections for 30 s and for 5 minutes, NATS stopped for
60 s, Mosquitto restarted (ingest with a plain subscription, as one replica runs, and in a share
group, as several do), the processor and ingest SIGKILLed (started again after 1 s, as a
supervisor would).

Slack faults run the alert dispatcher too, against a Slack stand-in of the bench's own: ten
factories each report a fire when the fault starts, while Slack answers every post after 10 s,
or answers 503 for ``--slack-down-s`` (10 minutes); then ``aegis alerts resend`` sends what was
dead-lettered. Measured: alerts delivered (a fire factory named in a post Slack received: Slack
shows a message it received, whenever it answers), posts of one alert more than once, alerts
dead-lettered and resent, and the seconds from the end of the fault until every alert arrived.
Prints a table, writes JSON (``--out``). About 30 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiomqtt
import nats
import nats.js.errors
from aiohttp import web

sys.path.insert(0, str(Path(__file__).parent))

from pipeline import Services, payload
from procstat import sample

from aegis_contracts.ids import topic_for
from aegis_devstack.localservers import (
    ManagedServer,
    free_port,
    start_moto_server,
    start_private_mosquitto,
    start_private_nats,
)
from aegis_devstack.testing.devices import factory_state_message
from aegis_devstack.testing.outage import OutageProxy
from aegis_devstack.testing.processes import SCRIPTS
from aegis_runtime.process import exit_process
from aegis_storage.bootstrap import bootstrap
from aegis_storage.clients import AwsClients, AwsConfig, open_clients
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore

AFTER_S = 20.0  # load after the fault ends
CONVERGE_WITHIN_S = 600.0
STALL_S = 90.0  # nothing more processed for this long: what is missing is lost


@dataclass
class Servers:
    mqtt: ManagedServer
    nats: ManagedServer
    emulator: ManagedServer
    proxy: OutageProxy


@dataclass
class Fault:
    name: str
    begin: Callable[[Servers, Services], Awaitable[None]]
    end: Callable[[Servers, Services], Awaitable[None]]
    hold_s: float
    # ingest in a share group ($share/...): as with several replicas (else a plain subscription)
    shared: bool = False


async def _storage_down(servers: Servers, _: Services) -> None:
    servers.proxy.down()


async def _storage_up(servers: Servers, _: Services) -> None:
    servers.proxy.up()


async def _nats_down(servers: Servers, _: Services) -> None:
    servers.nats.stop()


async def _nats_up(servers: Servers, _: Services) -> None:
    servers.nats.restart()


async def _mqtt_down(servers: Servers, _: Services) -> None:
    servers.mqtt.stop()


async def _mqtt_up(servers: Servers, _: Services) -> None:
    servers.mqtt.restart()


def _kill(service: str) -> Callable[[Servers, Services], Awaitable[None]]:
    async def kill(_: Servers, svc: Services) -> None:
        proc = svc.procs[service]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    return kill


def _start(service: str, logs: Path) -> Callable[[Servers, Services], Awaitable[None]]:
    async def start(_: Servers, svc: Services) -> None:
        svc.start(service, logs)

    return start


def faults(logs: Path, long_outage_s: float) -> list[Fault]:
    return [
        Fault("S3/DynamoDB down 30 s", _storage_down, _storage_up, 30),
        Fault(
            f"S3/DynamoDB down {long_outage_s / 60:g} min",
            _storage_down,
            _storage_up,
            long_outage_s,
        ),
        Fault("NATS down 60 s", _nats_down, _nats_up, 60),
        Fault("Mosquitto restarted", _mqtt_down, _mqtt_up, 2),
        Fault("Mosquitto restarted, shared", _mqtt_down, _mqtt_up, 2, shared=True),
        Fault("processor SIGKILL", _kill("processor"), _start("processor", logs), 1),
        Fault("ingest SIGKILL", _kill("ingest"), _start("ingest", logs), 1),
    ]


@dataclass
class Devices:
    """Devices publishing QoS 1 messages; a publish the broker did not take is sent again after
    a reconnect (at least once, as a device's store-and-forward does)."""

    url: str
    published: dict[str, str] = field(default_factory=dict)  # message id -> factory
    retries: int = 0

    async def send(self, messages: list[tuple[str, str, bytes]], stop: asyncio.Event) -> None:
        host, port = self.url.removeprefix("mqtt://").split(":")
        pending = list(messages)
        while pending and not stop.is_set():
            try:
                async with aiomqtt.Client(host, int(port), timeout=5) as client:
                    while pending:
                        factory, mid, body = pending[0]
                        await client.publish(topic_for(factory, "factory_state"), body, qos=1)
                        self.published[mid] = factory
                        pending.pop(0)
            except aiomqtt.MqttError:
                self.retries += 1
                await asyncio.sleep(0.5)

    async def steady(self, factories: list[str], stop: asyncio.Event) -> None:
        seq = 0
        while not stop.is_set():
            now = datetime.now(UTC)
            batch = [(f, f"{f}-{seq:06d}", payload(f, f"{f}-{seq:06d}", now)) for f in factories]
            await self.send(batch, asyncio.Event())
            seq += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)


async def processed_ids(store: ObjectStore, factories: list[str]) -> set[str]:
    found: set[str] = set()
    for f in factories:
        for key in await store.list_keys(f"processed/{f}/risk_score/"):
            found.add(key.rsplit("/", 1)[1].removesuffix(".json"))
    return found


async def applied_twice(readmodel: ReadModel, factories: list[str]) -> int:
    now = datetime.now(UTC)
    twice = 0
    for f in factories:
        items = await readmodel.history_states(
            f, now - timedelta(hours=1), now + timedelta(hours=1), now=now
        )
        seen = Counter(
            str(i["factory_state"]["meta"]["message_id"]) for i in items if i.get("factory_state")
        )
        twice += sum(1 for n in seen.values() if n > 1)
    return twice


async def dead_letters(url: str) -> int:
    nc = await nats.connect(url)
    try:
        return int((await nc.jetstream().stream_info("AEGIS_DLQ")).state.messages)
    except nats.js.errors.NotFoundError:  # no stream yet: none
        return 0
    finally:
        await nc.close()


async def run_fault(
    servers: Servers, clients: AwsClients, fault: Fault, args: argparse.Namespace, logs: Path
) -> dict[str, Any]:
    svc = Services(servers.mqtt, servers.nats, servers.proxy.url)
    svc.extra_env = {
        # a stable client id: a restarted ingest resumes the broker's session
        "AEGIS_MQTT_CLIENT_ID": f"ingest-{svc.uid}",
        "AEGIS_MQTT_SHARE_GROUP": f"g-{svc.uid}" if fault.shared else "",
        "AEGIS_PROCESSOR_ACK_WAIT_S": "5",
    }
    await bootstrap(clients, bucket=svc.bucket, table=svc.table)
    store, readmodel = ObjectStore(clients, svc.bucket), ReadModel(clients.items, svc.table)
    try:
        return await _measure_fault(servers, svc, store, readmodel, fault, args, logs)
    finally:
        svc.stop()  # on any exit: no service outlives the bench


async def _measure_fault(
    servers: Servers,
    svc: Services,
    store: ObjectStore,
    readmodel: ReadModel,
    fault: Fault,
    args: argparse.Namespace,
    logs: Path,
) -> dict[str, Any]:
    steady = [f"s{svc.uid}-{i}" for i in range(args.factories)]
    bursty = [f"b{svc.uid}-{i}" for i in range(10)]
    dead_before = await dead_letters(servers.nats.url)
    svc.start("ingest", logs)
    svc.start("processor", logs)
    await svc.ready()
    devices, stop = Devices(servers.mqtt.url), asyncio.Event()
    load = asyncio.create_task(devices.steady(steady, stop))
    try:
        await asyncio.sleep(5)
        now = datetime.now(UTC)
        burst = [
            (f, f"{f}-{n:06d}", payload(f, f"{f}-{n:06d}", now))
            for n in range(args.burst // len(bursty))
            for f in bursty
        ]
        print(f"  {fault.name}: fault on", flush=True)
        at_begin = len(devices.published)
        await fault.begin(servers, svc)
        begun = time.monotonic()
        burst_task = asyncio.create_task(devices.send(burst, asyncio.Event()))
        await asyncio.sleep(fault.hold_s)
        await fault.end(servers, svc)
        ended = time.monotonic()
        published_by_end = dict(devices.published)
        print(f"  {fault.name}: fault off after {ended - begun:.0f} s", flush=True)
        await burst_task
        await asyncio.sleep(AFTER_S)
    finally:
        stop.set()
        await load
    wanted = set(devices.published)
    recovered: float | None = None
    everything_at: float | None = None
    deadline = time.monotonic() + CONVERGE_WITHIN_S
    done: set[str] = set()
    progress_at, seen = time.monotonic(), 0
    while time.monotonic() < deadline and time.monotonic() - progress_at < STALL_S:
        done = await processed_ids(store, steady + bursty)
        if recovered is None and set(published_by_end) <= done:
            recovered = time.monotonic() - ended
        if wanted <= done:
            everything_at = time.monotonic() - ended
            break
        if len(done) > seen:
            progress_at, seen = time.monotonic(), len(done)
        await asyncio.sleep(1)
    rss = {s: sample(p.pid).peak_rss_mb for s, p in svc.procs.items() if p.poll() is None}
    result = {
        "fault": fault.name,
        "held_s": round(ended - begun, 1),
        "published": len(wanted),
        "published_during_fault": len(published_by_end) - at_begin,
        "lost": len(wanted - done),
        "duplicated": await applied_twice(readmodel, steady + bursty),
        "dead_lettered": await dead_letters(servers.nats.url) - dead_before,
        "recovery_s": None if recovered is None else round(recovered, 1),
        "all_processed_s": None if everything_at is None else round(everything_at, 1),
        "device_reconnects": devices.retries,
        "peak_rss_mb": {k: round(v, 1) for k, v in rss.items()},
    }
    return result


class SlackStandIn:
    """Slack's incoming webhook: records every post it receives (Slack shows a message it
    received, whenever it answers); answers after ``delay_s``, or 503 while ``down``."""

    def __init__(self) -> None:
        self.delay_s = 0.0
        self.down = False
        self.received: list[tuple[float, Any]] = []
        self.refused = 0
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}/services/bench"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.down:
            self.refused += 1
            return web.Response(status=503, text="unavailable")
        self.received.append((time.monotonic(), body))
        await asyncio.sleep(self.delay_s)
        return web.Response(text="ok")

    def posts_naming(self, factory: str) -> int:
        return sum(1 for _, body in self.received if factory in json.dumps(body))


async def run_slack_fault(
    servers: Servers, clients: AwsClients, name: str, args: argparse.Namespace, logs: Path
) -> dict[str, Any]:
    slack = SlackStandIn()
    await slack.start()
    svc = Services(servers.mqtt, servers.nats, servers.emulator.url)
    svc.extra_env = {"AEGIS_SLACK_WEBHOOK_URL": slack.url, "AEGIS_LOG_LEVEL": "WARNING"}
    await bootstrap(clients, bucket=svc.bucket, table=svc.table)
    try:
        return await _measure_slack_fault(servers, svc, slack, name, args, logs)
    finally:  # on any exit: no service outlives the bench
        svc.stop()
        await slack.stop()


async def _measure_slack_fault(
    servers: Servers,
    svc: Services,
    slack: SlackStandIn,
    name: str,
    args: argparse.Namespace,
    logs: Path,
) -> dict[str, Any]:
    slow = "slow" in name
    fires = [f"f{svc.uid}-{i}" for i in range(10)]
    steady = [f"s{svc.uid}-{i}" for i in range(5)]
    dead_before = await dead_letters(servers.nats.url)
    for service in ("ingest", "processor", "alert-dispatcher"):
        svc.start(service, logs)
    await svc.ready()
    devices, stop = Devices(servers.mqtt.url), asyncio.Event()
    load = asyncio.create_task(devices.steady(steady, stop))
    resent: str = ""
    try:
        await asyncio.sleep(5)
        print(f"  {name}: fault on", flush=True)
        if slow:
            slack.delay_s = 10.0
        else:
            slack.down = True
        begun = time.monotonic()
        now = datetime.now(UTC)
        await devices.send(
            [
                (f, f"{f}-fire", factory_state_message(f, f"{f}-fire", now, fire=True))
                for f in fires
            ],
            asyncio.Event(),
        )
        await asyncio.sleep(60.0 if slow else args.slack_down_s)
        slack.delay_s, slack.down = 0.0, False
        ended = time.monotonic()
        print(f"  {name}: fault off after {ended - begun:.0f} s", flush=True)
        dead = await dead_letters(servers.nats.url) - dead_before
        if dead:  # what Slack never took: the operator resends it
            env = svc.env_for("alert-dispatcher") | {"AEGIS_LOG_LEVEL": "ERROR"}
            done = await asyncio.to_thread(
                subprocess.run,
                [str(SCRIPTS / "aegis"), "alerts", "resend"],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            resent = done.stdout.strip() or done.stderr.strip()[-300:]
        delivered_at: float | None = None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if all(slack.posts_naming(f) for f in fires):
                delivered_at = time.monotonic() - ended
                break
            await asyncio.sleep(1)
        await asyncio.sleep(5)  # a late second copy would show by now
    finally:
        stop.set()
        await load
    rss = {s: sample(p.pid).peak_rss_mb for s, p in svc.procs.items() if p.poll() is None}
    result = {
        "fault": name,
        "held_s": round(ended - begun, 1),
        "alerts": len(fires),
        "delivered": sum(1 for f in fires if slack.posts_naming(f)),
        "posted_more_than_once": sum(1 for f in fires if slack.posts_naming(f) > 1),
        "refused_posts": slack.refused,
        "dead_lettered": dead,
        "resend": resent,
        "all_delivered_s": None if delivered_at is None else round(delivered_at, 1),
        "peak_rss_mb": {k: round(v, 1) for k, v in rss.items()},
    }
    return result


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"\n{'fault':<26} {'published':>9} {'lost':>5} {'dup':>4} {'DLQ':>4} {'recovery s':>10} "
        f"{'RSS ingest/processor MB':>24}"
    )
    for r in rows:
        if "alerts" in r:
            continue
        rss = r["peak_rss_mb"]
        recovery = "-" if r["recovery_s"] is None else f"{r['recovery_s']:.1f}"
        print(
            f"{r['fault']:<26} {r['published']:>9,} {r['lost']:>5} {r['duplicated']:>4} "
            f"{r['dead_lettered']:>4} {recovery:>10} "
            f"{rss.get('ingest', 0):>11.0f} / {rss.get('processor', 0):<10.0f}"
        )

    slack = [r for r in rows if "alerts" in r]
    if slack:
        print(
            f"\n{'Slack fault':<26} {'alerts':>6} {'delivered':>9} {'twice':>5} {'DLQ':>4} "
            f"{'all delivered s':>15}  resend"
        )
    for r in slack:
        at = "-" if r["all_delivered_s"] is None else f"{r['all_delivered_s']:.1f}"
        print(
            f"{r['fault']:<26} {r['alerts']:>6} {r['delivered']:>9} "
            f"{r['posted_more_than_once']:>5} {r['dead_lettered']:>4} {at:>15}  {r['resend']}"
        )


async def run(args: argparse.Namespace, servers: Servers, logs: Path) -> list[dict[str, Any]]:
    rows = []
    slack_faults = ["Slack slow (10 s answers)", f"Slack down {args.slack_down_s / 60:g} min"]
    async with open_clients(AwsConfig(endpoint_url=servers.emulator.url)) as clients:
        for fault in faults(logs, args.long_outage_s):
            if args.only and args.only.lower() not in fault.name.lower():
                continue
            rows.append(await run_fault(servers, clients, fault, args, logs))
            print(json.dumps(rows[-1]), flush=True)
        for name in slack_faults:
            if args.only and args.only.lower() not in name.lower():
                continue
            rows.append(await run_slack_fault(servers, clients, name, args, logs))
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--factories", type=int, default=10)
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--long-outage-s", type=float, default=300.0)
    parser.add_argument("--slack-down-s", type=float, default=600.0)
    parser.add_argument("--only", default="", help="run the faults whose name contains this")
    parser.add_argument(
        "--mosquitto", default=None, help="the broker binary (default: the machine's mosquitto)"
    )
    parser.add_argument(
        "--mosquitto-persist-plugin",
        default=None,
        help="the broker's persist-sqlite plugin (Mosquitto 2.1; default: built-in persistence)",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="aegis-bench-faults-"))
    started: list[ManagedServer] = []
    proxy: OutageProxy | None = None
    try:
        mqtt = start_private_mosquitto(
            binary=args.mosquitto, persist_plugin=args.mosquitto_persist_plugin
        )
        started.append(mqtt)
        nats_server = start_private_nats()
        started.append(nats_server)
        emulator = start_moto_server("127.0.0.1", free_port(), log_file=scratch / "moto.log")
        started.append(emulator)
        proxy = OutageProxy(int(emulator.url.rsplit(":", 1)[1]))
        proxy.up()
        rows = asyncio.run(run(args, Servers(mqtt, nats_server, emulator, proxy), scratch))
    finally:
        if proxy is not None:
            proxy.close()
        for server in started:
            server.close()
        if args.out:  # the services' logs next to the results; nothing left in the temp folder
            args.out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(scratch, args.out.parent / "faults-logs", dirs_exist_ok=True)
        shutil.rmtree(scratch, ignore_errors=True)
    print_table(rows)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
    exit_process(0)  # not finalized: the S3 client's threads could crash it (exit_process)
