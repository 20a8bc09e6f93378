"""aegis_runtime.tracing: off, a service does not load the SDK at all; at a process's end, the last
spans go to the collector, and a collector that never answers holds the end no longer than the
bound."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import structlog

from aegis_runtime import tracing
from aegis_runtime.settings import AegisSettings


@pytest.fixture
def silent_collector(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[socket.socket]]:
    """An OTLP endpoint that takes connections and never answers: the connections it took."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)
    taken: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                taken.append(listener.accept()[0])
            except TimeoutError:
                continue

    accepting = threading.Thread(target=accept, daemon=True)
    accepting.start()
    port = listener.getsockname()[1]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"http://127.0.0.1:{port}/v1/traces")
    # the export gives up soon after the test's bound: its retries draw from `random`, which a
    # later test of this worker (hypothesis) must not see moving under it
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "2")
    yield taken
    for thread in threading.enumerate():
        if thread.name == tracing.SHUTDOWN_THREAD:
            thread.join(60)
    done.set()
    accepting.join()
    listener.close()
    for conn in taken:
        conn.close()


@pytest.fixture
def collector(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """An OTLP endpoint that takes every export: the bodies it got."""
    bodies: list[bytes] = []

    class Export(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Export)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"http://127.0.0.1:{port}/v1/traces")
    yield bodies
    server.shutdown()
    server.server_close()


def _one_span(service: str) -> None:
    settings = AegisSettings(service=service, tracing="otlp")
    with tracing.tracer(settings, "test").start_as_current_span("mqtt receive"):
        pass


def test_the_last_spans_reach_the_collector_at_the_end(collector: list[bytes]) -> None:
    _one_span("traced-end")
    assert tracing.shutdown() is True
    assert any(b"mqtt receive" in body and b"traced-end" in body for body in collector)


def test_spans_a_silent_collector_does_not_take_are_abandoned_at_the_bound_and_said(
    silent_collector: list[socket.socket],
) -> None:
    _one_span("traced-silent")
    with structlog.testing.capture_logs() as logs:
        taken = tracing.shutdown(timeout_s=1.0)
    assert silent_collector  # the export was under way, to a collector that never answered
    assert taken is False
    (said,) = [e for e in logs if e["event"] == "tracing_export_abandoned"]
    assert said["waited_s"] == 1.0 and said["log_level"] == "warning"


# what a service loads when tracing is on, and only then
SDK = ("opentelemetry.sdk", "opentelemetry.exporter", "faststream.nats.opentelemetry")
LOADED = f"""
import json, sys
import aegis_runtime.service
from aegis_runtime.bus import create_broker
from aegis_runtime.settings import AegisSettings
create_broker(AegisSettings(service="processor", tracing=sys.argv[1]), name="processor")
loaded = {{".".join(m.split(".")[:2]) for m in sys.modules if m.startswith({SDK!r})}}
print(json.dumps(sorted(loaded)))
"""


@pytest.mark.parametrize(
    ("tracing", "loaded"),
    [
        ("off", []),
        ("otlp", ["faststream.nats", "opentelemetry.exporter", "opentelemetry.sdk"]),
    ],
)
def test_a_service_loads_the_tracing_sdk_only_when_tracing_is_on(
    tracing: str, loaded: list[str]
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", LOADED, tracing], capture_output=True, text=True, check=True
    )
    assert json.loads(done.stdout) == loaded
