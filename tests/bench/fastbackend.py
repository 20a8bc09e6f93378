"""The bench-only S3/DynamoDB responder (``fastbackend/server.mjs``, Node.js) as a managed server:
a free port, started like the other local servers (aegis_devstack.localservers), ready once its
admin path answers, its per-operation counters read while it runs and when it stops.

No request signature is checked, and it keeps everything in memory: it is for measuring what
AEGIS's services sustain when the backend is not the limit, never for checking AWS behaviour
beyond the calls tests/integration/test_fastbackend.py covers."""

from __future__ import annotations

import json
import shutil
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aegis_devstack.localservers import (
    LocalServerError,
    ManagedServer,
    free_port,
    start_managed_server,
)

SERVER = Path(__file__).parent / "fastbackend" / "server.mjs"


def node_binary() -> str:
    found = shutil.which("node")
    if found is None:
        raise LocalServerError("node (Node.js >= 18) is not installed; the fast backend needs it")
    return found


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/_fast/ready", timeout=1.0) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


@dataclass
class FastBackend:
    """A running responder; ``url`` is its S3 and DynamoDB endpoint."""

    server: ManagedServer

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def pid(self) -> int:
        assert self.server.process is not None
        return self.server.process.pid

    def counters(self) -> dict[str, Any]:
        """Per operation: ``served`` (answered, AWS errors included), ``refused`` (not followed),
        ``errors`` by code; also ``connections`` opened, ``continues`` (requests that waited for a
        100 Continue: a round trip more each), ``refusals`` (their messages) and
        ``internal`` (the responder's own failures: a bug, reported loudly)."""
        with urllib.request.urlopen(f"{self.url}/_fast/counters", timeout=5.0) as resp:
            found: dict[str, Any] = json.loads(resp.read())
            return found

    def close(self) -> dict[str, Any]:
        """Stop it; returns its counters as they were at the end."""
        try:
            final = self.counters()
        finally:
            self.server.close()
        return final


def start_fast_backend(*, rtt_ms: float = 0.0, log_file: Path | None = None) -> FastBackend:
    """Start the responder on a free port of 127.0.0.1, with a modelled round trip of ``rtt_ms``
    per request; its output (a line per refusal) goes to ``log_file`` or a folder of its own in
    the temporary directory (removed when it stops)."""
    port = free_port()
    scratch = None if log_file else Path(tempfile.mkdtemp(prefix=f"aegis-fastbackend-{port}-"))
    log = log_file or (scratch or Path()) / "fastbackend.log"
    command = [node_binary(), str(SERVER), "--port", str(port), "--rtt-ms", str(rtt_ms)]
    server = start_managed_server(
        f"http://127.0.0.1:{port}", command, log, ready=_ready, timeout=20.0, scratch=scratch
    )
    return FastBackend(server)


def requests_of(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    """Requests per operation between two counter readings (served and refused)."""
    out: dict[str, int] = {}
    for op, c in after["ops"].items():
        b = before["ops"].get(op, {"served": 0, "refused": 0})
        n = c["served"] + c["refused"] - b["served"] - b["refused"]
        if n:
            out[op] = n
    return out
