"""aegis_devstack.localservers against real servers: Docker probe, moto_server, Mosquitto, NATS."""

from __future__ import annotations

import gc
import os
import random
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiobotocore.session import get_session
from botocore.exceptions import ClientError

from aegis_devstack.localservers import (
    DEFAULT_MQTT_URL,
    DEFAULT_NATS_URL,
    EPHEMERAL_RANGE,
    FREE_PORTS_FROM,
    LocalServerError,
    docker_available,
    ensure_mosquitto,
    ensure_moto_server,
    ensure_nats,
    free_port,
    jetstream_account_info,
    port_open,
    start_moto_server,
    wait_for_port,
)
from aegis_devstack.testing.emulator import register_lambda
from aegis_storage.clients import AwsConfig, open_client

pytestmark = pytest.mark.integration


# -- docker probe ------------------------------------------------------------------------------


@pytest.fixture
def fresh_docker_probe() -> Iterator[None]:
    docker_available.cache_clear()
    yield
    docker_available.cache_clear()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # AF_UNIX paths are limited to ~108 bytes: pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="aegis-") as name:
        yield Path(name)


def _timed_probe() -> tuple[bool, float]:
    start = time.perf_counter()
    answer = docker_available()
    return answer, time.perf_counter() - start


@pytest.mark.usefixtures("fresh_docker_probe")
def test_docker_absent_on_this_machine_is_detected_well_under_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    if Path("/var/run/docker.sock").exists():
        pytest.skip("this machine has a Docker socket")
    answer, elapsed = _timed_probe()
    assert answer is False
    assert elapsed < 1.0


@pytest.mark.usefixtures("fresh_docker_probe")
def test_a_socket_that_never_answers_is_not_an_engine_and_does_not_hang(
    monkeypatch: pytest.MonkeyPatch, short_dir: Path
) -> None:
    path = short_dir / "docker.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.bind(str(path))
        silent.listen(1)  # connects succeed through the backlog; nothing ever replies
        monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
        answer, elapsed = _timed_probe()
    assert answer is False
    assert elapsed < 1.0


@pytest.mark.usefixtures("fresh_docker_probe")
def test_closed_tcp_docker_host_is_not_an_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{free_port()}")
    answer, elapsed = _timed_probe()
    assert answer is False
    assert elapsed < 1.0


@pytest.mark.usefixtures("fresh_docker_probe")
def test_an_engine_answering_ping_is_detected_once_and_cached(
    monkeypatch: pytest.MonkeyPatch, short_dir: Path
) -> None:
    path = short_dir / "docker.sock"
    requests: list[bytes] = []
    stop = threading.Event()

    def serve(listener: socket.socket) -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                requests.append(conn.recv(1024))
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK")

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(4)
        listener.settimeout(0.05)
        thread = threading.Thread(target=serve, args=(listener,))
        thread.start()
        monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
        try:
            assert docker_available() is True
            assert docker_available() is True
        finally:
            stop.set()
            thread.join(timeout=5)
    assert len(requests) == 1  # the second answer came from the cache
    assert requests[0].startswith(b"GET /_ping ")


# -- ports -------------------------------------------------------------------------------------


def test_free_port_is_closed_and_wait_for_port_times_out_on_it() -> None:
    port = free_port()
    assert not port_open("127.0.0.1", port)
    with pytest.raises(TimeoutError, match=str(port)):
        wait_for_port("127.0.0.1", port, timeout=0.3)


def test_free_ports_lie_below_the_ephemeral_range_and_differ_between_seeded_workers() -> None:
    """Outgoing connections take their local port from the kernel's ephemeral range, so a port
    below it stays free for a server that restarts on it; two workers that seeded ``random``
    alike still draw different ports."""
    low = int(EPHEMERAL_RANGE.read_text().split()[0])
    drawn = []
    for _ in range(2):
        random.seed(7)
        drawn.append([free_port() for _ in range(5)])
    assert all(FREE_PORTS_FROM <= p < low for p in drawn[0] + drawn[1])
    assert drawn[0] != drawn[1]


def test_wait_for_port_returns_once_something_listens() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        wait_for_port("127.0.0.1", port, timeout=1.0)
        assert port_open("127.0.0.1", port)


# -- moto_server -------------------------------------------------------------------------------


async def _bucket_names(endpoint: str, create: str | None = None) -> list[str]:
    session = get_session()
    async with session.create_client(
        "s3",
        region_name="ap-south-1",
        endpoint_url=endpoint,
        aws_access_key_id="test",
        aws_secret_access_key="test",
    ) as s3:
        if create:
            await s3.create_bucket(
                Bucket=create, CreateBucketConfiguration={"LocationConstraint": "ap-south-1"}
            )
        listed = await s3.list_buckets()
    return [bucket["Name"] for bucket in listed["Buckets"]]


async def test_moto_server_answers_s3_over_http_logs_only_its_server_errors_and_stops(
    unique_id: str, tmp_path: Path
) -> None:
    port = free_port()
    server = start_moto_server("127.0.0.1", port, log_file=tmp_path / "moto.log")
    try:
        assert server.started
        assert server.url == f"http://127.0.0.1:{port}"
        assert await _bucket_names(server.url) == []  # a fresh emulator
        assert await _bucket_names(server.url, create=f"aegis-{unique_id}") == [
            f"aegis-{unique_id}"
        ]
        # a function whose runtime cannot be reached: the emulator answers 502
        await register_lambda(server.url, "gone", f"http://127.0.0.1:{free_port()}/")
        cfg = AwsConfig(region="ap-south-1", endpoint_url=server.url, max_attempts=1)
        async with open_client("lambda", cfg) as lambda_:
            with pytest.raises(ClientError) as failed:
                await lambda_.invoke(FunctionName="gone", Payload=b"{}")
        assert failed.value.response["ResponseMetadata"]["HTTPStatusCode"] == 502
    finally:
        server.close()
    assert server.process is not None
    assert server.process.returncode is not None
    assert not port_open("127.0.0.1", port)
    # the failed invocation is in the log; the requests served (and counted) are not
    logged = [
        line for line in (tmp_path / "moto.log").read_text().splitlines() if "HTTP/1.1" in line
    ]
    assert len(logged) == 1 and "/functions/gone/invocations" in logged[0] and " 502 " in logged[0]


def test_moto_server_refuses_a_port_in_use() -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(1)
        port = squatter.getsockname()[1]
        with pytest.raises(LocalServerError, match="already in use"):
            start_moto_server("127.0.0.1", port)


async def test_ensure_moto_server_reuses_the_one_listening() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    first = ensure_moto_server(url)
    try:
        assert first.started
        second = ensure_moto_server(url)
        assert not second.started
        assert second.url == first.url
        second.stop()  # does not own the process: must leave it running
        assert await _bucket_names(url) == []
    finally:
        first.close()
    assert not port_open("127.0.0.1", int(url.rsplit(":", 1)[1]))


# -- mosquitto and nats already running --------------------------------------------------------


def test_ensure_mosquitto_returns_at_once_when_the_broker_is_up() -> None:
    ensure_mosquitto(DEFAULT_MQTT_URL)  # starts it if this machine had it down
    start = time.perf_counter()
    assert ensure_mosquitto(DEFAULT_MQTT_URL) is False
    assert time.perf_counter() - start < 0.5


def test_ensure_nats_returns_at_once_when_jetstream_is_up() -> None:
    ensure_nats(DEFAULT_NATS_URL)
    start = time.perf_counter()
    assert ensure_nats(DEFAULT_NATS_URL) is False
    assert time.perf_counter() - start < 0.5
    info = jetstream_account_info(DEFAULT_NATS_URL)
    assert {"memory", "storage", "streams", "limits"} <= info.keys()


def test_a_local_non_default_port_is_not_guessed_at() -> None:
    url = f"mqtt://127.0.0.1:{free_port()}"
    with pytest.raises(LocalServerError, match="only the default port"):
        ensure_mosquitto(url)


def test_a_missing_binary_is_named_with_the_command() -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    with pytest.raises(LocalServerError, match="aegis-no-such-server is not installed"):
        ensure_nats(url, command=["aegis-no-such-server", "-p", "1"])


def test_a_remote_url_that_does_not_answer_is_an_error() -> None:
    # 127.0.0.2 is loopback but not a name ensure_* considers local, so nothing is started.
    with pytest.raises(LocalServerError, match="remote"):
        ensure_mosquitto(f"mqtt://127.0.0.2:{free_port()}")


def test_a_failing_start_command_reports_its_output() -> None:
    url = f"mqtt://127.0.0.1:{free_port()}"
    with pytest.raises(LocalServerError, match=r"exit 3.*\n.*boom"):
        ensure_mosquitto(url, command=["sh", "-c", "echo boom; exit 3"])


# -- starting servers (on a spare port, so the shared ones are left alone) ---------------------


def _daemon(pidfile: Path, binary: str, *args: str) -> list[str]:
    return [
        "start-stop-daemon", "--start", "--background", "--make-pidfile", "--pidfile", str(pidfile),
        "--exec", binary, "--", *args,
    ]  # fmt: skip


@pytest.fixture
def pidfile(short_dir: Path) -> Iterator[Path]:
    path = short_dir / "server.pid"
    yield path
    if path.exists():  # end the server this test started, by its id
        os.kill(int(path.read_text()), signal.SIGTERM)


def _require(*binaries: str) -> list[str]:
    found = [shutil.which(b) or shutil.which(b, path="/usr/sbin:/sbin") for b in binaries]
    if not all(found):
        pytest.skip(f"needs {', '.join(binaries)} on this machine")
    return [path for path in found if path]


def test_ensure_mosquitto_starts_a_broker_that_is_down(pidfile: Path) -> None:
    _, mosquitto = _require("start-stop-daemon", "mosquitto")
    port = free_port()
    command = _daemon(pidfile, mosquitto, "-p", str(port))
    assert ensure_mosquitto(f"mqtt://127.0.0.1:{port}", command=command) is True
    assert port_open("127.0.0.1", port)
    assert ensure_mosquitto(f"mqtt://127.0.0.1:{port}", command=command) is False


def test_ensure_nats_starts_jetstream_that_is_down(pidfile: Path, short_dir: Path) -> None:
    _, nats_server = _require("start-stop-daemon", "nats-server")
    port = free_port()
    args = ("-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(short_dir / "js"))
    url = f"nats://127.0.0.1:{port}"
    assert ensure_nats(url, command=_daemon(pidfile, nats_server, *args)) is True
    assert "streams" in jetstream_account_info(url)


def test_ensure_nats_refuses_a_server_without_jetstream(pidfile: Path) -> None:
    _, nats_server = _require("start-stop-daemon", "nats-server")
    port = free_port()
    command = _daemon(pidfile, nats_server, "-a", "127.0.0.1", "-p", str(port))
    url = f"nats://127.0.0.1:{port}"
    with pytest.raises(LocalServerError, match="JetStream"):
        ensure_nats(url, command=command, timeout=2)
    assert port_open("127.0.0.1", port)  # it did start: the refusal is about JetStream
    with pytest.raises(LocalServerError, match="not enabled"):
        jetstream_account_info(url)


def test_a_jetstream_probe_that_times_out_in_the_handshake_closes_its_connection() -> None:
    """A listener that accepts the connection and never says INFO: the probe gives up after its
    timeout and closes the socket itself (nats-py, reconnecting disallowed, leaves it open, to
    be found unclosed by whatever collects it later)."""
    collecting = gc.isenabled()
    gc.disable()  # a socket left open stays open: nothing collects it behind the test's back
    try:
        with socket.create_server(("127.0.0.1", 0)) as listener:
            port = listener.getsockname()[1]
            with pytest.raises(LocalServerError, match="no NATS answer"):
                jetstream_account_info(f"nats://127.0.0.1:{port}", 0.3)
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(5)
                assert conn.recv(1024) == b""  # the probe's end closed
    finally:
        if collecting:
            gc.enable()
