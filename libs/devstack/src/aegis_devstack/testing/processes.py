"""AEGIS services as processes of an end-to-end test or a bench: each run from its console script
with the settings the caller gives every service, its output in ``<logs>/<service>.log``, ready
once its ``/readyz`` answers, stopped with SIGTERM (killed when it has not exited after a
while) or killed outright (a crash).

A service keeps its health port across restarts, so a test that kills and starts it again
reads the same address. Nothing here restarts a service on its own: a test decides when a
process ends (``aegis up``'s supervisor, :mod:`aegis_devstack.stack`, is the one that restarts).
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from aegis_devstack.localservers import free_port
from aegis_devstack.testing.waiting import eventually

SCRIPTS = Path(sys.executable).parent
# a service asked to stop is killed when it has not exited this long after SIGTERM
STOP_TIMEOUT_S = 30.0


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
        with (folder / f"{service}.log").open("ab") as log:
            proc = subprocess.Popen(  # noqa: S603 (a console script of ours, no shell)
                self.command_for(service),
                env=self.env_for(service),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs[service] = proc
        return proc

    def answers_ready(self, service: str) -> bool:
        """True when ``service``'s ``/readyz`` answers 200 (it has what it needs)."""
        url = f"http://127.0.0.1:{self.health[service]}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def wait_ready(self, *services: str, timeout: float = 30) -> None:
        """Block until each of ``services`` (default: every one running) is ready."""
        deadline = time.monotonic() + timeout
        for service in services or tuple(self.procs):
            while not self.answers_ready(service):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{service} not ready within {timeout:.0f}s")
                time.sleep(0.1)

    async def ready(self, *services: str, within: float = 30) -> None:
        """Wait, without blocking the event loop, until each of ``services`` is ready."""
        for service in services:
            await eventually(
                functools.partial(self.answers_ready, service),
                within=within,
                what=f"{service} ready",
            )

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

    def log_tail(self, service: str, lines: int = 30, logs: Path | None = None) -> str:
        path = (logs or self.logs or Path()) / f"{service}.log"
        return (
            "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            if path.exists()
            else ""
        )

    def log_tails(self, lines: int = 40) -> str:
        """The last lines of every service's log: what a failed wait shows, so a failure in CI
        says what the services were doing (the logs go away with the test's temp folder)."""
        if self.logs is None:
            return ""
        parts = []
        for log in sorted(self.logs.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.name} (last {len(tail)} lines)\n" + "\n".join(tail))
        return "\n".join(parts)
