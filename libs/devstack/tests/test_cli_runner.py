"""The tests' runner of the ``aegis`` command as a process (aegis_devstack.testing.cli)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from aegis_devstack.testing import cli
from aegis_devstack.testing.waiting import eventually


@pytest.mark.parametrize("given_up", ["by-its-time-limit", "by-a-cancelled-test"])
async def test_a_command_given_up_on_is_killed_not_left_running(
    given_up: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # a command that never ends by itself (this interpreter standing in for `aegis`)
    monkeypatch.setattr(cli, "AEGIS", sys.executable)
    # long enough for the interpreter to start and say its pid, even on a loaded machine
    monkeypatch.setattr(cli, "RUN_LIMIT_S", 2.0 if given_up == "by-its-time-limit" else 60.0)
    pid_file = tmp_path / "pid"
    hang = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    run = asyncio.create_task(cli.run_aegis(os.environ, "-c", hang))
    await eventually(lambda: pid_file.exists() and pid_file.read_text() != "", what="it runs")
    pid = int(pid_file.read_text())
    if given_up == "by-a-cancelled-test":
        run.cancel()
    with pytest.raises(TimeoutError if given_up == "by-its-time-limit" else asyncio.CancelledError):
        await run
    with pytest.raises(ProcessLookupError):  # ended and reaped: no such process
        os.kill(pid, 0)


async def test_a_finished_command_gives_its_exit_code_and_streams() -> None:
    code, out, _ = await cli.run_aegis(os.environ, "--help")
    assert code == 0 and "Usage" in out
