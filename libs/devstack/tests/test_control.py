"""``aegis up stop|start|restart``: a service an operator stops is kept down (a crash is still
restarted), starting it or replacing its process is done at once; the commands reach the
``aegis up`` of their directory through its socket, and ``aegis up restart`` goes service by
service, stopping at the first one not done."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from aegis_cli.app import app
from aegis_devstack import control
from aegis_devstack import stack as devstack
from aegis_devstack.control import CONTROL_SOCKET, ControlError, Outcome, Request
from aegis_devstack.stack import ServiceSpec
from aegis_devstack.testing.waiting import eventually


class Sleeper(devstack._Child):
    """A child whose process only sleeps (no service to import)."""

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import time; time.sleep(600)"
        )


def running(child: devstack._Child) -> int | None:
    proc = child.proc
    return proc.pid if proc is not None and proc.returncode is None else None


async def test_a_service_stopped_by_an_operator_stays_down_until_started_a_crash_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(devstack, "restart_delay", lambda previous, ran_for: 0.0)
    monkeypatch.setattr(devstack, "answers_ready", lambda port: True)
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        child = Sleeper(ServiceSpec("svc", 0), {}, group, stop)
        await child.start()
        keeper = group.create_task(child.keep_running())
        try:
            # a crash: restarted at once (no back-off here)
            first = running(child)
            assert first is not None and child.proc is not None
            child.proc.kill()
            await eventually(lambda: running(child) not in {None, first}, what="the restart")
            assert child.restarts == 1

            crashed = running(child)
            stopped = await child.operate(Request("stop", "svc", kill=True))
            assert stopped.ok and stopped.pid is None and stopped.previous_pid == crashed
            assert stopped.exit == "killed by SIGKILL" and stopped.at is not None
            # kept down: as long as a crash took to be restarted, and longer
            await asyncio.sleep(0.5)
            assert running(child) is None and child.restarts == 1
            again = await child.operate(Request("stop", "svc"))
            assert again.ok and again.previous_pid is None and "stopped already" in again.message

            started = await child.operate(Request("start", "svc"))
            assert started.ok and started.ready and started.pid == running(child) is not None
            twice = await child.operate(Request("start", "svc"))
            assert twice.ok and twice.pid == started.pid and "running already" in twice.message

            replaced = await child.operate(Request("restart", "svc"))
            assert replaced.ok and replaced.ready and replaced.previous_pid == started.pid
            assert replaced.exit == "killed by SIGTERM"
            assert replaced.pid == running(child) not in {None, started.pid}
            await asyncio.sleep(0.5)  # the replaced process's exit is not a crash: no restart
            assert running(child) == replaced.pid and child.restarts == 1
        finally:
            stop.set()
            await child.terminate()
            await keeper
    assert running(child) is None
    refused = await child.operate(Request("restart", "svc"))
    assert not refused.ok and "stopping" in refused.message


async def test_the_commands_reach_the_aegis_up_of_their_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ControlError, match="no aegis up answers"):
        await control.ask(Request("stop", "svc"))
    CONTROL_SOCKET.parent.mkdir()
    CONTROL_SOCKET.write_text("")  # what an aegis up that was killed left

    async def handler(request: Request) -> Outcome:
        return Outcome(True, request.action, request.service, f"did {request.action}", pid=7)

    async with control.serving(handler) as said:
        assert "aegis up stop|start|restart SERVICE" in said
        outcome = await control.ask(Request("restart", "svc"))
        assert outcome == Outcome(True, "restart", "svc", "did restart", pid=7)
        async with control.serving(handler) as second:  # a second aegis up here
            assert "another aegis up answers" in second
        assert (await control.ask(Request("start", "svc"))).ok  # the first still answers
    assert not CONTROL_SOCKET.exists()


@pytest.fixture
def answering(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Request]]:
    """An aegis up stand-in answering in ``tmp_path`` (the current directory) on a thread of its
    own: every service is done, but ``broken``, which is not there. Yields what it was asked."""
    monkeypatch.chdir(tmp_path)
    asked: list[Request] = []
    ready, done = threading.Event(), threading.Event()

    async def handler(request: Request) -> Outcome:
        asked.append(request)
        if request.service == "broken":
            return Outcome(False, request.action, request.service, "no service 'broken' here")
        said = f"{request.service} done"
        return Outcome(True, request.action, request.service, said, 1, 2, ready=True)

    async def serve() -> None:
        async with control.serving(handler):
            ready.set()
            await asyncio.to_thread(done.wait)

    thread = threading.Thread(target=lambda: asyncio.run(serve()))
    thread.start()
    try:
        assert ready.wait(10)
        yield asked
    finally:
        done.set()
        thread.join(10)


def test_aegis_up_restart_goes_service_by_service_and_stops_at_one_not_done(
    answering: list[Request],
) -> None:
    done = CliRunner().invoke(app, ["up", "restart", "a", "b", "--json"])
    assert done.exit_code == 0, done.output
    assert [o["service"] for o in json.loads(done.stdout)] == ["a", "b"]

    failed = CliRunner().invoke(app, ["up", "restart", "a", "broken", "c"])
    assert failed.exit_code == 1
    assert "a done" in failed.stdout and "no service 'broken' here" in failed.stderr
    assert [r.service for r in answering] == ["a", "b", "a", "broken"]  # never c

    kept = CliRunner().invoke(app, ["up", "stop", "a", "--kill"])
    assert kept.exit_code == 0 and answering[-1] == Request("stop", "a", kill=True)


def test_aegis_up_stop_without_an_aegis_up_here_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["up", "stop", "ingest"])
    assert result.exit_code == 1
    assert "no aegis up answers on .run/aegis-up.sock" in result.stderr
