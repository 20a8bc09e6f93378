"""The event loop every service runs in."""

from __future__ import annotations

import os

import pytest
import uvloop

from aegis_runtime.lifecycle import service_runner


def test_a_service_runs_in_uvloops_loop_with_one_tokio_io_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TOKIO_WORKER_THREADS", raising=False)
    with service_runner() as runner:
        assert isinstance(runner.get_loop(), uvloop.Loop)
    assert os.environ["TOKIO_WORKER_THREADS"] == "1"


def test_an_operators_tokio_thread_count_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKIO_WORKER_THREADS", "4")
    with service_runner():
        pass
    assert os.environ["TOKIO_WORKER_THREADS"] == "4"
