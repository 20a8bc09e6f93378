"""A background subscription to the broker's ``$SYS/#`` topics: the fast collector reads what it
cached (connected or not, when the last $SYS message came, the last value of each topic) instead of
connecting once a minute, so "the broker stopped publishing $SYS" is observable at all."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Callable

import aiomqtt
import structlog

from aegis_cloud_collector.domain import SysState

log = structlog.get_logger(__name__)

SYS_FILTER = "$SYS/#"


class SysMonitor:
    """``await run(stop)`` in a task; :meth:`state` any time. Reconnects every ``retry_s``."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        username: str | None = None,
        password: str | None = None,
        identifier: str | None = None,
        tls_context: ssl.SSLContext | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        retry_s: float = 2.0,
    ) -> None:
        self.host, self.port = host, port
        self.username, self.password = username, password
        self.tls_context = tls_context
        self.identifier = identifier
        # silence is measured on a monotonic clock: a wall-clock step (or a test's fake clock)
        # must not look like a silent broker
        self.monotonic = monotonic
        self.retry_s = retry_s
        self.connected = False
        self.last_message_at: float | None = None
        self.values: dict[str, str] = {}
        self.error: str | None = None
        # when run() started (monotonic): the collector's start, for MQTT_STARTING
        self.started_at: float | None = None

    def state(self) -> SysState:
        return SysState(
            connected=self.connected,
            silent_for_s=None
            if self.last_message_at is None
            else self.monotonic() - self.last_message_at,
            values=dict(self.values),
            error=self.error,
            running_for_s=None if self.started_at is None else self.monotonic() - self.started_at,
        )

    async def run(self, stop: asyncio.Event) -> None:
        if self.started_at is None:
            self.started_at = self.monotonic()
        while not stop.is_set():
            listen = asyncio.create_task(self._listen(), name="mqtt-sys-listen")
            stopper = asyncio.create_task(stop.wait())
            await asyncio.wait({listen, stopper}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if not listen.done():
                listen.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                try:
                    await listen
                except aiomqtt.MqttError as err:
                    self.error = str(err) or type(err).__name__
                    log.warning("mqtt_sys_disconnected", error=self.error)
            self.connected = False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.retry_s)

    async def _listen(self) -> None:
        async with aiomqtt.Client(
            self.host,
            self.port,
            username=self.username,
            password=self.password,
            identifier=self.identifier,
            keepalive=15,
            tls_context=self.tls_context,
        ) as client:
            await client.subscribe(SYS_FILTER)
            self.connected, self.error = True, None
            log.info("mqtt_sys_subscribed", host=self.host, port=self.port)
            async for message in client.messages:
                payload = message.payload
                text = (
                    payload.decode(errors="replace") if isinstance(payload, bytes) else str(payload)
                )
                self.values[str(message.topic)] = text[:256]
                self.last_message_at = self.monotonic()
