"""Operating one service of a running ``aegis up`` from another terminal, as an operator does with
a deployment's orchestrator: ``aegis up stop SERVICE`` (kept down until ``aegis up start
SERVICE``; ``--kill`` as a crash would), ``aegis up start SERVICE``, ``aegis up restart SERVICE``
(a new process in place of the running one, as a deploy does).

``aegis up`` listens on a Unix socket in the directory it runs in, :data:`CONTROL_SOCKET` (beside
the dashboard token), so the commands reach the ``aegis up`` of the directory they are run in;
nothing listens on a TCP port. One request a connection, one JSON object a line each way: the
request ``{"action", "service", "kill"}``, the answer :class:`Outcome`.

Import-light: ``aegis up --help`` imports this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Literal

CONTROL_SOCKET = Path(".run/aegis-up.sock")
Action = Literal["stop", "start", "restart"]
ACTIONS: tuple[Action, ...] = ("stop", "start", "restart")
# a request (stop, start, restart: waiting for the new process's /readyz) answers within this
ANSWER_TIMEOUT_S = 120.0


def installed_services() -> list[str]:
    """The services ``aegis up`` runs: every installed one (entry-point group
    ``aegis.services``), by name."""
    return sorted(ep.name for ep in entry_points(group="aegis.services"))


def installed_schedules() -> list[str]:
    """The schedules ``aegis up`` runs beside the services (entry-point group
    ``aegis.schedules``: what a cluster runs as a scheduled job, e.g. ``seal-raw``, a loop with
    health endpoints here), by name."""
    return sorted(ep.name for ep in entry_points(group="aegis.schedules"))


class ControlError(Exception):
    """No ``aegis up`` answers in this directory, or its answer cannot be read."""


@dataclass(frozen=True, slots=True)
class Request:
    action: Action
    service: str
    kill: bool = False

    @classmethod
    def parse(cls, line: bytes) -> Request:
        doc = json.loads(line)
        fields = doc if isinstance(doc, dict) else {}
        action, service = fields.get("action"), fields.get("service")
        if action not in ACTIONS or not isinstance(service, str):
            raise ValueError(f"not a request: {line[:200]!r}")
        return cls(action, service, bool(fields.get("kill", False)))


@dataclass(frozen=True, slots=True)
class Outcome:
    """What ``aegis up`` did: ``ok`` false when it did nothing (no such service, stopping).
    ``pid``: the process that runs the service now (None: none runs); ``previous_pid`` and
    ``exit``: the process that was stopped and how it ended; ``at``: when it ended (stop) or the
    new one started (start, restart), UTC (``YYYY-MM-DDTHH:MM:SS.mmmZ``); ``ready``: the new
    process answered ``/readyz``."""

    ok: bool
    action: str
    service: str
    message: str
    pid: int | None = None
    previous_pid: int | None = None
    exit: str | None = None
    at: str | None = None
    ready: bool | None = None

    def line(self) -> bytes:
        return json.dumps(asdict(self)).encode() + b"\n"


Handler = Callable[[Request], Awaitable[Outcome]]


async def _live(path: Path) -> bool:
    """Something accepts connections on the socket at ``path``."""
    try:
        _, writer = await asyncio.open_unix_connection(path)
    except OSError:
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


def _make_room(path: Path) -> None:
    """The socket's folder, without the socket an ``aegis up`` that was killed left there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove(path)


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


@contextlib.asynccontextmanager
async def serving(handler: Handler, path: Path = CONTROL_SOCKET) -> AsyncIterator[str]:
    """Answer requests on ``path`` while the context is open, then remove the socket. Yields a
    line to print: where the commands go, or why this ``aegis up`` takes none (another one of
    this directory answers on ``path``, or it cannot listen there)."""
    if await _live(path):
        yield (
            f"aegis up: another aegis up answers on {path} in this directory: "
            "`aegis up stop|start|restart` go to that one"
        )
        return

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            try:
                request = Request.parse(line)
            except ValueError as err:
                outcome = Outcome(False, "?", "?", f"aegis up: {err}")
            else:
                outcome = await handler(request)
            writer.write(outcome.line())
            await writer.drain()
        except OSError:
            pass  # the command went away before its answer
        finally:
            writer.close()

    try:
        _make_room(path)
        server = await asyncio.start_unix_server(answer, path)
        os.chmod(path, 0o600)  # the operator's, as the dashboard token is
    except OSError as err:  # a folder it may not write: the stack runs all the same
        yield f"aegis up: cannot listen on {path} ({err}): no `aegis up stop|start|restart` here"
        return
    try:
        yield (
            "aegis up: `aegis up stop|start|restart SERVICE` in this directory stop one service "
            "(kept down until started), start it, or replace its process"
        )
    finally:
        server.close()
        _remove(path)


async def ask(request: Request, path: Path = CONTROL_SOCKET) -> Outcome:
    """Send ``request`` to the ``aegis up`` answering on ``path`` and wait for what it did."""
    try:
        reader, writer = await asyncio.open_unix_connection(path)
    except OSError as err:
        raise ControlError(
            f"no aegis up answers on {path} ({err.strerror or err}): run this in the directory "
            "where `aegis up` (make run) runs"
        ) from None
    try:
        doc = json.dumps(asdict(request)).encode() + b"\n"
        writer.write(doc)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), ANSWER_TIMEOUT_S)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    try:
        fields: dict[str, Any] = json.loads(line)
        return Outcome(**fields)
    except (ValueError, TypeError):
        raise ControlError(f"aegis up answered what is not an outcome: {line[:200]!r}") from None
