"""AEGIS services as processes of an end-to-end test or a bench: each run from its console script
with the settings the caller gives every service, its output in ``<logs>/<service>.log``, ready
once its ``/readyz`` answers, stopped with SIGTERM (killed when it has not exited after a
while) or killed outright (a crash).

A service keeps its health port across restarts, so a test that kills and starts it again
reads the same address. Nothing here restarts a service on its own: a test decides when a
process ends (``aegis up``'s supervisor, :mod:`aegis_devstack.stack`, is the one that restarts).
The one exception is a start that could not bind its health port: a free port is drawn some time
before the service binds it, and another test's server may take it meanwhile; that start is
made again on a new port (see :meth:`ServiceProcesses.ready`).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from aegis_devstack.localservers import free_port
from aegis_runtime.health import probe_ready

SCRIPTS = Path(sys.executable).parent
# a service asked to stop is killed when it has not exited this long after SIGTERM
STOP_TIMEOUT_S = 30.0
# how often a start that found its health port taken is made again on another
PORT_REDRAWS = 3


class ServiceProcesses:
    """The service processes one test or bench runs. ``settings``: the ``AEGIS_*`` settings
    every service gets (the caller's own ``AEGIS_*`` variables are left out, so a developer's
    shell never leaks in); :attr:`extra_env` is added last (a test's own, e.g. a webhook)."""

    def __init__(self, settings: Mapping[str, str], logs: Path | None = None) -> None:
        self.settings = dict(settings)
        self.logs = logs
        self.extra_env: dict[str, str] = {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.health: dict[str, int] = {}
        # where each service's last start wrote: its log folder and the log's size before it
        self._started: dict[str, tuple[Path, int]] = {}

    def command_for(self, service: str) -> list[str]:
        """How ``service`` is started: its console script."""
        return [str(SCRIPTS / f"aegis-{service}")]

    def env_for(self, service: str) -> dict[str, str]:
        """The environment ``service`` runs with (also a one-shot ``aegis`` command's)."""
        port = self.health.setdefault(service, free_port())
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("AEGIS_")}
        return inherited | self.settings | {"AEGIS_HEALTH_PORT": str(port)} | self.extra_env

    def start(self, service: str, logs: Path | None = None) -> subprocess.Popen[bytes]:
        """Start ``service``, its output appended to ``<logs>/<service>.log``."""
        folder = logs or self.logs
        if folder is None:
            raise ValueError("no folder for the service's log")
        with self.log_path(service, folder).open("ab") as log:
            self._started[service] = (folder, log.tell())
            proc = subprocess.Popen(  # noqa: S603 (a console script of ours, no shell)
                self.command_for(service),
                env=self.env_for(service),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs[service] = proc
        return proc

    async def ready(self, *services: str, within: float = 30) -> None:
        """Wait, without blocking the event loop, until each of ``services`` (default: every one
        running) is ready; fail at once when one has exited, with its log's last lines (see
        :func:`process_ready`). A start that exited because its health port was taken is made
        again on another (:data:`PORT_REDRAWS` times at most)."""
        for service in services or tuple(self.procs):
            for redraw in range(PORT_REDRAWS + 1):
                try:
                    await process_ready(
                        self.procs[service],
                        self.health[service],
                        self._log_of(service),
                        within=within,
                        what=service,
                    )
                    break
                except AssertionError:
                    if redraw == PORT_REDRAWS or not self._start_on_another_port(service):
                        raise

    def _start_on_another_port(self, service: str) -> bool:
        """When ``service``'s last start exited because its health port was taken (another
        test's server bound it between the draw and the service's bind), start it again on a
        newly drawn port; False (nothing done) for any other failure."""
        if service not in self._started or self.procs[service].poll() is None:
            return False
        folder, offset = self._started[service]
        with self.log_path(service, folder).open("rb") as log:
            log.seek(offset)
            said = log.read().decode(errors="replace")
        port = self.health[service]
        if not re.search(rf"cannot serve health endpoints on \S+:{port}\b", said):
            return False
        self.health[service] = free_port()
        self.start(service, folder)
        return True

    def _log_of(self, service: str) -> Path:
        """The log ``service``'s last start writes."""
        started = self._started.get(service)
        return self.log_path(service, started[0] if started else None)

    def kill(self, service: str) -> None:
        """SIGKILL ``service`` (a crash: no graceful stop) and forget its process."""
        proc = self.procs.pop(service)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def stop(self, *services: str) -> None:
        """SIGTERM ``services`` (default: every one running) together, wait for each (killed
        after :data:`STOP_TIMEOUT_S`) and forget them."""
        names = list(services or self.procs)
        for name in names:
            self.procs[name].send_signal(signal.SIGTERM)
        for name in names:
            proc = self.procs.pop(name)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def log_path(self, service: str, logs: Path | None = None) -> Path:
        """Where ``service``'s output goes: ``<logs>/<service>.log``."""
        return (logs or self.logs or Path()) / f"{service}.log"

    def log_tail(self, service: str, lines: int = 30, logs: Path | None = None) -> str:
        """The last ``lines`` of ``service``'s log, under a line naming the log."""
        return _tail(self.log_path(service, logs), lines)

    def log_tails(self, lines: int = 40) -> str:
        """The last lines of every service's log: what a failed wait shows, so a failure in CI
        says what the services were doing (the logs go away with the test's temp folder)."""
        if self.logs is None:
            return ""
        return "\n".join(_tail(log, lines) for log in sorted(self.logs.glob("*.log")))


async def process_ready(
    proc: subprocess.Popen[bytes], port: int, log: Path, *, within: float = 30, what: str
) -> None:
    """Wait, without blocking the event loop, until the service ``proc`` (its health server on
    ``port``, its output in ``log``) answers ``/readyz`` with 200. Fails at once when the
    process has exited, and after ``within`` seconds otherwise; either way the error carries
    what ``/readyz`` last said and the log's last lines, so a failure in CI (where the logs go
    away with the test's folder) says what the service was doing."""
    deadline = time.monotonic() + within
    while True:
        if await asyncio.to_thread(
            _ready_now, proc, port, log, deadline=deadline, within=within, what=what
        ):
            return
        await asyncio.sleep(0.1)


def _ready_now(
    proc: subprocess.Popen[bytes],
    port: int,
    log: Path,
    *,
    deadline: float,
    within: float,
    what: str,
) -> bool:
    """One look at ``proc``: True when its ``/readyz`` answers 200, False while it may still
    become ready; raises once it has exited or ``deadline`` has passed (a blocking call)."""
    if (code := proc.poll()) is not None:
        raise AssertionError(f"{what} exited with {code} before it was ready\n{_tail(log)}")
    ready, said = probe_ready(port)
    if ready:
        return True
    if time.monotonic() > deadline:
        raise AssertionError(
            f"{what} not ready within {within:.0f}s; /readyz: {said}\n{_tail(log)}"
        )
    return False


def _tail(log: Path, lines: int = 40) -> str:
    if not log.exists():
        return f"--- {log.name}: no log"
    tail = log.read_text(errors="replace").splitlines()[-lines:]
    return f"--- {log.name} (last {len(tail)} lines)\n" + "\n".join(tail)
