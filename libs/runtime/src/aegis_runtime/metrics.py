"""Prometheus metrics of one service, in a registry of its own (no global state, so tests can build
many apps in one process). Every metric of AEGIS's own starts with ``aegis_``; the standard
process (``process_*``), GC and Python (``python_*``) collectors keep their standard names.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

PREFIX = "aegis_"
# Handler latency: from sub-millisecond (a cache hit) to the 30 s a JetStream ack_wait allows.
HANDLER_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


class Metrics:
    """The standard metrics every service has, plus factories for its own.

    ``messages_total{consumer,outcome}``: ``ok``, ``retried``, ``dead_lettered`` (see
    ``aegis_runtime.bus``); ``dead_letters_total{reason}``; ``handler_seconds{consumer}``;
    ``inflight{consumer}``; ``service_info{service}`` = 1. ``consumer`` is the JetStream durable
    consumer a message came from (a service may read several), ``mqtt`` for ingest's
    subscription.
    """

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, service: str) -> None:
        self.service = service
        self.registry = CollectorRegistry()
        # the process's CPU, memory, open files and start time, Python's GC and version: what an
        # operator looks at first (the default registry has them; a registry of its own does not)
        for collector in (PROCESS_COLLECTOR, GC_COLLECTOR, PLATFORM_COLLECTOR):
            self.registry.register(collector)
        self.messages_total = self.counter(
            "messages_total", "Messages handled, by consumer and outcome.", ("consumer", "outcome")
        )
        self.dead_letters_total = self.counter(
            "dead_letters_total", "Messages dead-lettered, by reason.", ("reason",)
        )
        self.handler_seconds = self.histogram(
            "handler_seconds",
            "Time spent handling one message, by consumer.",
            ("consumer",),
            buckets=HANDLER_BUCKETS,
        )
        self.inflight = self.gauge(
            "inflight", "Messages being handled right now, by consumer.", ("consumer",)
        )
        info = self.gauge("service_info", "Always 1; labels name the service.", ("service",))
        info.labels(service=service).set(1)

    def counter(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(_name(name), documentation, tuple(labels), registry=self.registry)

    def gauge(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(_name(name), documentation, tuple(labels), registry=self.registry)

    def histogram(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str] = (),
        *,
        buckets: Sequence[float] = HANDLER_BUCKETS,
    ) -> Histogram:
        return Histogram(
            _name(name), documentation, tuple(labels), registry=self.registry, buckets=buckets
        )

    def total(self, name: str, **labels: str) -> float:
        """The sum of ``name``'s samples whose labels include ``labels`` (0 when none): what a
        reader of several label sets wants, e.g. every consumer's ``messages_total{outcome}``."""
        full = _name(name)
        return sum(
            sample.value
            for family in self.registry.collect()
            for sample in family.samples
            if sample.name == full and labels.items() <= sample.labels.items()
        )

    def render(self) -> bytes:
        """The registry in the Prometheus text exposition format (``content_type``)."""
        return generate_latest(self.registry)


def _name(name: str) -> str:
    return name if name.startswith(PREFIX) else PREFIX + name
