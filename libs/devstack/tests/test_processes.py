"""aegis_devstack.testing.processes: waiting for a real service process to be ready."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from aegis_devstack.localservers import free_port
from aegis_devstack.testing.processes import ServiceProcesses, process_ready
from aegis_devstack.testing.waiting import eventually
from aegis_runtime.health import HealthServer
from aegis_runtime.metrics import Metrics

Start = Callable[[str], subprocess.Popen[bytes]]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    """Starts ``python -c CODE`` with its output in ``svc.log`` (killed at the test's end)."""
    procs: list[subprocess.Popen[bytes]] = []

    def started(code: str) -> subprocess.Popen[bytes]:
        with (tmp_path / "svc.log").open("ab") as out:
            procs.append(
                subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT)
            )
        return procs[-1]

    yield started
    for proc in procs:
        proc.kill()
        proc.wait(10)


async def test_a_service_that_exits_before_it_is_ready_fails_the_wait_with_its_code_and_log(
    tmp_path: Path, start: Start
) -> None:
    log = tmp_path / "svc.log"
    proc = start("print('storage unreachable: giving up', flush=True); raise SystemExit(3)")
    proc.wait(30)
    with pytest.raises(AssertionError) as failed:
        await process_ready(proc, free_port(), log, within=600, what="svc")
    assert "svc exited with 3 before it was ready" in str(failed.value)
    assert "storage unreachable: giving up" in str(failed.value)


async def test_a_service_never_ready_fails_the_wait_with_what_readyz_said_and_its_log(
    tmp_path: Path, start: Start
) -> None:
    log = tmp_path / "svc.log"
    proc = start("print('waiting for storage', flush=True); import time; time.sleep(60)")
    await eventually(lambda: "waiting for storage" in log.read_text(), what="the line logged")

    async def down() -> bool:
        return False

    server = HealthServer(Metrics("svc"))  # stands in for the process's own health server
    server.add_check("storage", down)
    async with server:
        with pytest.raises(AssertionError) as failed:
            await process_ready(proc, server.port, log, within=0, what="svc")
    message = str(failed.value)
    assert "svc not ready within 0s; /readyz: 503" in message
    assert '"storage":false' in message and "waiting for storage" in message


async def test_a_ready_service_ends_the_wait(tmp_path: Path, start: Start) -> None:
    proc = start("import time; time.sleep(60)")
    async with HealthServer(Metrics("svc")) as server:
        await process_ready(proc, server.port, tmp_path / "svc.log", within=30, what="svc")
    assert proc.poll() is None


# a stand-in service: the project's health server on AEGIS_HEALTH_PORT, as every service starts
SERVE_HEALTH = """
import asyncio, os, sys
from aegis_runtime.health import HealthServer
from aegis_runtime.metrics import Metrics
async def main():
    print("svc begins", flush=True)
    if os.environ.get("FAIL"):
        sys.exit(3)
    async with HealthServer(Metrics("svc"), "127.0.0.1", int(os.environ["AEGIS_HEALTH_PORT"])):
        await asyncio.sleep(60)
asyncio.run(main())
"""


class StandIns(ServiceProcesses):
    def command_for(self, service: str) -> list[str]:
        return [sys.executable, "-c", SERVE_HEALTH]


async def test_a_service_whose_health_port_was_taken_is_started_again_on_another_and_gets_ready(
    tmp_path: Path,
) -> None:
    services = StandIns({}, logs=tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        services.health["svc"] = port  # as if another test's server bound it after the draw
        services.start("svc")
        try:
            await services.ready("svc", within=60)
        finally:
            services.stop()
    log = (tmp_path / "svc.log").read_text()
    assert f"cannot serve health endpoints on 127.0.0.1:{port}" in log
    assert log.count("svc begins") == 2 and services.health["svc"] != port


async def test_a_service_that_fails_otherwise_is_not_started_again(tmp_path: Path) -> None:
    services = StandIns({"FAIL": "1"}, logs=tmp_path)
    services.start("svc")
    with pytest.raises(AssertionError, match="svc exited with 3 before it was ready"):
        await services.ready(within=60)
    assert (tmp_path / "svc.log").read_text().count("svc begins") == 1
