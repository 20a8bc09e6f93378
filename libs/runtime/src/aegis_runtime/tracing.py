"""One trace per device message, when ``AEGIS_TRACING=otlp``: OpenTelemetry's SDK, exported by
its OTLP/HTTP exporter (endpoint, headers and timeouts from the standard ``OTEL_EXPORTER_OTLP_*``
variables), carried between services in the queue's message headers (W3C ``traceparent``) by
FastStream's own telemetry middleware.

Ingest opens the trace (a consumer span per MQTT message); the raw event it publishes carries
the context; the processor's consumer span continues it, and the events it publishes (changes,
objects created) carry it on to the alert dispatcher and the orchestrator. An operator sees in
one trace where a slow alert spent its time.

Each service has its own tracer provider (``service.name`` = its ``AEGIS_SERVICE``), kept here
by name so that several services in one process (tests, ``aegis up`` runs them apart anyway)
stay apart. Off (the default), nothing is made: no provider, no middleware, no spans, and the
SDK and its exporter are not even imported (a tenth of a second of every service's start).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

import structlog
from opentelemetry import propagate, trace
from opentelemetry.trace import NoOpTracerProvider, SpanKind

from aegis_runtime.settings import AegisSettings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

_PROVIDERS: dict[str, TracerProvider] = {}
_OFF = NoOpTracerProvider()
# how long a process's end waits for its last spans to be taken (the exporter's own timeout is
# 10 s an attempt, and the SDK waits up to 30 s in all: an unreachable collector would hold
# every stop of a rolling update that long after its work was done)
SHUTDOWN_TIMEOUT_S = 5.0
# the thread that waits for them (a daemon: left behind when the bound passes)
SHUTDOWN_THREAD = "tracing-shutdown"
log = structlog.get_logger(__name__)


def provider_for(settings: AegisSettings) -> TracerProvider | None:
    """The tracer provider of ``settings.service`` (made once), or None when tracing is off."""
    if settings.tracing == "off":
        return None
    provider = _PROVIDERS.get(settings.service)
    if provider is None:
        # imported only when tracing is on (see the module's docstring)
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter,
        )
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415

        provider = TracerProvider(
            resource=Resource.create(
                {"service.name": settings.service, "service.namespace": "aegis"}
            ),
            shutdown_on_exit=False,  # shutdown() below, bounded, at the process's end
        )
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        _PROVIDERS[settings.service] = provider
    return provider


def tracer(settings: AegisSettings, name: str) -> trace.Tracer:
    """A tracer of the service (a no-op one when tracing is off)."""
    provider = provider_for(settings)
    return (provider or _OFF).get_tracer(name)


@contextmanager
def consuming(tracer_: trace.Tracer, name: str, attributes: dict[str, str | int]) -> Iterator[None]:
    """A consumer span, current for the block: a message received from outside the queue
    (MQTT) starts a trace here; whatever the block publishes carries it on."""
    with tracer_.start_as_current_span(name, kind=SpanKind.CONSUMER, attributes=attributes):
        yield


def inject(headers: MutableMapping[str, str]) -> None:
    """Put the current trace context (if any) into message headers: for publishes that go
    around FastStream's middleware (batched JetStream publishes). With no provider made in this
    process there is no span whose context could go: nothing is done."""
    if _PROVIDERS:
        propagate.inject(headers)


def flush(timeout_s: float = 5.0) -> None:
    """Export what is buffered (at a service's stop), for every provider made here."""
    for provider in _PROVIDERS.values():
        provider.force_flush(int(timeout_s * 1000))


def shutdown(timeout_s: float = SHUTDOWN_TIMEOUT_S) -> bool:
    """Flush and stop every provider made here (a process's end), waiting at most
    ``timeout_s``: whether the last spans were taken. Past the bound they are abandoned, and
    said (the process then ends; the export's thread goes with it)."""
    providers = list(_PROVIDERS.values())
    _PROVIDERS.clear()
    if not providers:
        return True

    def stop_all() -> None:
        for provider in providers:
            provider.shutdown()

    stopping = threading.Thread(target=stop_all, name=SHUTDOWN_THREAD, daemon=True)
    stopping.start()
    stopping.join(timeout_s)
    if stopping.is_alive():
        log.warning(
            "tracing_export_abandoned",
            waited_s=timeout_s,
            hint="the OTLP collector did not take the last spans in time "
            "(OTEL_EXPORTER_OTLP_ENDPOINT); the process ends without them",
        )
        return False
    return True
