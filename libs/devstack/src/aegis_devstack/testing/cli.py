"""The ``aegis`` command in tests, run one of two ways: in this process through typer's runner
(:func:`invoke`; fast, and it sees what the test monkeypatched), or as the installed command in
a process of its own (:func:`run_aegis`; exit codes, streams and the process's end as a user
gets them)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping
from pathlib import Path

from typer.testing import CliRunner, Result

from aegis_cli.app import app

# the installed command, beside this interpreter
AEGIS = str(Path(sys.executable).parent / "aegis")
RUN_LIMIT_S = 100.0


def invoke(*args: str, catch_exceptions: bool = True) -> Result:
    """``aegis ARGS`` in this process (a command that runs an event loop runs its own)."""
    return CliRunner().invoke(app, list(args), catch_exceptions=catch_exceptions)


async def invoke_in_thread(*args: str) -> Result:
    """:func:`invoke` from a test's event loop: in a thread, where the command's loop runs."""
    return await asyncio.to_thread(invoke, *args)


async def run_aegis(env: Mapping[str, str], *args: str) -> tuple[int, str, str]:
    """``aegis ARGS`` as a process of its own with ``env``: exit code, stdout, stderr (given
    up after :data:`RUN_LIMIT_S`; a command given up on, or whose test was cancelled, is killed,
    not left running)."""
    process = await asyncio.create_subprocess_exec(
        AEGIS,
        *args,
        env=dict(env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), RUN_LIMIT_S)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()
