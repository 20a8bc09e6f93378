"""What the dashboard's tests share: the app on a real uvicorn server, as ``main()`` runs it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import pytest
import uvicorn
from fastapi import FastAPI

from aegis_dashboard_api.app import server_config
from aegis_dashboard_api.settings import DashboardSettings

Uvicorn = Callable[[FastAPI, DashboardSettings], AbstractContextManager[str]]


@pytest.fixture
def uvicorn_served() -> Uvicorn:
    """``with uvicorn_served(app, settings) as base_url``: ``app`` under uvicorn in a thread of
    its own (its own event loop and lifespan) on the settings' host and port, stopped after."""

    @contextmanager
    def run(app: FastAPI, settings: DashboardSettings) -> Iterator[str]:
        server = uvicorn.Server(server_config(app, settings))
        thread = threading.Thread(target=server.run, name="dashboard-test", daemon=True)
        thread.start()
        for _ in range(400):
            if server.started:
                break
            threading.Event().wait(0.05)
        assert server.started, "the dashboard did not start"
        try:
            yield f"http://{settings.dashboard_host}:{settings.dashboard_port}"
        finally:
            server.should_exit = True
            thread.join(20)

    return run
