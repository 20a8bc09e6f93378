"""What the README promises for `make run`: the local stack, every service and the simulator, and
`aegis status` shows factory-a, factory-b and factory-c, and the cloud collectors' first
snapshots (how soon is measured, not asserted: ~20 s on a slow 2-core machine, see
docs/benchmarks.md; the wait's bound only keeps a stack that never shows them from hanging).
On an emulator of its own, whose request counts show that over the whole run (bootstrap, every
service's first ticks, the dashboard, `aegis status`) nothing scanned the table: every listing
went through the fleet index. Then, while a device publishes, the processor and then ingest are
SIGKILLed: aegis up restarts each (and says so), the rest keeps running, and every message is in
raw/ and processed/ once, the last one in LATEST. And the cloud collector pages (through a Slack
stand-in) nothing while the stack starts or while every service is replaced one by one (a
rolling restart), and once for a service killed and kept down."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from botocore.exceptions import BotoCoreError
from playwright.async_api import BrowserContext, expect

from aegis_cli.status import cloud_view, fleet_rows, load_status, status_json
from aegis_contracts.cloud import CheckState, CloudCheck, CloudSnapshot
from aegis_contracts.events import Heartbeat, ObjectCreated
from aegis_contracts.ids import topic_for
from aegis_contracts.keys import CLOUD_INFRA, CLOUD_INFRA_TARGET, cloud_infra_prefix
from aegis_contracts.state import Level
from aegis_contracts.subjects import HEARTBEAT, STREAMS, object_created_subject
from aegis_contracts.times import parse_ts, utc_now
from aegis_devstack.control import installed_services
from aegis_devstack.localservers import ManagedServer, free_port, start_moto_server
from aegis_devstack.stack import DASHBOARD_TOKEN_FILE, local_dashboard_token
from aegis_devstack.testing.emulator import arequest_counts
from aegis_devstack.testing.processes import process_ready
from aegis_devstack.testing.waiting import eventually
from aegis_devstack.testing.webhook import FakeWebhook
from aegis_storage.clients import AwsConfig, open_clients
from aegis_storage.errors import StorageError
from aegis_storage.readmodel import ReadModel

from .conftest import publish_all

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

AEGIS = str(Path(sys.executable).parent / "aegis")
SMOKE = Path(__file__).resolve().parents[1] / "tools" / "smoke.py"
EXAMPLE_JOBS = Path(__file__).resolve().parents[2] / "deploy" / "jobs" / "examples.yaml"
GAS_LEAK_JOB = "gas-leak-escalation"
DATASETS = ("factory_state", "risk_score")
# a hang guard, not a promise: the fleet shows in ~20 s on a slow 2-core machine alone, and up
# to ~30 s there beside a whole test run (the time is printed and kept in docs/benchmarks.md)
FLEET_WITHIN_S = 90


async def dashboard_page(port: int, directory: Path) -> str:
    """The fleet page of the dashboard aegis up started, signed in with its local token (the file
    aegis up keeps in .run/ of the directory it runs in)."""
    token = local_dashboard_token(directory / DASHBOARD_TOKEN_FILE)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        resp = await client.get("/", headers={"Authorization": f"Bearer {token}"})
        assert resp.status_code == 200, resp.text[:500]
        return resp.text


def child_pid(parent: int, service: str) -> int | None:
    """The pid of aegis up's child that runs ``service`` (``python -m aegis_devstack.stack
    {service}``), or None."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and cmdline[-2:] == [service.encode(), b""]:
            return int(entry.name)
    return None


def device_message(factory: str, seq: int) -> bytes:
    return json.dumps(
        {
            "message_id": f"{factory}-{seq:04d}",
            "factory_id": factory,
            "device_id": "edge-1",
            "emitted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "schema_version": "1.0",
            "sensors": {"temperature_c": 20.0 + seq / 10, "co_ppm": 3.0},
        }
    ).encode()


class KillWhilePublishing:
    """A device publishes ``count`` messages, one every ``interval`` s; at ``kills`` (message
    number -> service) that service's process is SIGKILLed. Records, per kill, how many messages
    were published while the service was down (before aegis up said it restarted it)."""

    def __init__(self, up: subprocess.Popen[bytes], log: Path, mqtt_url: str, factory: str) -> None:
        self.up, self.log, self.mqtt_url, self.factory = up, log, mqtt_url, factory
        self.while_down: dict[str, int] = {}

    def restarted(self, service: str) -> bool:
        return f"aegis up: {service} restarted" in self.log.read_text(errors="replace")

    async def run(self, count: int, kills: dict[int, str], interval: float = 0.1) -> None:
        topic = topic_for(self.factory, "factory_state")
        down: list[str] = []
        for seq in range(count):
            if seq in kills:
                service = kills[seq]
                pid = child_pid(self.up.pid, service)
                assert pid is not None, f"no {service} process under aegis up"
                os.kill(pid, signal.SIGKILL)
                down.append(service)
                self.while_down[service] = 0
            await publish_all(self.mqtt_url, [(topic, device_message(self.factory, seq))])
            for service in list(down):
                if self.restarted(service):
                    down.remove(service)
                else:
                    self.while_down[service] += 1
            await asyncio.sleep(interval)


def up_env(
    aws_endpoint: str,
    mosquitto: ManagedServer,
    nats_server: ManagedServer,
    unique_id: str,
    dashboard_port: int,
) -> dict[str, str]:
    """The environment of an ``aegis up`` on these servers (none of the caller's AEGIS_*)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("AEGIS_")} | {
        "AEGIS_AWS_ENDPOINT_URL": aws_endpoint,
        "AEGIS_BUCKET": f"aegis-{unique_id}",
        "AEGIS_TABLE": f"AEGIS-{unique_id}",
        "AEGIS_MQTT_URL": mosquitto.url,
        "AEGIS_NATS_URL": nats_server.url,
        "AEGIS_UP_FIRST_HEALTH_PORT": "0",
        # a free port (8080 may be a running `make run`'s), and the URL aegis up prints for it
        "AEGIS_DASHBOARD_PORT": str(dashboard_port),
        "AEGIS_DASHBOARD_URL": f"http://127.0.0.1:{dashboard_port}",
    }


async def aegis_status(env: dict[str, str]) -> dict[str, Any] | None:
    """``aegis status --json`` on ``env``'s store; None when it fails."""
    status = await asyncio.to_thread(
        subprocess.run,
        [AEGIS, "status", "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    return json.loads(status.stdout) if status.returncode == 0 else None


async def status_read(env: dict[str, str]) -> dict[str, Any] | None:
    """What ``aegis status --json`` would print, read here by the command's own functions: a
    poll costs no process (each ``aegis`` start is ~0.7 s of CPU); None while the table is not
    there or the store does not answer. A test polls with this and checks the command itself
    once what it waits for is there."""
    try:
        items, cloud = await load_status(
            AwsConfig(endpoint_url=env["AEGIS_AWS_ENDPOINT_URL"]), env["AEGIS_TABLE"]
        )
    except (StorageError, BotoCoreError):
        return None
    now = utc_now()
    return status_json(fleet_rows(items, now), cloud_view(cloud, now))


async def gas_leak_runs_live_on_the_jobs_page(
    browser: BrowserContext, port: int, directory: Path, mqtt_url: str
) -> None:
    """The example job gas-leak-escalation, open in a browser, started by real device data: a
    CO reading far over the limit from factory-b's gateway. Its execution appears and its steps
    change state on the open page, without a reload."""
    page = await browser.new_page()
    base = f"http://127.0.0.1:{port}"
    await page.goto(f"{base}/login?next=/jobs/{GAS_LEAK_JOB}")
    await page.fill("#token", local_dashboard_token(directory / DASHBOARD_TOKEN_FILE))
    await page.click("button[type=submit]")
    await expect(page.locator("#job-graph .gnode")).to_have_count(10)
    await page.evaluate("window.sameDocument = true")
    leak = json.dumps(
        {
            "message_id": f"leak-{time.time_ns()}",
            "factory_id": "factory-b",
            "device_id": "edge-1",
            "emitted_at": datetime.now(UTC).isoformat(),
            "schema_version": "1.0",
            "sensors": {"temperature_c": 25.0, "co_ppm": 450.0},
        }
    ).encode()
    await publish_all(mqtt_url, [(topic_for("factory-b", "factory_state"), leak)])
    ran = page.locator("#executions tr[data-execution]").first
    await expect(ran).to_be_visible(timeout=30_000)
    notify = page.locator('#job-graph .gnode[data-node="notify"]')
    await expect(notify).to_have_attribute("data-state", "SUCCEEDED", timeout=30_000)
    # the maintenance webhook has no URL here: its failure is caught, and the job waits
    wait = page.locator('#job-graph .gnode[data-node="wait_2m"]')
    await expect(wait).to_have_attribute("data-state", "WAITING", timeout=30_000)
    assert await page.evaluate("window.sameDocument") is True  # never reloaded


async def test_aegis_up_shows_the_simulated_fleet(
    private_mosquitto: ManagedServer,
    private_nats: ManagedServer,
    own_emulator: ManagedServer,
    unique_id: str,
    tmp_path: Path,
    browser: BrowserContext,
) -> None:
    aws_endpoint = own_emulator.url
    dashboard_port = free_port()
    env = up_env(aws_endpoint, private_mosquitto, private_nats, unique_id, dashboard_port)
    # the example jobs, as `make run` registers them from the checkout
    env["AEGIS_ORCHESTRATOR_JOBS_FILE"] = str(EXAMPLE_JOBS)
    # what the killed processor had taken and not acknowledged comes again after 3 s, not 30
    env["AEGIS_PROCESSOR_ACK_WAIT_S"] = "3"
    log = (tmp_path / "up.log").open("wb")
    # in a directory of its own (its .run/), not the checkout's, where a `make run` may be
    up = subprocess.Popen(  # noqa: ASYNC220 - starting a process does not block
        [AEGIS, "up"], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    rows: list[dict[str, object]] = []
    cloud: dict[str, object] = {}

    def fleet_in(doc: dict[str, Any] | None) -> bool:
        nonlocal rows
        rows = doc["factories"] if doc else []
        return {"factory-a", "factory-b", "factory-c"} == {str(r["factory_id"]) for r in rows}

    def cloud_in(doc: dict[str, Any] | None) -> bool:
        nonlocal cloud
        cloud = doc["cloud_infra"] if doc else {}
        return bool(cloud) and all(tier["updated_at"] for tier in cloud["tiers"])

    async def fleet_visible() -> bool:
        return fleet_in(await status_read(env))

    async def cloud_visible() -> bool:
        return cloud_in(await status_read(env))

    started = time.monotonic()
    try:
        try:
            await eventually(
                fleet_visible,
                within=FLEET_WITHIN_S,
                interval=1,
                what="factory-a/b/c in aegis status",
            )
        except AssertionError as err:
            log.flush()
            tail = (tmp_path / "up.log").read_text()[-4000:]
            raise AssertionError(f"{err}\n--- aegis up, last lines ---\n{tail}") from None
        print(f"fleet visible after {time.monotonic() - started:.1f} s")
        # both collectors tick at start; on a loaded machine their first run may follow the fleet
        await eventually(
            cloud_visible, within=FLEET_WITHIN_S, interval=1, what="cloud infra in aegis status"
        )
        said = await aegis_status(env)  # and the command says so
        assert fleet_in(said) and cloud_in(said), said
        # the fleet in storage says nothing of the dashboard's own start (it may come last)
        log.flush()
        await process_ready(
            up, dashboard_port, tmp_path / "up.log", within=FLEET_WITHIN_S, what="the dashboard"
        )
        page = await dashboard_page(dashboard_port, tmp_path)
        assert all(f'data-factory="{f}"' in page for f in ("factory-a", "factory-b", "factory-c"))
        await gas_leak_runs_live_on_the_jobs_page(
            browser, dashboard_port, tmp_path, private_mosquitto.url
        )
        # the smoke test the Docker workflow runs against `docker compose up`, here against this
        smoke = await asyncio.create_subprocess_exec(
            sys.executable,
            str(SMOKE),
            "--mqtt-url", private_mosquitto.url,
            "--aws-endpoint", aws_endpoint,
            "--table", env["AEGIS_TABLE"],
            "--dashboard-url", f"http://127.0.0.1:{dashboard_port}",
            "--timeout", "30",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        said = (await asyncio.wait_for(smoke.communicate(), 90))[0].decode()
        assert smoke.returncode == 0, said
        assert "LATEST of smoke-" in said and "dashboard at" in said, said
        counts = await arequest_counts(aws_endpoint)

        # a device publishes while the processor, then ingest, are killed
        factory, count = f"kill-{unique_id}", 60
        device = KillWhilePublishing(up, tmp_path / "up.log", private_mosquitto.url, factory)
        await device.run(count, {10: "processor", 35: "ingest"})
        print(f"messages published while down: {device.while_down}")
        # each fault hit with work outstanding: messages came while the service was down
        assert device.while_down["processor"] >= 3 and device.while_down["ingest"] >= 3, (
            device.while_down
        )
        wanted = {f"{factory}-{seq:04d}" for seq in range(count)}
        async with open_clients(AwsConfig(endpoint_url=aws_endpoint)) as clients:

            async def names(prefix: str) -> list[str]:
                pages = clients.s3.get_paginator("list_objects_v2").paginate(
                    Bucket=env["AEGIS_BUCKET"], Prefix=prefix
                )
                return [
                    o["Key"].rsplit("/", 1)[1].removesuffix(".json")
                    async for page in pages
                    for o in page.get("Contents", [])
                ]

            async def all_processed() -> bool:
                return set(await names(f"processed/{factory}/risk_score/")) >= wanted

            await eventually(all_processed, within=60, interval=1, what="every message processed")
            for prefix in (f"raw/{factory}/", *(f"processed/{factory}/{d}/" for d in DATASETS)):
                found = await names(prefix)
                assert sorted(found) == sorted(wanted), prefix  # each once, none missing
        assert up.poll() is None  # aegis up kept going
    finally:
        up.send_signal(signal.SIGTERM)
        code = up.wait(60)
        log.close()
    assert code == 0, (tmp_path / "up.log").read_text()[-3000:]
    printed = (tmp_path / "up.log").read_text()
    assert (
        f"the dashboard: http://127.0.0.1:{dashboard_port}/ (sign in with the token in" in printed
    )
    token = local_dashboard_token(tmp_path / DASHBOARD_TOKEN_FILE)
    assert token not in printed  # the token stays in its file
    for service in ("processor", "ingest"):
        assert f"aegis up: {service} exited (killed by SIGKILL); restart 1 in 1 s" in printed
    for row in rows:
        assert row["level"] in {"NORMAL", "WARNING", "CRITICAL"}
    assert cloud["overall_status"] in {"NORMAL", "WARNING", "CRITICAL"}
    # every service ran its first ticks (refresh, collectors, aggregator and reporter catch-up,
    # the dashboard's warm fleet, aegis status) and listed through the index, never a Scan
    ddb = counts.ops("dynamodb")
    print(f"dynamodb requests over the run: {ddb}")
    assert not [op for op in ddb if op.split("@")[0] == "Scan"], ddb
    assert ddb.get("Query@fleet", 0) > 0 and ddb.get("BatchGetItem", 0) > 0, ddb


BACKLOG = 60  # raw messages waiting for the processor when the first run is stopped


async def outstanding(nats_url: str) -> dict[str, int]:
    """Per AEGIS stream, the messages its consumers have not yet acknowledged (pending plus
    delivered but unacknowledged), summed over its consumers."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        found: dict[str, int] = {}
        for spec in STREAMS:
            infos = await js.consumers_info(spec.name)
            found[spec.name] = sum(c.num_pending + c.num_ack_pending for c in infos)
        return found
    finally:
        await nc.close()


async def dead_letters(nats_url: str) -> int:
    nc = await nats.connect(nats_url)
    try:
        return int((await nc.jetstream().stream_info("AEGIS_DLQ")).state.messages)
    finally:
        await nc.close()


@pytest.mark.timeout(300)
async def test_a_second_aegis_up_after_ctrl_c_with_work_outstanding_replays_nothing_stale(
    private_mosquitto: ManagedServer, private_nats: ManagedServer, unique_id: str, tmp_path: Path
) -> None:
    """The first run is stopped with Ctrl-C while the queue holds work; its emulator (which
    keeps nothing) is replaced by an empty one, as the next ``make run`` does. The second run
    purges the streams with the store, dead-letters nothing, and shows the fleet current
    within a minute of its start."""
    port = free_port()
    env = up_env(f"http://127.0.0.1:{port}", private_mosquitto, private_nats, unique_id, 0)
    env["AEGIS_DASHBOARD_PORT"] = str(free_port())
    first = start_moto_server("127.0.0.1", port, log_file=tmp_path / "moto-1.log")
    log_path = tmp_path / "up-1.log"
    begun = time.monotonic()
    try:
        with log_path.open("wb") as log:
            # in a process group of its own, as a shell runs a command in the foreground: Ctrl-C
            # goes to the whole group
            up = subprocess.Popen(  # noqa: ASYNC220 - starting a process does not block
                [AEGIS, "up"],
                cwd=tmp_path,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                process_group=0,
            )
            try:

                async def data_flows() -> bool:
                    doc = await status_read(env)
                    return doc is not None and len(doc["factories"]) >= 1

                await eventually(data_flows, within=60, interval=1, what="the first run's data")
                # a backlog: more than ingest and the processor take in at once
                topic = topic_for(f"burst-{unique_id}"[:40].lower(), "factory_state")
                burst = [(topic, device_message(f"burst-{unique_id}", n)) for n in range(300)]
                await publish_all(private_mosquitto.url, burst)

                # more than the processor has in flight, which a graceful stop still finishes
                async def queue_holds_work() -> bool:
                    return (await outstanding(private_nats.url))["AEGIS_RAW"] >= BACKLOG

                await eventually(queue_holds_work, within=30, interval=0.2, what="a backlog")
                os.killpg(up.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
                assert await asyncio.to_thread(up.wait, 60) == 0
                print(f"first run stopped after {time.monotonic() - begun:.1f} s")
            finally:
                if up.poll() is None:
                    up.kill()
    finally:
        first.stop()
    # each service was asked to stop once, and finished its work in flight: none was forced
    # (the services that hold the queue's work among them)
    printed = log_path.read_text()
    stops = re.findall(r"^([\w-]+) *\| .*service_stopped .*$", printed, re.MULTILINE)
    assert {"ingest", "processor"} <= set(stops), printed[-3000:]
    failed = sorted(
        set(re.findall(r"^([\w-]+) *\| .*(?:reason=forced|exit_code=1)", printed, re.MULTILINE))
    )
    assert "reason=forced" not in printed and "exit_code=1" not in printed, (
        "\n".join(service_lines(printed, name) for name in failed) or printed[-3000:]
    )
    left = await outstanding(private_nats.url)
    print(f"work outstanding at Ctrl-C: {left}")
    assert sum(left.values()) > 0, left  # the fault hit while the queue held work

    second = start_moto_server("127.0.0.1", port, log_file=tmp_path / "moto-2.log")
    log_path = tmp_path / "up-2.log"
    try:
        with log_path.open("wb") as log:
            started, begun = datetime.now(UTC), time.monotonic()
            up = subprocess.Popen(  # noqa: ASYNC220 - starting a process does not block
                [AEGIS, "up"], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT
            )
            try:

                def current_in(doc: dict[str, Any] | None) -> bool:
                    rows = doc["factories"] if doc else []
                    fresh = {
                        str(r["factory_id"])
                        for r in rows
                        if r["updated_at"] and parse_ts(str(r["updated_at"])) > started
                    }
                    return {"factory-a", "factory-b", "factory-c"} <= fresh

                async def current() -> bool:
                    return current_in(await status_read(env))

                await eventually(current, within=60, interval=1, what="the fleet, current")
                print(f"second run current after {time.monotonic() - begun:.1f} s")
                said = await aegis_status(env)  # and the command says so
                assert current_in(said), said
                assert await dead_letters(private_nats.url) == 0
            finally:
                up.send_signal(signal.SIGINT)
                code = await asyncio.to_thread(up.wait, 60)
    finally:
        second.stop()
    assert code == 0
    printed = log_path.read_text()
    said = "aegis up: the store started empty, so the queue starts empty with it: messages purged:"
    assert said in printed, printed[-3000:]


def service_lines(printed: str, service: str, lines: int = 60) -> str:
    """The last ``lines`` that ``service`` printed in aegis up's output (each prefixed
    ``service |``), with aegis up's own lines about it: what a failure shows of a service that
    crashed or was forced to stop, whatever the others printed after it."""
    own = [
        line
        for line in printed.splitlines()
        if line.startswith(f"{service} ") or line.startswith(f"aegis up: {service} ")
    ]
    return f"--- {service}, its last {min(lines, len(own))} lines\n" + "\n".join(own[-lines:])


# the cloud collector's rules, short for the stack of the paging test: a replica beats every 2 s
# (missed after 6 s), the fast checks run every 3 s, and a service down pages after 6 s of it
# (two fast runs see it pending first)
FAST_INTERVAL_S = 3
HEARTBEAT_INTERVAL_S = 2
SERVICE_DOWN_FOR_S = 6
# what the paging test keeps down: a service aegis up would otherwise restart
KEPT_DOWN = "aggregator"
# the states of a check that is failing (not yet reported, reported, or still reported)
FAILING = frozenset({CheckState.PENDING, CheckState.FIRING, CheckState.CLEARING})


async def operate(
    cwd: Path, env: dict[str, str], *args: str, within: float = 60
) -> list[dict[str, Any]]:
    """``aegis up ARGS --json`` in ``cwd``, the directory of the aegis up it speaks to, as an
    operator runs it from a second terminal; what it did to each service."""
    done = await asyncio.to_thread(
        subprocess.run,
        [AEGIS, "up", *args, "--json"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=within,
    )
    if done.returncode != 0:
        log = cwd / "up.log"  # what aegis up printed, the services' output with it
        tail = log.read_text(errors="replace")[-6000:] if log.exists() else "(no up.log)"
        raise AssertionError(
            f"aegis up {' '.join(args)}: {done.stderr or done.stdout}\n"
            f"--- aegis up, last lines ---\n{tail}"
        )
    outcomes: list[dict[str, Any]] = json.loads(done.stdout)
    return outcomes


async def heartbeats(nats_url: str) -> list[Heartbeat]:
    """The last heartbeat of every replica that sent one (what the cloud collector reads)."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        info = await js.stream_info("AEGIS_EVENTS", subjects_filter=f"{HEARTBEAT}.>")
        subjects = sorted((info.state.subjects or {}).keys())
        return [
            Heartbeat.model_validate_json((await js.get_last_msg("AEGIS_EVENTS", s)).data or b"")
            for s in subjects
        ]
    finally:
        await nc.close()


async def cloud_event(nats_url: str) -> int:
    """The stream sequence of the last ObjectCreated of a cloud snapshot (what the alert
    dispatcher decides on); both tiers announce on one subject."""
    nc = await nats.connect(nats_url)
    try:
        subject = object_created_subject(CLOUD_INFRA)
        return int((await nc.jetstream().get_last_msg("AEGIS_EVENTS", subject)).seq or 0)
    finally:
        await nc.close()


async def cloud_events_from(nats_url: str, start: int) -> list[tuple[int, ObjectCreated]]:
    """The ObjectCreated events of cloud snapshots from stream sequence ``start`` on, each with
    its sequence."""
    nc = await nats.connect(nats_url)
    try:
        js, subject = nc.jetstream(), object_created_subject(CLOUD_INFRA)
        events: list[tuple[int, ObjectCreated]] = []
        with contextlib.suppress(nats.js.errors.NotFoundError):  # none from ``start`` on
            while True:
                msg = await js.get_msg("AEGIS_EVENTS", seq=start, subject=subject, next=True)
                start = int(msg.seq or 0)
                events.append((start, ObjectCreated.model_validate_json(msg.data or b"")))
                start += 1
        return events
    finally:
        await nc.close()


async def dispatcher_acked(nats_url: str) -> int:
    """The stream sequence up to which the alert dispatcher has acknowledged every event."""
    nc = await nats.connect(nats_url)
    try:
        info = await nc.jetstream().consumer_info("AEGIS_EVENTS", "alert-dispatcher")
        return int(info.ack_floor.stream_seq or 0) if info.ack_floor else 0
    finally:
        await nc.close()


def pid_of(instance: str) -> int:
    """The process id in a replica's instance id (``{host}-{pid}-{random}``)."""
    return int(instance.rsplit("-", 2)[1])


class FastSnapshots:
    """The fast collector's snapshots in CLOUD#infra HISTORY, oldest first; ``read()`` adds the
    ones written since the last read."""

    def __init__(self, readmodel: ReadModel) -> None:
        self.readmodel = readmodel
        self.all: list[CloudSnapshot] = []

    async def read(self) -> list[CloudSnapshot]:
        now = datetime.now(UTC)
        since = self.all[-1].updated_at + timedelta(milliseconds=1) if self.all else None
        with contextlib.suppress(StorageError):  # the table is not there yet
            items = await self.readmodel.cloud_history(
                "fast", since or now - timedelta(minutes=10), now, now=now
            )
            self.all += [CloudSnapshot.model_validate(i["snapshot"]) for i in items]
        return self.all

    def after(self, at: datetime) -> list[CloudSnapshot]:
        return [s for s in self.all if s.updated_at > at]


def service_check(snapshot: CloudSnapshot, service: str) -> CloudCheck | None:
    return snapshot.check(f"service:{service}")


def cloud_posts(webhook: FakeWebhook) -> list[dict[str, Any]]:
    """What reached the Slack stand-in about the platform itself (not about a factory)."""
    return [r.body for r in webhook.requests if CLOUD_INFRA_TARGET in json.dumps(r.body)]


def snapshot_time(post: dict[str, Any]) -> str:
    """The time of the snapshot a Slack message speaks for (its "Time (UTC)" field)."""
    fields = post["blocks"][1]["fields"]
    (utc,) = [f["text"] for f in fields if f["text"].startswith("*Time (UTC)*")]
    return str(utc.split("\n", 1)[1])


@pytest.mark.timeout(300)
async def test_aegis_up_pages_once_for_a_service_kept_down_and_never_while_it_starts_or_rolls(
    private_mosquitto: ManagedServer,
    private_nats: ManagedServer,
    own_emulator: ManagedServer,
    unique_id: str,
    webhook: FakeWebhook,
    tmp_path: Path,
) -> None:
    """Three promises of the cloud collector's paging, on one stack, through the Slack stand-in.

    While the stack starts, nothing is paged: the collector's first runs come before the other
    services are up, and see them starting. A rolling restart (``aegis up restart``: every
    service replaced by a new process, one after the other) pages nothing either: the collector
    sees each replacement as starting, never down or not ready, and then its new replica ok.
    Last, a service killed and kept down (``aegis up stop --kill``) pages once: one SERVICE_DOWN
    CRITICAL naming it, from a snapshot at least its ``for`` after the stop aegis up recorded,
    and nothing while it is pending (its heartbeat stopped, the collector sees it down)."""
    env = up_env(own_emulator.url, private_mosquitto, private_nats, unique_id, free_port()) | {
        "AEGIS_SLACK_WEBHOOK_URL": webhook.url,
        "AEGIS_COLLECTOR_FAST_INTERVAL_S": str(FAST_INTERVAL_S),
        "AEGIS_HEARTBEAT_INTERVAL_S": str(HEARTBEAT_INTERVAL_S),
        "AEGIS_CLOUD_FOR_BY_REASON": f"SERVICE_DOWN={SERVICE_DOWN_FOR_S}",
    }
    log_path = tmp_path / "up.log"
    log = log_path.open("wb")
    # in a directory of its own: `aegis up stop|restart` there speak to this aegis up
    up = subprocess.Popen(  # noqa: ASYNC220 - starting a process does not block
        [AEGIS, "up"], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    names = installed_services()
    replacements: dict[str, Heartbeat] = {}  # service -> the last beat of its new replica
    phases = {"begun": time.monotonic()}  # for the record (printed), never asserted on

    async def waited(predicate: Callable[[], Awaitable[bool]], within: float, what: str) -> None:
        try:
            await eventually(predicate, within=within, interval=0.5, what=what)
        except AssertionError as err:
            log.flush()
            tail = log_path.read_text(errors="replace")[-4000:]
            raise AssertionError(f"{err}\n--- aegis up, last lines ---\n{tail}") from None

    try:
        async with open_clients(AwsConfig(endpoint_url=own_emulator.url)) as clients:
            snapshots = FastSnapshots(ReadModel(clients.items, env["AEGIS_TABLE"]))

            async def all_up_twice() -> bool:
                """Every service of the stack ok in the last two fast runs."""
                last = (await snapshots.read())[-2:]
                return len(last) == 2 and all(
                    c.status is Level.NORMAL and c.reason == "OK"
                    for s in last
                    for c in s.checks
                    if c.name.startswith("service:")
                )

            await waited(all_up_twice, 120, "every service up")
            started = snapshots.all[:]
            phases["up"] = time.monotonic()

            # a rolling restart: each service replaced by a new process, one after the other,
            # the next once the new one is ready
            rolled = {o["service"]: o for o in await operate(tmp_path, env, "restart", within=240)}
            quiet = cloud_posts(webhook)
            new_pids = {name: int(o["pid"]) for name, o in rolled.items()}

            async def new_collector_ran() -> bool:
                """The new collector has made a run, so the rolling restart's window (up to the
                kill below) holds its runs too: the roll returns once each new process is
                ready, and ready is not a run done."""
                await snapshots.read()
                return any(
                    pid_of(s.collector) == new_pids["cloud-collector"] for s in snapshots.all
                )

            await waited(new_collector_ran, 30, "a run of the new collector")
            phases["rolled"] = time.monotonic()

            # then a service killed (as a crash: no last heartbeat) and kept down
            (stopped,) = await operate(tmp_path, env, "stop", KEPT_DOWN, "--kill")
            stopped_at = parse_ts(stopped["at"])
            assert child_pid(up.pid, KEPT_DOWN) is None  # aegis up did not restart it

            while_pending: list[dict[str, Any]] | None = None

            async def down_pending() -> bool:
                """The last run, after the stop, sees no live replica (the heartbeat stopped)
                and its failure is not reported yet: pending. What Slack had got by then was
                taken before that run was read: nothing can have come from a run that fired."""
                nonlocal while_pending
                posts = cloud_posts(webhook)
                last = (await snapshots.read())[-1]
                check = service_check(last, KEPT_DOWN)
                if (
                    last.updated_at > stopped_at
                    and check is not None
                    and check.alerting is not None
                    and check.alerting.state is CheckState.PENDING
                    and check.alerting.observed is Level.CRITICAL
                ):
                    while_pending = posts
                return while_pending is not None

            await waited(down_pending, 30, "SERVICE_DOWN pending")

            async def paged() -> bool:
                return len(cloud_posts(webhook)) > len(quiet)

            await waited(paged, 60, "the SERVICE_DOWN page")
            phases["paged"] = time.monotonic()
            # the dispatcher has decided on a later fast run too, the service still down (its
            # snapshot is in the history before its event is published)
            fired_so_far = [
                s for s in await snapshots.read() if s.updated_at > stopped_at and s.reasons
            ]
            assert fired_so_far, "paged, yet no fast run after the stop fired"
            first_fired = fired_so_far[0]

            from_seq = await cloud_event(private_nats.url)

            async def decided_on_a_later_run() -> bool:
                """A fast run after the one that fired is announced (the slow tier's runs are
                announced on the same subject, and may come last), and the dispatcher has
                acknowledged it."""
                later = [
                    seq
                    for seq, event in await cloud_events_from(private_nats.url, from_seq)
                    if event.key.startswith(cloud_infra_prefix("fast"))
                    and event.created_at > first_fired.updated_at
                ]
                return bool(later) and await dispatcher_acked(private_nats.url) >= later[0]

            # (its acknowledged floor waits for every event before it: slow on a busy machine)
            await waited(decided_on_a_later_run, 60, "the dispatcher on a later run")

            async def every_replacement_seen() -> bool:
                """Every service that beats has a ready replica in its new process, and a run
                of the new collector after that replica's start had the service ok (its old
                replica had said it was stopping: the new one is what the run counted)."""
                beats = await heartbeats(private_nats.url)
                for beat in beats:
                    if pid_of(beat.instance) == new_pids.get(beat.service) and beat.ready:
                        replacements[beat.service] = beat
                if not {b.service for b in beats} <= set(replacements):
                    return False
                await snapshots.read()
                return all(
                    any(
                        pid_of(s.collector) == new_pids["cloud-collector"]
                        and (check := service_check(s, name)) is not None
                        and check.reason == "OK"
                        for s in snapshots.after(beat.started_at)
                    )
                    for name, beat in replacements.items()
                )

            await waited(every_replacement_seen, 60, "the collector seeing every replacement")
            (last_beat,) = [
                b
                for b in await heartbeats(private_nats.url)
                if pid_of(b.instance) == new_pids[KEPT_DOWN]
            ]
            assert up.poll() is None
    finally:
        up.send_signal(signal.SIGTERM)
        code = up.wait(60)
        log.close()
    assert code == 0, log_path.read_text()[-3000:]
    phases["stopped"] = time.monotonic()
    steps = list(phases.items())
    print(", ".join(f"{b[0]} after {b[1] - a[1]:.0f} s" for a, b in itertools.pairwise(steps)))

    # start-up: runs saw services starting, none was reported
    seen = {
        (c.name, c.alerting.state)
        for s in started
        for c in s.checks
        if c.alerting and c.alerting.state in {CheckState.STARTING, CheckState.PENDING}
    }
    print(f"{len(started)} fast runs at start-up; starting or pending: {sorted(seen)}")
    assert all(s.reasons == [] for s in started), [s.reasons for s in started if s.reasons]
    assert seen, "no run saw the stack start: the test shows nothing"

    # the rolling restart: every service in a new process after a clean stop, the collector's
    # runs going on through it (its own replacement included), and no service failing in them
    assert sorted(rolled) == names, sorted(rolled)
    for outcome in rolled.values():
        assert outcome["ok"] and outcome["ready"], outcome
        assert outcome["pid"] != outcome["previous_pid"], outcome
        # a clean stop, as a deploy's (uvicorn ends by its own signal once it has shut down)
        assert outcome["exit"] in {"exit code 0", "killed by SIGTERM"}, outcome
    rolling = [s for s in snapshots.all if s.updated_at <= stopped_at][len(started) :]
    # (the old collector may have been replaced before its next run: the roll does not wait)
    collectors = {pid_of(s.collector) for s in rolling}
    assert new_pids["cloud-collector"] in collectors, collectors
    assert collectors <= {rolled["cloud-collector"]["previous_pid"], new_pids["cloud-collector"]}
    roll_seen = {
        (c.name, c.reason, c.alerting.state)
        for s in rolling
        for c in s.checks
        if c.alerting and c.alerting.state is not CheckState.OK
    }
    print(f"{len(rolling)} fast runs over the rolling restart; not ok: {sorted(roll_seen)}")
    print(f"replacements seen: {sorted(replacements)}")
    assert all(s.reasons == [] for s in rolling), [s.reasons for s in rolling if s.reasons]
    failing = {(n, r) for n, r, state in roll_seen if state in FAILING and n.startswith("service:")}
    assert not failing, failing
    assert quiet == [], quiet

    # kept down: its heartbeat stopped at the kill; paged once, by the first run that fired, at
    # least `for` after the stop, nothing while it was pending
    assert stopped["exit"] == "killed by SIGKILL" and stopped["previous_pid"] == new_pids[KEPT_DOWN]
    assert not last_beat.stopping and last_beat.at <= stopped_at, last_beat
    assert while_pending == [], while_pending
    posts = cloud_posts(webhook)
    assert len(posts) == 1, posts
    (post,) = posts
    assert "CRITICAL" in post["text"] and "SERVICE_DOWN" in post["text"], post["text"]
    assert f"service:{KEPT_DOWN}" in json.dumps(post), post
    firing = [s for s in snapshots.after(stopped_at) if s.reasons]
    assert len(firing) >= 2, firing  # the dispatcher decided on more than the run that fired
    assert all([r.code for r in s.reasons] == ["SERVICE_DOWN"] for s in firing), firing
    fired = firing[0]
    check = service_check(fired, KEPT_DOWN)
    assert check is not None and check.alerting is not None
    assert check.alerting.state is CheckState.FIRING and check.reason == "SERVICE_DOWN", check
    assert snapshot_time(post) == fired.updated_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    assert check.alerting.failing_since is not None and check.alerting.failing_since > stopped_at
    assert fired.updated_at - stopped_at >= timedelta(seconds=SERVICE_DOWN_FOR_S), (
        fired.updated_at,
        stopped_at,
    )
