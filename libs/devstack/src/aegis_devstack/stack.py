"""``aegis up``: the whole platform on one machine, on the local defaults of the ``AEGIS_*`` settings.

Makes sure Mosquitto and NATS JetStream answer (starting the machine's own when they do not), uses
the S3/DynamoDB emulator on 127.0.0.1:4566 (LocalStack if one listens there, else a moto_server it
starts), runs ``bootstrap``, then starts every installed service (entry-point group
``aegis.services``: name -> a ``main()`` callable) and schedule (``aegis.schedules``: the daily
``seal-raw``, which a cluster runs as a scheduled job) as a child process with its own health port,
prefixes their output with the service name, and stops them all on Ctrl-C, SIGTERM or SIGHUP
(the terminal closing).

A child that exits is started again, as a deployment's orchestrator would, after a back-off that
doubles from 1 s to 30 s (back to 1 s once a run lasted a minute); each restart is printed. The
other services and the emulator (with its data) keep running meanwhile.

From another terminal, ``aegis up stop|start|restart SERVICE`` operates one service as an operator
does a deployment's (:mod:`aegis_devstack.control`): a service stopped so is kept down, not
restarted, until it is started again; a restart replaces its process at once, with no back-off,
and answers once the new one is ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Literal

from aegis_contracts.subjects import STREAMS
from aegis_contracts.times import format_ts, utc_now
from aegis_devstack import control
from aegis_devstack.control import Outcome, Request, installed_schedules, installed_services
from aegis_devstack.localservers import (
    LocalServerError,
    ensure_mosquitto,
    ensure_moto_server,
    ensure_nats,
    free_port,
)
from aegis_runtime import natsio
from aegis_runtime.bus import connect_broker, create_broker
from aegis_runtime.health import answers_ready
from aegis_runtime.settings import AegisSettings
from aegis_storage.bootstrap import bootstrap
from aegis_storage.clients import open_clients

LOCAL_ENDPOINT = "http://127.0.0.1:4566"
# how the store and the queue start: "follow" (the queue follows the store: emptied when the
# store is new), "fresh" (both emptied), "keep" (the queue kept whatever the store holds)
Start = Literal["follow", "fresh", "keep"]
FIRST_HEALTH_PORT = 8101
# started first; the others once these answer /readyz (or after EARLY_READY_TIMEOUT_S)
EARLY_SERVICES = frozenset({"ingest", "processor", "simulator"})
EARLY_READY_TIMEOUT_S = 20.0
# restarts of a child that exited: the first after RESTART_FIRST_S, doubling up to RESTART_MAX_S;
# a run that lasted RESTART_RESET_S counts as healthy (the next restart waits RESTART_FIRST_S)
RESTART_FIRST_S = 1.0
RESTART_MAX_S = 30.0
RESTART_RESET_S = 60.0
# a process an operator stopped is killed when it has not exited this long after SIGTERM
STOP_TIMEOUT_S = 30.0
# an operator's start or restart answers once the new process is ready, or after this long
READY_TIMEOUT_S = 60.0


# the local stack's dashboard token when AEGIS_DASHBOARD_TOKENS is unset: kept in a file (0600) so
# an open screen stays signed in across runs and the token never goes to the output
DASHBOARD_TOKEN_FILE = Path(".run/dashboard-token")


def local_dashboard_token(path: Path) -> str:
    """The token in ``path``; made (random) and written there when there is none."""
    if path.exists() and (token := path.read_text().strip()):
        return token
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    name: str
    health_port: int


def dashboard_access(specs: list[ServiceSpec]) -> tuple[dict[str, str], str]:
    """The dashboard's token setting for the children, and how to sign in: the operator's own
    AEGIS_DASHBOARD_TOKENS when set, else the digest of the local token file's, as an admin's
    (the one person of a local stack does everything the dashboard offers)."""
    variable = "AEGIS_DASHBOARD_TOKENS"
    if not any(s.name == "dashboard-api" for s in specs) or os.environ.get(variable):
        return {}, f"a token of {variable}"
    path = DASHBOARD_TOKEN_FILE
    token = local_dashboard_token(path)
    digest = hashlib.sha256(token.encode()).hexdigest()
    return {variable: f"admin:{digest}"}, f"the token in {path.resolve()}"


def stack_entry_point(name: str) -> EntryPoint:
    """The installed service or schedule called ``name``."""
    (ep,) = [
        ep
        for group in ("aegis.services", "aegis.schedules")
        for ep in entry_points(group=group)
        if ep.name == name
    ]
    return ep


def stack_names() -> list[str]:
    """What ``aegis up`` starts: every installed service, then every schedule."""
    return [*installed_services(), *installed_schedules()]


def serve(name: str) -> None:
    """Run one installed service or schedule in this process (what each child of ``aegis up``
    does)."""
    stack_entry_point(name).load()()


def endpoint_of(settings: AegisSettings) -> str:
    return settings.aws_endpoint_url or LOCAL_ENDPOINT


def child_env(
    base: Mapping[str, str], settings: AegisSettings, spec: ServiceSpec
) -> dict[str, str]:
    env = dict(base)
    env.setdefault("AEGIS_AWS_ENDPOINT_URL", endpoint_of(settings))
    env["AEGIS_SERVICE"] = spec.name
    env["AEGIS_HEALTH_PORT"] = str(spec.health_port)
    if spec.name == "ingest":
        # one ingest: a plain subscription, which Mosquitto restores when it restarts (a shared
        # one it does not: what devices publish before ingest subscribes again would be dropped)
        env.setdefault("AEGIS_MQTT_SHARE_GROUP", "")
    env.setdefault("AEGIS_LOG_FORMAT", "console")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


async def _pipe(name: str, stream: asyncio.StreamReader) -> None:
    width = 14
    while line := await stream.readline():
        sys.stdout.write(f"{name:<{width}}| {line.decode(errors='replace')}")
        sys.stdout.flush()


async def run_stack(
    settings: AegisSettings, *, services: list[str] | None = None, start: Start = "follow"
) -> int:
    endpoint = endpoint_of(settings)
    # the terminal closing while the stack starts ends it as Ctrl-C does (the emulator started
    # here is stopped); once the services run, it stops them as Ctrl-C does (_supervise)
    signal.signal(signal.SIGHUP, signal.default_int_handler)
    ensure_mosquitto(settings.mqtt_url)
    ensure_nats(settings.nats_url)
    moto = ensure_moto_server(endpoint) if endpoint == LOCAL_ENDPOINT else None
    try:
        if start == "fresh":
            await empty_emulator(endpoint)
        async with open_clients(
            settings.model_copy(update={"aws_endpoint_url": endpoint}).aws()
        ) as c:
            report = await bootstrap(c, bucket=settings.bucket, table=settings.table)
        print(
            f"aegis up: MQTT {settings.mqtt_url}, NATS {settings.nats_url}, S3/DynamoDB {endpoint} "
            f"(bucket {settings.bucket}, table {settings.table}: "
            f"{'bootstrapped' if report.changed else 'already bootstrapped'})",
            flush=True,
        )
        print(await align_queue(settings, store_created=report.store_created, start=start))
        names = stack_names() if services is None else services
        first = int(os.environ.get("AEGIS_UP_FIRST_HEALTH_PORT", FIRST_HEALTH_PORT))
        # 0: any free port per service (tests run stacks side by side), below the ephemeral
        # range, so a restarted service finds its port free
        specs = [ServiceSpec(n, first + i if first else free_port()) for i, n in enumerate(names)]
        return await _supervise(settings, specs)
    finally:
        if moto is not None:
            moto.close()


async def empty_emulator(endpoint: str) -> None:
    """Remove everything the emulator at ``endpoint`` holds (moto_server's ``/moto-api/reset``);
    a LocalServerError for an emulator that is not moto_server (nothing is removed then)."""
    url = f"{endpoint.rstrip('/')}/moto-api/reset"
    request = urllib.request.Request(url, method="POST")  # noqa: S310 (the local emulator's URL)
    try:
        with await asyncio.to_thread(urllib.request.urlopen, request, timeout=30):
            return
    except urllib.error.HTTPError as err:
        err.close()
        raise LocalServerError(
            f"aegis up --fresh empties a moto_server; the emulator at {endpoint} answered "
            f"/moto-api/reset with HTTP {err.code}: empty it by its own means"
        ) from None
    except OSError as err:
        raise LocalServerError(f"cannot empty the emulator at {endpoint}: {err!r}") from err


async def align_queue(settings: AegisSettings, *, store_created: bool, start: Start) -> str:
    """Keep the queue as consistent with the store as the store is with itself: when bootstrap
    had to create the bucket or table (a new emulator starts empty), the AEGIS streams' messages
    speak of objects and items that no longer exist, and replaying them would dead-letter them
    and hold fresh data back, so they are purged (unless ``start`` is ``keep``). What was done,
    as a line to print."""
    names = [spec.name for spec in STREAMS]
    if start == "keep" or not store_created:
        reason = "as asked (--keep)" if start == "keep" else "with the store, which kept its data"
        return f"aegis up: the queue kept {reason} (aegis up --fresh starts both empty)"
    broker = create_broker(settings, name="aegis-up")
    await connect_broker(broker, settings)
    try:
        purged = {name: await natsio.purge_stream(broker, name) for name in names}
    finally:
        await natsio.close(broker)
    counts = ", ".join(f"{name} {n:,}" for name, n in purged.items() if n is not None)
    why = "as asked (--fresh)" if start == "fresh" else "the store started empty"
    return (
        f"aegis up: {why}, so the queue starts empty with it: messages purged: "
        f"{counts or 'no streams yet'} (aegis up --keep keeps them)"
    )


def restart_delay(previous: float, ran_for: float) -> float:
    """The wait before restarting a child that exited after ``ran_for`` seconds, the last wait
    having been ``previous`` (0: none yet)."""
    if ran_for >= RESTART_RESET_S or previous <= 0:
        return RESTART_FIRST_S
    return min(previous * 2, RESTART_MAX_S)


class _Child:
    """One service of the stack: started, restarted when it exits, stopped with the stack; and
    stopped, started or replaced when an operator asks (``aegis up stop|start|restart``)."""

    def __init__(
        self,
        spec: ServiceSpec,
        env: dict[str, str],
        group: asyncio.TaskGroup,
        stop: asyncio.Event,
    ) -> None:
        self.spec, self.env, self.group, self.stop = spec, env, group, stop
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        # stopped by an operator: kept down (not restarted) until an operator starts it;
        # ``released`` is clear while it is held
        self.held = False
        self.released = asyncio.Event()
        self.released.set()
        # one change of process at a time: an operator's, a restart after an exit, the stack's stop
        self.lock = asyncio.Lock()

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "aegis_devstack.stack",
            self.spec.name,
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            # a process group of its own: a terminal's Ctrl-C reaches aegis up alone, which
            # stops each service with one SIGTERM (a second signal would force it to stop
            # without finishing its work in flight)
            process_group=0,
        )
        assert self.proc.stdout is not None
        self.group.create_task(_pipe(self.spec.name, self.proc.stdout))

    async def keep_running(self) -> None:
        """Wait for the child; unless the stack is stopping or an operator stopped or replaced
        it, start it again after a back-off."""
        delay = 0.0
        while (proc := self.proc) is not None:
            started = time.monotonic()
            code = await proc.wait()
            if self.stop.is_set():
                return
            if self.held or self.proc is not proc:  # the operator's doing: theirs to start
                if not await self._until_released():
                    return
                delay = 0.0
                continue
            delay = restart_delay(delay, time.monotonic() - started)
            self.restarts += 1
            print(
                f"aegis up: {self.spec.name} exited ({_exit_text(code)}); restart "
                f"{self.restarts} in {delay:.0f} s",
                file=sys.stderr,
                flush=True,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), timeout=delay)
            async with self.lock:
                # meanwhile the stack stopped, or an operator stopped or started the service
                if self.stop.is_set() or self.held or self.proc is not proc:
                    continue
                await self.start()
            print(f"aegis up: {self.spec.name} restarted", flush=True)

    async def _until_released(self) -> bool:
        """Wait while an operator keeps the service down or replaces its process (the stack's
        stop cancels the wait); False when the stack is stopping."""
        await self.released.wait()
        return not self.stop.is_set()

    async def _end(self, sig: signal.Signals = signal.SIGTERM) -> tuple[int | None, str | None]:
        """Send ``sig`` to the running process and wait for it (killed after STOP_TIMEOUT_S): its
        pid and how it ended; (None, None) when none runs."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return None, None
        proc.send_signal(sig)
        try:
            code = await asyncio.wait_for(proc.wait(), timeout=STOP_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            code = await proc.wait()
        return proc.pid, _exit_text(code)

    async def terminate(self) -> None:
        async with self.lock:
            await self._end()

    async def operate(self, request: Request) -> Outcome:
        """An operator's stop (kept down; SIGKILL with ``kill``), start or restart."""
        name = self.spec.name
        async with self.lock:
            if self.stop.is_set():
                return Outcome(False, request.action, name, "aegis up: the stack is stopping")
            running = self.proc is not None and self.proc.returncode is None
            if request.action == "stop":
                return await self._hold(request.kill)
            if request.action == "start" and running:
                assert self.proc is not None
                return Outcome(
                    True, "start", name, f"aegis up: {name} is running already", pid=self.proc.pid
                )
            previous, how = None, None
            if request.action == "restart":
                self.held = True  # its exit is not a crash: no restart after a back-off
                self.released.clear()
                previous, how = await self._end()
            await self.start()
            self.held = False
            self.released.set()
            proc = self.proc
            assert proc is not None
            pid, at = proc.pid, format_ts(utc_now())
        ready = await _until_ready([self.spec], {name: self}, self.stop, within=READY_TIMEOUT_S)
        what = (
            f"restarted (pid {previous} {how}; now pid {pid})"
            if previous
            else f"started (pid {pid})"
        )
        if ready:
            state = "ready"
        elif proc.returncode is not None:  # it ended while starting (its output says why)
            state = f"ended ({_exit_text(proc.returncode)}) before it was ready"
        else:
            state = "not ready yet"
        said = f"aegis up: {name} {what}, {state}"
        print(said, flush=True)
        return Outcome(True, request.action, name, said, pid, previous, how, at, ready)

    async def _hold(self, kill: bool) -> Outcome:
        """Stop the running process (SIGTERM, or SIGKILL: a crash) and keep the service down."""
        name = self.spec.name
        self.held = True
        self.released.clear()
        pid, how = await self._end(signal.SIGKILL if kill else signal.SIGTERM)
        at = format_ts(utc_now())
        stopped = f"stopped (pid {pid} {how})" if pid else "stopped already"
        said = f"aegis up: {name} {stopped}; kept down until `aegis up start {name}`"
        print(said, flush=True)
        return Outcome(True, "stop", name, said, None, pid, how, at)


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


async def _supervise(settings: AegisSettings, specs: list[ServiceSpec]) -> int:
    extra_env, token_note = dashboard_access(specs)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # Ctrl-C, a stop, or the terminal closing (SIGHUP): every service stops cleanly
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    children: dict[str, _Child] = {}
    async with asyncio.TaskGroup() as group:

        async def spawn(spec: ServiceSpec) -> None:
            child = _Child(spec, child_env(os.environ, settings, spec) | extra_env, group, stop)
            await child.start()
            children[spec.name] = child
            # the dashboard answers /readyz on its own (API) port too; /metrics on the health port
            health = (
                f"{settings.dashboard_url.rstrip('/')}/readyz, metrics "
                f"http://127.0.0.1:{spec.health_port}/metrics"
                if spec.name == "dashboard-api"
                else f"http://127.0.0.1:{spec.health_port}/readyz"
            )
            print(f"aegis up: {spec.name} started, health {health}")

        # the data path first: on a small machine, starting every service at once delays the
        # moment the fleet shows by the time all of them take to import
        early = [s for s in specs if s.name in EARLY_SERVICES]
        for spec in early:
            await spawn(spec)
        await _until_ready(early, children, stop, within=EARLY_READY_TIMEOUT_S)
        for spec in specs:
            if spec not in early and not stop.is_set():
                await spawn(spec)
        if specs:
            print(
                f"aegis up: the fleet: `make status` "
                f"(or AEGIS_AWS_ENDPOINT_URL={endpoint_of(settings)} aegis status)",
                flush=True,
            )
            if any(s.name == "dashboard-api" for s in specs):
                url = settings.dashboard_url.rstrip("/")
                print(
                    f"aegis up: the dashboard: {url}/ (sign in with {token_note}); "
                    f"its API: {url}/docs",
                    flush=True,
                )
            print("aegis up: a service that exits is restarted; Ctrl-C stops everything")
        else:
            print("aegis up: no services installed yet; the local stack is ready (Ctrl-C stops)")
        keepers = [group.create_task(c.keep_running()) for c in children.values()]

        async def operate(request: Request) -> Outcome:
            child = children.get(request.service)
            if child is None:
                known = ", ".join(sorted(children))
                said = f"aegis up: no service {request.service!r} here (it runs: {known})"
                return Outcome(False, request.action, request.service, said)
            return await child.operate(request)

        async with control.serving(operate) as where:
            print(where, flush=True)
            await stop.wait()
        await asyncio.gather(*(c.terminate() for c in children.values()))
        for keeper in keepers:
            keeper.cancel()
    restarted = {n: c.restarts for n, c in children.items() if c.restarts}
    if restarted:
        print(f"aegis up: stopped; restarts: {restarted}", file=sys.stderr)
    return 0


async def _until_ready(
    specs: list[ServiceSpec],
    children: Mapping[str, _Child],
    stop: asyncio.Event,
    *,
    within: float,
) -> bool:
    """Wait until each of ``specs`` answers /readyz (or exited, or ``stop``, or ``within`` s):
    whether every one answered."""
    deadline = time.monotonic() + within
    waiting = list(specs)
    answered = 0
    while waiting and not stop.is_set() and time.monotonic() < deadline:
        answers = await asyncio.gather(
            *(asyncio.to_thread(answers_ready, s.health_port) for s in waiting)
        )
        answered += sum(answers)
        waiting = [
            s
            for s, ok in zip(waiting, answers, strict=True)
            if not ok and _running(children[s.name])
        ]
        if waiting:
            await asyncio.sleep(0.25)
    return answered == len(specs)


def _running(child: _Child) -> bool:
    return child.proc is not None and child.proc.returncode is None


def main() -> None:
    if len(sys.argv) == 2:  # a child: run one service
        serve(sys.argv[1])
        return
    raise SystemExit(asyncio.run(run_stack(AegisSettings())))


if __name__ == "__main__":
    main()
