"""Fixtures shared by the integration tests of this folder."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import nats
import nats.js.errors
import pytest

from aegis_contracts import keys
from aegis_contracts.items import AlertState
from aegis_processor.app import ProcessorApp, create_app
from aegis_processor.settings import ProcessorSettings

RunProcessor = Callable[..., AbstractAsyncContextManager[ProcessorApp]]
FireAlert = Callable[..., AlertState]


@pytest.fixture
def fire_alert() -> FireAlert:
    """``fire_alert(scope, firing=, version=, ttl=)``: a CRITICAL FIRE_DETECTED alert state of a
    factory's state stream, as the dispatcher writes it."""

    def make(scope: str, *, firing: bool, version: int, ttl: int) -> AlertState:
        return AlertState(
            pk=keys.alert_pk(scope),
            sk=keys.alert_sk("CRITICAL", "FIRE_DETECTED", "STATE"),
            scope=scope,
            severity="CRITICAL",
            reason="FIRE_DETECTED",
            status="STATE",
            firing=firing,
            version=version,
            ttl=ttl,
        )

    return make


@pytest.fixture
def run_processor(
    foundation: Any, aws_endpoint: str, nats_url: str, unique_id: str
) -> RunProcessor:
    """``async with run_processor(subject, **settings) as app``: the real processor on this test's
    bucket and table, its own durable consumer filtered to ``subject`` (deleted afterwards), the
    1-minute refresh off unless asked for."""

    @asynccontextmanager
    async def run(subject: str, **overrides: Any) -> AsyncIterator[ProcessorApp]:
        settings = ProcessorSettings(
            aws_endpoint_url=aws_endpoint,
            bucket=foundation.bucket,
            table=foundation.table,
            nats_url=nats_url,
            service=f"processor-{unique_id}",
            durable=f"processor-{unique_id}",
            subject=subject,
            fetch_timeout_s=0.3,
            **{"refresh_enabled": False, **overrides},
        )
        app = create_app(settings)
        await app.start()
        try:
            yield app
        finally:
            await app.stop()
            nc = await nats.connect(nats_url)
            try:
                await nc.jetstream().delete_consumer("AEGIS_RAW", settings.durable)
            except nats.js.errors.NotFoundError:
                pass
            finally:
                await nc.close()

    return run
