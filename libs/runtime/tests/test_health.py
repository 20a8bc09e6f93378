"""aegis_runtime.health over real HTTP, and aegis_runtime.lifecycle in a real process with signals."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from aegis_runtime.health import HealthServer, HealthServerError, PromptServer, probe_ready
from aegis_runtime.metrics import Metrics


async def _get(port: int, path: str) -> tuple[int, dict[str, str], bytes]:
    """A minimal HTTP/1.1 GET (no HTTP client library in the environment)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout=5)
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    return int(status_line.split()[1]), headers, body


async def _ok() -> bool:
    return True


async def _down() -> bool:
    return False


async def _raises() -> bool:
    raise ConnectionError("nats unreachable")


async def _hangs() -> bool:
    await asyncio.sleep(30)  # cut short by check_timeout
    return True


async def test_healthz_metrics_and_ephemeral_port() -> None:
    metrics = Metrics("processor")
    metrics.messages_total.labels(consumer="processor", outcome="ok").inc(3)
    async with HealthServer(metrics, "127.0.0.1", 0) as server:
        assert server.port > 0

        status, _, body = await _get(server.port, "/healthz")
        assert status == 200
        assert json.loads(body) == {"status": "ok", "service": "processor"}

        status, headers, body = await _get(server.port, "/metrics")
        assert status == 200
        assert headers["content-type"].startswith("text/plain")
        assert 'aegis_messages_total{consumer="processor",outcome="ok"} 3.0' in body.decode()

        status, _, _ = await _get(server.port, "/nope")
        assert status == 404
        port = server.port

    with pytest.raises(ConnectionRefusedError):  # stopped: nothing listens any more
        await _get(port, "/healthz")


async def test_readyz_is_503_until_every_check_passes() -> None:
    server = HealthServer(Metrics("ingest"), check_timeout=0.05)
    server.add_check("nats", _ok)
    server.add_check("storage", _down)
    server.add_check("mqtt", _raises)
    server.add_check("slow", _hangs)
    async with server:
        status, headers, body = await _get(server.port, "/readyz")
        assert status == 503
        assert headers["content-type"] == "application/json"
        assert json.loads(body) == {
            "ready": False,
            "checks": {"nats": True, "storage": False, "mqtt": False, "slow": False},
        }


async def test_readyz_is_200_when_all_checks_pass() -> None:
    server = HealthServer(Metrics("ingest"))
    server.add_check("nats", _ok)
    async with server:
        status, _, body = await _get(server.port, "/readyz")
    assert status == 200
    assert json.loads(body) == {"ready": True, "checks": {"nats": True}}


async def test_a_probe_waits_for_checks_slower_than_a_second_but_within_their_timeout() -> None:
    async def slow_ok() -> bool:
        await asyncio.sleep(1.5)  # under the server's default check_timeout (2 s)
        return True

    server = HealthServer(Metrics("dispatcher"))
    server.add_check("storage", slow_ok)
    async with server:
        ready, said = await asyncio.to_thread(probe_ready, server.port)
    assert ready
    assert json.loads(said) == {"ready": True, "checks": {"storage": True}}


async def test_a_probe_of_a_service_not_ready_says_which_check_failed() -> None:
    server = HealthServer(Metrics("dispatcher"))
    server.add_check("nats", _ok)
    server.add_check("storage", _down)
    async with server:
        ready, said = await asyncio.to_thread(probe_ready, server.port)
    status, _, body = said.partition(" ")
    assert not ready and status == "503"
    assert json.loads(body)["checks"] == {"nats": True, "storage": False}


def test_a_check_name_is_registered_once() -> None:
    server = HealthServer(Metrics("ingest"))
    server.add_check("nats", _ok)
    with pytest.raises(ValueError, match="already registered"):
        server.add_check("nats", _down)


async def test_a_taken_port_is_a_clear_error() -> None:
    async with HealthServer(Metrics("a")) as first:
        second = HealthServer(Metrics("b"), port=first.port)
        with pytest.raises(HealthServerError, match=str(first.port)):
            await second.start()
        # the first one is unaffected
        status, _, _ = await _get(first.port, "/healthz")
        assert status == 200


def _lifespan_app(said: list[str]) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        said.append("shutdown")

    return Starlette(routes=[Route("/", lambda _: PlainTextResponse("ok"))], lifespan=lifespan)


@dataclass
class Served:
    """A :class:`PromptServer` that answered one kept-alive request, stopped with ``exit()``."""

    shutdown_ran: bool  # the app's lifespan shutdown
    slept: list[float]  # every asyncio.sleep awaited from the server's start to its stop's end
    reader: asyncio.StreamReader  # the request's connection, when kept open


async def _served_until_exit(
    monkeypatch: pytest.MonkeyPatch, *, close_first: bool
) -> tuple[Served, asyncio.StreamWriter]:
    sleep = asyncio.sleep
    slept: list[float] = []

    async def counted(delay: float, result: Any = None) -> Any:
        slept.append(delay)
        return await sleep(delay, result)

    monkeypatch.setattr(asyncio, "sleep", counted)
    said: list[str] = []
    server = PromptServer(
        uvicorn.Config(_lifespan_app(said), host="127.0.0.1", port=0, log_config=None)
    )
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await sleep(0.005)
    port = server.servers[0].sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")  # keep-alive: HTTP/1.1's default
    await writer.drain()
    assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
    await sleep(0.3)  # a few of uvicorn's ticks
    if close_first:
        writer.close()
        await writer.wait_closed()
        while server.server_state.connections:
            await sleep(0.005)
    server.exit()
    await asyncio.wait_for(serving, 10)
    return Served(said == ["shutdown"], slept, reader), writer


async def test_a_prompt_server_with_nothing_open_stops_on_exit_without_a_sleep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """From its start to the end of its stop, the server sleeps at no point (uvicorn's own loop
    sleeps 0.1 s a tick, and its shutdown 0.1 s more for connections, none open); the app's
    lifespan shutdown runs."""
    served, _ = await _served_until_exit(monkeypatch, close_first=True)
    assert served.shutdown_ran
    assert served.slept == []


async def test_a_prompt_server_with_a_connection_open_closes_it_on_exit_and_runs_the_shutdown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    served, writer = await _served_until_exit(monkeypatch, close_first=False)
    try:
        assert served.shutdown_ran
        assert await asyncio.wait_for(served.reader.read(), 5) == b""  # closed by the server
    finally:
        writer.close()


# -- lifecycle: a real child process, real signals ---------------------------------------------

_SERVICE = """
import asyncio, sys
from aegis_runtime.lifecycle import run_service
from aegis_runtime.logging import configure

MODE = sys.argv[1]
configure("json")

async def main(stop: asyncio.Event) -> None:
    print("ready", file=sys.stderr, flush=True)
    if MODE == "crash":
        raise RuntimeError("boom")
    if MODE == "clean":
        await stop.wait()
        await asyncio.sleep(0.05)  # in-flight work finishing
        print("drained", file=sys.stderr, flush=True)
        return
    await asyncio.sleep(60)  # "stuck": ignores stop

run_service(main, shutdown_timeout=float(sys.argv[2]))
"""


async def _run_service(
    tmp_path: Path, mode: str, shutdown_timeout: float, signals: int
) -> tuple[int, list[dict[str, Any]], str]:
    script = tmp_path / "service.py"
    script.write_text(textwrap.dedent(_SERVICE))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        mode,
        str(shutdown_timeout),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    try:
        line = await asyncio.wait_for(proc.stderr.readline(), timeout=20)
        assert line == b"ready\n"
        for n in range(signals):
            proc.send_signal(signal.SIGTERM)
            if n + 1 < signals:  # the second signal only counts once the first was handled
                stopping = await asyncio.wait_for(proc.stdout.readline(), timeout=5)
                assert json.loads(stopping)["event"] == "service_stopping"
        out, err = await asyncio.wait_for(proc.communicate(), timeout=20)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    events = [json.loads(x) for x in out.decode().splitlines() if x.startswith("{")]
    return proc.returncode, events, err.decode()


async def test_sigterm_lets_main_finish_and_exits_zero(tmp_path: Path) -> None:
    code, events, err = await _run_service(tmp_path, "clean", 5.0, signals=1)
    assert code == 0
    assert "drained" in err
    assert events[-1]["event"] == "service_stopped"
    assert events[-1]["reason"] == "SIGTERM"


async def test_a_crash_exits_non_zero(tmp_path: Path) -> None:
    code, events, _ = await _run_service(tmp_path, "crash", 5.0, signals=0)
    assert code == 1
    crashed = next(e for e in events if e["event"] == "service_crashed")
    assert "RuntimeError: boom" in crashed["exception"]
    assert events[-1]["event"] == "service_stopped"
    assert events[-1]["reason"] == "crashed"


async def test_shutdown_timeout_cancels_stuck_work(tmp_path: Path) -> None:
    code, events, _ = await _run_service(tmp_path, "stuck", 0.2, signals=1)
    assert code == 1
    assert events[-1]["reason"] == "shutdown_timeout"


async def test_a_second_signal_forces_exit(tmp_path: Path) -> None:
    code, events, _ = await _run_service(tmp_path, "stuck", 30.0, signals=2)
    assert code == 1
    assert events[-1]["reason"] == "forced"


def test_settle_heap_freezes_what_exists_and_collects_less_often() -> None:
    # a child process: freezing pytest's own heap would outlive this test
    code = (
        "import gc; from aegis_runtime.lifecycle import settle_heap; "
        "assert gc.get_freeze_count() == 0; settle_heap(); "
        "assert gc.get_freeze_count() > 1000, gc.get_freeze_count(); "
        "from aegis_runtime.lifecycle import YOUNG_GC_THRESHOLD; "
        "assert gc.get_threshold() == (YOUNG_GC_THRESHOLD, 10, 10), gc.get_threshold()"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
