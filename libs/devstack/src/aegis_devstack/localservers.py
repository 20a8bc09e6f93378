"""Find and start the local infrastructure (Docker, Mosquitto, NATS JetStream, moto_server).

Used by ``make run`` and by the test fixtures in :mod:`aegis_devstack.testing.fixtures`.
Synchronous, so it works from a Makefile helper and from pytest fixtures alike.
Every failure is a :class:`LocalServerError` whose message names the command and log to look at.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aegis_devstack.motoserver import LATENCY_ENV
from aegis_runtime import natsio

__all__ = [
    "DEFAULT_MQTT_URL",
    "DEFAULT_NATS_URL",
    "EPHEMERAL_RANGE",
    "FREE_PORTS_FROM",
    "MOSQUITTO_COMMAND",
    "MOSQUITTO_LOG",
    "NATS_COMMAND",
    "NATS_LOG",
    "LocalServerError",
    "ManagedServer",
    "MotoServer",
    "docker_available",
    "ensure_mosquitto",
    "ensure_moto_server",
    "ensure_nats",
    "free_port",
    "jetstream_account_info",
    "port_open",
    "start_managed_server",
    "start_moto_server",
    "start_private_mosquitto",
    "start_private_nats",
    "wait_for_port",
]

DEFAULT_MQTT_URL = "mqtt://127.0.0.1:1883"
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"

# The Debian packages' way of starting them; both commands return once the server is detached.
MOSQUITTO_COMMAND: tuple[str, ...] = ("mosquitto", "-d", "-c", "/etc/mosquitto/mosquitto.conf")
MOSQUITTO_LOG = "/var/log/mosquitto/mosquitto.log"
NATS_SERVER = "/usr/sbin/nats-server"
NATS_LOG = "/var/log/nats-server.log"
NATS_COMMAND: tuple[str, ...] = (
    "start-stop-daemon", "--start", "--oknodo", "--background", "--exec", NATS_SERVER, "--",
    "-a", "127.0.0.1", "-p", "4222", "-js", "-sd", "/var/lib/nats-server", "-l", NATS_LOG,
)  # fmt: skip

_LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
_DEFAULT_PORTS = {"mqtt": 1883, "mqtts": 8883, "nats": 4222, "tls": 4222, "http": 80, "https": 443}
_SBIN_PATH = "/usr/local/sbin:/usr/sbin:/sbin"
_DOCKER_PROBE_TIMEOUT = 0.3


class LocalServerError(RuntimeError):
    """A local server is not reachable and could not be started (the message says what to run)."""


# -- ports -------------------------------------------------------------------------------------


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    """True when a TCP connect to ``host:port`` succeeds within ``timeout`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


# free ports are chosen from here up to the kernel's ephemeral range (above the ports of the
# usual local servers: 1883, 4222, 4566, 5432, 8080, ...)
FREE_PORTS_FROM = 20_000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default when it cannot be read)."""
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768
    return low if low > FREE_PORTS_FROM + 1_000 else 32_768


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing is bound to right now, below the kernel's ephemeral
    range: an outgoing connection never takes it, so a server that stops and starts again on it
    (a restarted service, a NATS brought back) finds it free. Drawn at random (not from
    ``random``, which tests seed alike in parallel workers); the kernel's pick after 100 draws
    that are all taken."""
    low = _ephemeral_low()
    for _ in range(100):
        port = FREE_PORTS_FROM + secrets.randbelow(low - FREE_PORTS_FROM)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        chosen: int = sock.getsockname()[1]
        return chosen


def wait_for_port(host: str, port: int, timeout: float) -> None:
    """Return once ``host:port`` accepts connections; :class:`TimeoutError` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not port_open(host, port):
        if time.monotonic() >= deadline:
            raise TimeoutError(f"nothing answers at {host}:{port} after {timeout:g}s")
        time.sleep(0.05)


def _host_port(url: str, default_port: int) -> tuple[str, int]:
    # A NATS URL may list several servers separated by commas; the first one is the one we manage.
    parts = urlsplit(url.split(",", maxsplit=1)[0].strip())
    if not parts.hostname:
        raise LocalServerError(f"no host in URL {url!r}")
    return parts.hostname, parts.port or _DEFAULT_PORTS.get(parts.scheme, default_port)


# -- docker ------------------------------------------------------------------------------------


@functools.cache
def docker_available() -> bool:
    """True when a Docker engine answers ``/_ping`` (cached; call ``.cache_clear()`` to re-probe).

    Probes ``DOCKER_HOST`` (unix:// or tcp://) or ``/var/run/docker.sock`` with a short raw
    request, never through the docker SDK, so a missing engine costs milliseconds, not a hang.
    """
    host = os.environ.get("DOCKER_HOST", "").strip() or "unix:///var/run/docker.sock"
    parts = urlsplit(host)
    if parts.scheme == "ssh":
        return True  # an explicit remote engine; probing it would need an SSH round trip
    if parts.scheme == "unix":
        if not Path(parts.path).exists():
            return False
        return _docker_ping(socket.AF_UNIX, parts.path)
    if parts.scheme in ("tcp", "http", "https") and parts.hostname:
        address = (parts.hostname, parts.port or 2375)
        if os.environ.get("DOCKER_TLS_VERIFY") or parts.scheme == "https":
            return port_open(
                *address, timeout=_DOCKER_PROBE_TIMEOUT
            )  # a TLS port: connect is proof
        return _docker_ping(socket.AF_INET, address)
    return False


def _docker_ping(family: socket.AddressFamily, address: str | tuple[str, int]) -> bool:
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(_DOCKER_PROBE_TIMEOUT)
            sock.connect(address)
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            status_line = sock.recv(64).split(b"\r\n", 1)[0]
    except OSError:
        return False
    return status_line.startswith(b"HTTP/1.") and status_line.split(b" ")[1:2] == [b"200"]


# -- mosquitto and nats ------------------------------------------------------------------------


def ensure_mosquitto(
    url: str = DEFAULT_MQTT_URL,
    *,
    command: Sequence[str] | None = None,
    log_file: str = MOSQUITTO_LOG,
    timeout: float = 10.0,
) -> bool:
    """Make sure an MQTT broker answers at ``url``; True when this call had to start it.

    A local broker that is down is started with ``command`` (default :data:`MOSQUITTO_COMMAND`,
    which serves 127.0.0.1:1883 only); any other URL that does not answer is an error.
    """
    host, port = _host_port(url, 1883)
    if port_open(host, port):
        return False
    if command is None and port == 1883:
        command = MOSQUITTO_COMMAND
    _start_local("Mosquitto", url, command, log_file=log_file, timeout=timeout)
    return True


def ensure_nats(
    url: str = DEFAULT_NATS_URL,
    *,
    command: Sequence[str] | None = None,
    log_file: str = NATS_LOG,
    timeout: float = 10.0,
) -> bool:
    """Make sure NATS with JetStream answers at ``url``; True when this call had to start it.

    Like :func:`ensure_mosquitto` (default :data:`NATS_COMMAND` for 127.0.0.1:4222), then checks
    that JetStream answers for the account, which a server started without ``-js`` does not.
    """
    host, port = _host_port(url, 4222)
    started = False
    if not port_open(host, port):
        if command is None and port == 4222:
            command = NATS_COMMAND
        _start_local("NATS", url, command, log_file=log_file, timeout=timeout)
        started = True
    # A freshly started server may accept connections a moment before JetStream is up.
    deadline = time.monotonic() + (timeout if started else 0)
    while True:
        try:
            jetstream_account_info(url)
        except LocalServerError as err:
            if time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            raise LocalServerError(
                f"NATS answers at {url} but JetStream does not: {err}. "
                f"Start nats-server with -js (e.g. {shlex.join(NATS_COMMAND)}); log: {log_file}"
            ) from err
        return started


def _start_local(
    name: str, url: str, command: Sequence[str] | None, *, log_file: str, timeout: float
) -> None:
    host, port = _host_port(url, 0)
    if host not in _LOCAL_HOSTS:
        raise LocalServerError(f"{name} does not answer at {url} (remote, so not started here)")
    if command is None:
        raise LocalServerError(
            f"{name} does not answer at {url}; only the default port is started automatically: "
            f"start one on port {port} yourself"
        )
    # The default NATS command runs the server through start-stop-daemon: check both binaries.
    required = [command[0], NATS_SERVER] if tuple(command) == NATS_COMMAND else [command[0]]
    missing = [binary for binary in required if _which(binary) is None]
    if missing:
        raise LocalServerError(
            f"{name} does not answer at {url} and {', '.join(missing)} is not installed; "
            f"install it or start the server with: {shlex.join(command)}"
        )
    argv = [_which(command[0]) or command[0], *command[1:]]
    # Output goes to a file, not a pipe: a daemon that keeps the pipe open would block us on EOF.
    with tempfile.TemporaryFile() as output:
        try:
            done = subprocess.run(  # noqa: S603 (fixed argv, no shell)
                argv,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=output,
                timeout=timeout,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            raise LocalServerError(f"could not run {shlex.join(command)}: {err}") from err
        output.seek(0)
        said = output.read().decode(errors="replace").strip()
    if done.returncode != 0:
        raise LocalServerError(
            f"{name} failed to start (exit {done.returncode}) with: {shlex.join(command)}\n{said}\n"
            f"see {log_file}"
        )
    try:
        wait_for_port(host, port, timeout)
    except TimeoutError as err:
        raise LocalServerError(
            f"{name} started with {shlex.join(command)} but does not answer at {url} "
            f"after {timeout:g}s; see {log_file}"
        ) from err


def _which(binary: str) -> str | None:
    if os.path.isabs(binary):
        return binary if os.access(binary, os.X_OK) else None
    return shutil.which(binary) or shutil.which(binary, path=_SBIN_PATH)


def jetstream_account_info(url: str = DEFAULT_NATS_URL, timeout: float = 2.0) -> dict[str, Any]:
    """The account's JetStream info (nats-py's ``jsm.account_info()``), or a LocalServerError.

    Runs its own event loop in a worker thread, so it can be called from sync code and from code
    that already runs inside a loop (pytest fixtures, the dev runner).
    """
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, _account_info(url, timeout)).result()


async def _account_info(url: str, timeout: float) -> dict[str, Any]:  # noqa: ASYNC109
    try:
        return await natsio.account_info_at(url, timeout)
    except natsio.Unreachable as err:
        raise LocalServerError(f"no NATS answer from {url}: {err}") from err
    except natsio.JetStreamOff as err:
        raise LocalServerError(str(err)) from err
    except natsio.Error as err:
        if natsio.is_jetstream_refusal(err):
            raise LocalServerError(f"JetStream refused: {err}") from err
        raise LocalServerError(f"no JetStream answer from {url}: {err!r}") from err
    except TimeoutError as err:
        raise LocalServerError(f"no JetStream answer from {url}: {err!r}") from err


# -- moto_server -------------------------------------------------------------------------------


@dataclass
class ManagedServer:
    """A server at ``url``; ``stop()`` ends it if this process started it, else is a no-op.

    Servers this process started keep their command, so ``restart()`` brings the same server back
    on the same port with the same data directory (tests of broker and queue restarts), also after
    a ``stop()``. ``close()`` stops it for good and removes its ``scratch`` folder (data, logs):
    nothing is left in the temp directory."""

    url: str
    process: subprocess.Popen[bytes] | None = None
    log_file: Path | None = None
    command: list[str] | None = None
    ready: Callable[[str], bool] | None = field(default=None, repr=False)
    scratch: Path | None = None
    _stopped: bool = field(default=False, repr=False)

    @property
    def started(self) -> bool:
        """True when this handle owns the process (it was not already running)."""
        return self.process is not None

    def stop(self, timeout: float = 5.0) -> None:
        if self.process is None or self._stopped:
            return
        self._stopped = True
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout)

    def kill(self, timeout: float = 5.0) -> None:
        """End it with SIGKILL, as a crash would (no shutdown, no flush); ``restart()`` brings it
        back with what its store kept."""
        if self.process is None or self._stopped:
            return
        self._stopped = True
        self.process.kill()
        self.process.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Stop it and remove its scratch folder (a no-op for a server not started here)."""
        self.stop(timeout)
        if self.process is not None and self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def restart(self, timeout: float = 15.0) -> None:
        if self.command is None:
            raise LocalServerError(f"{self.url} was not started here; it cannot be restarted")
        self.stop()
        self._stopped = False
        self.process = _spawn(self.command, self.log_file)
        _wait_ready(self, timeout)


MotoServer = ManagedServer


def _spawn(command: list[str], log_file: Path | None) -> subprocess.Popen[bytes]:
    log_path = log_file or Path(os.devnull)
    with log_path.open("ab") as log:
        return subprocess.Popen(  # noqa: S603 (fixed argv, no shell)
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )


def _wait_ready(server: ManagedServer, timeout: float) -> None:
    assert server.process is not None and server.ready is not None
    deadline = time.monotonic() + timeout
    while not server.ready(server.url):
        if server.process.poll() is not None or time.monotonic() >= deadline:
            code = server.process.returncode
            server.stop()
            raise LocalServerError(
                f"{server.url} did not come up (exit {code}) with: "
                f"{shlex.join(server.command or [])}; see {server.log_file}"
            )
        time.sleep(0.05)


def start_managed_server(
    url: str,
    command: list[str],
    log_file: Path,
    ready: Callable[[str], bool] | None = None,
    timeout: float = 20.0,
    *,
    scratch: Path | None = None,
) -> ManagedServer:
    """Run ``command`` as a server at ``url`` (default readiness: it answers HTTP); ``scratch``,
    a folder of its own, is removed when it stops."""
    return _start_managed(url, command, log_file, ready or _answers_http, timeout, scratch=scratch)


def _start_managed(
    url: str,
    command: list[str],
    log_file: Path,
    ready: Callable[[str], bool],
    timeout: float,
    *,
    scratch: Path | None = None,
) -> ManagedServer:
    server = ManagedServer(
        url=url,
        process=_spawn(command, log_file),
        log_file=log_file,
        command=command,
        ready=ready,
        scratch=scratch,
    )
    _wait_ready(server, timeout)
    return server


def _jetstream_ready(url: str) -> bool:
    if not port_open(*_host_port(url, 4222)):
        return False
    try:
        jetstream_account_info(url, timeout=0.5)
    except LocalServerError:
        return False
    return True


def _mqtt_ready(url: str) -> bool:
    return port_open(*_host_port(url, 1883))


def start_private_nats(
    *,
    port: int | None = None,
    timeout: float = 15.0,
    host: str = "127.0.0.1",
    prefix: Sequence[str] = (),
) -> ManagedServer:
    """A NATS JetStream server of this process's own (machine binary, free port, temp store),
    so tests can restart it and never share state with the machine's server. ``host`` is the
    address it listens on, ``prefix`` what its command runs under (``ip netns exec <ns>``: a
    host of a test's own network, :mod:`aegis_devstack.testing.netlab`)."""
    binary = _which("nats-server")
    if binary is None:
        raise LocalServerError("nats-server is not installed")
    port = port or free_port()
    store = Path(tempfile.mkdtemp(prefix=f"aegis-nats-{port}-"))
    command = [*prefix, binary, "-a", host, "-p", str(port), "-js", "-sd", str(store)]
    url = f"nats://{host}:{port}"
    return _start_managed(
        url, command, store / "server.log", _jetstream_ready, timeout, scratch=store
    )


def start_private_mosquitto(
    *,
    port: int | None = None,
    timeout: float = 15.0,
    binary: str | None = None,
    persist_plugin: str | None = None,
    host: str = "127.0.0.1",
    prefix: Sequence[str] = (),
) -> ManagedServer:
    """A Mosquitto of this process's own (free port, temp persistence): the machine's binary,
    or ``binary`` (another release, for a measurement). Sessions persist with the broker's
    built-in file, or with ``persist_plugin`` (Mosquitto 2.1's persist-sqlite plugin, as the
    deployments run it). ``host`` and ``prefix`` as for :func:`start_private_nats`."""
    binary = binary or _which("mosquitto")
    if binary is None:
        raise LocalServerError("mosquitto is not installed")
    port = port or free_port()
    folder = Path(tempfile.mkdtemp(prefix=f"aegis-mosquitto-{port}-"))
    config = folder / "mosquitto.conf"
    persistence = (
        f"plugin {persist_plugin}\nplugin_opt_flush_period 1\n"
        if persist_plugin
        else "persistence true\n"
    )
    config.write_text(
        f"listener {port} {host}\n"
        "allow_anonymous true\n"
        # keep root when run as root: the temp folder is ours, not the mosquitto user's
        "user root\n"
        f"{persistence}"
        f"persistence_location {folder}/\n"
        "max_packet_size 300000\n"
        "max_queued_messages 100000\n"
        "sys_interval 5\n"
    )
    command = [*prefix, binary, "-c", str(config)]
    return _start_managed(
        f"mqtt://{host}:{port}",
        command,
        folder / "mosquitto.log",
        _mqtt_ready,
        timeout,
        scratch=folder,
    )


def _moto_command(host: str, port: int) -> list[str]:
    # moto_server's own main, with its requests serialized so that conditional writes are atomic
    # as on AWS (see aegis_devstack.motoserver)
    return [sys.executable, "-m", "aegis_devstack.motoserver", "-H", host, "-p", str(port)]


def start_moto_server(
    host: str = "127.0.0.1",
    port: int = 4566,
    *,
    timeout: float = 20.0,
    log_file: Path | None = None,
    latency_ms: float = 0.0,
) -> MotoServer:
    """Start the venv's moto_server on ``host:port`` and wait until it answers HTTP.

    Its request log goes to ``log_file`` (default: a folder of its own in the temp directory,
    removed by ``stop()``), never to a pipe nobody reads. ``latency_ms`` delays every request by a round trip
    (benchmarks against a remote-like endpoint; see :mod:`aegis_devstack.motoserver`).

    ``MOTO_PORT`` is set to ``port`` in its environment: moto's Step Functions interpreter calls
    the services a state machine's Tasks name (Lambda's Invoke) at ``localhost:$MOTO_PORT``, and
    moto_server only sets it when it is unset, so one inherited from elsewhere (another emulator's)
    would send them to the wrong server. A ``host`` that ``localhost`` does not reach leaves them
    nowhere to go.
    """
    if port_open(host, port):
        raise LocalServerError(f"cannot start moto_server: {host}:{port} is already in use")
    scratch = None if log_file else Path(tempfile.mkdtemp(prefix=f"aegis-moto-{port}-"))
    log_path = log_file or (scratch or Path()) / "moto.log"
    command = _moto_command(host, port)
    with log_path.open("wb") as log:
        process = subprocess.Popen(  # noqa: S603 (fixed argv, no shell)
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=os.environ | {LATENCY_ENV: str(latency_ms), "MOTO_PORT": str(port)},
            # not stopped by a terminal's Ctrl-C meant for aegis up: the services still finish
            # their work against it; whoever started it stops it
            process_group=0,
        )
    server = MotoServer(
        url=f"http://{host}:{port}", process=process, log_file=log_path, scratch=scratch
    )
    deadline = time.monotonic() + timeout
    while not _answers_http(server.url):
        if process.poll() is not None or time.monotonic() >= deadline:
            server.stop()  # its folder stays: the log says why
            raise LocalServerError(
                f"moto_server did not come up at {server.url} (exit {process.returncode}) with: "
                f"{shlex.join(command)}; see {log_path}"
            )
        time.sleep(0.1)
    return server


def ensure_moto_server(url: str = "http://127.0.0.1:4566", *, timeout: float = 20.0) -> MotoServer:
    """Reuse the emulator answering at ``url``, or start moto_server there (local URLs only)."""
    host, port = _host_port(url, 80)
    if port_open(host, port):
        if not _answers_http(url):
            raise LocalServerError(f"{host}:{port} is taken by something that does not speak HTTP")
        return MotoServer(url=url.rstrip("/"))
    if host not in _LOCAL_HOSTS:
        raise LocalServerError(f"no S3/DynamoDB emulator answers at {url} (remote, so not started)")
    return start_moto_server(host, port, timeout=timeout)


def _answers_http(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0):  # noqa: S310 (our own http:// URL)
            return True
    except urllib.error.HTTPError as err:  # any HTTP status means an HTTP server is there
        err.close()
        return True
    except (OSError, ValueError):
        return False
