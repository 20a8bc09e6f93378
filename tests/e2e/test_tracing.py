"""One trace per device message, across processes: ingest, the processor and the alert dispatcher
run as real processes with ``AEGIS_TRACING=otlp``, exporting over OTLP/HTTP to a collector
stand-in here; a fire message's spans, in all three services, share one trace id, each child
pointing at a span of the service before it (the context travelled in the queue's headers)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from aegis_contracts.ids import topic_for
from aegis_contracts.times import format_ts
from aegis_devstack.testing.waiting import eventually
from aegis_devstack.testing.webhook import FakeWebhook, serving

from .conftest import Pipeline, publish_all

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@dataclass(frozen=True)
class Span:
    service: str
    trace_id: str
    span_id: str
    parent_id: str
    name: str


@dataclass
class Collector:
    """What the services exported: every span, with its service's name."""

    url: str = ""
    spans: list[Span] = field(default_factory=list)

    async def _export(self, request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest.FromString(await request.read())
        for resource_spans in export.resource_spans:
            attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    self.spans.append(
                        Span(
                            service=attributes.get("service.name", ""),
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            name=span.name,
                        )
                    )
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )


@pytest.fixture
async def collector() -> AsyncIterator[Collector]:
    found = Collector()
    app = web.Application()
    app.router.add_post("/v1/traces", found._export)
    async with serving(app) as base:
        found.url = f"{base}/v1/traces"
        yield found


def fire(factory: str, at: datetime) -> bytes:
    return json.dumps(
        {
            "message_id": f"{factory}-trace-00001",
            "factory_id": factory,
            "device_id": "edge-1",
            "emitted_at": format_ts(at),
            "schema_version": "1.0",
            "sensors": {"temperature_c": 24.0},
            "ai": {
                "model_version": "yolo-1",
                "detections": [{"label": "fire", "confidence": 0.93, "camera_id": "cam-1"}],
            },
        }
    ).encode()


async def test_one_trace_follows_a_message_through_three_services(
    collector: Collector, webhook: FakeWebhook, pipeline: Pipeline, now: datetime
) -> None:
    # (the collector, made before the services, outlives them: a service exports its last spans
    # as it stops, and with no collector its exporter would retry until its timeout, 10 s)
    services = ("ingest", "processor", "alert-dispatcher")
    pipeline.extra_env = {
        "AEGIS_TRACING": "otlp",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.url,
        "OTEL_BSP_SCHEDULE_DELAY": "200",  # export every 0.2 s, not every 5 s
        "AEGIS_SLACK_WEBHOOK_URL": webhook.url,
    }
    for service in services:
        pipeline.start(service)
    await pipeline.ready(*services)
    factory = pipeline.factories(1)[0]
    await publish_all(
        pipeline.mqtt.url, [(topic_for(factory, "factory_state"), fire(factory, now))]
    )

    def traced() -> set[str]:
        """The services with a span in the trace that ingest opened for this message."""
        roots = [s for s in collector.spans if s.service == "ingest" and s.name == "mqtt receive"]
        ids = {s.trace_id for s in roots}
        return {s.service for s in collector.spans if s.trace_id in ids}

    try:
        await eventually(lambda: len(webhook.delivered) >= 1, within=20, what="the fire alert")
        await eventually(lambda: traced() >= set(services), within=20, what="one trace")
    except AssertionError as err:
        seen = sorted({(s.service, s.name, s.trace_id[:8]) for s in collector.spans})
        raise AssertionError(f"{err}; spans: {seen}\n{pipeline.log_tails()}") from None

    (root,) = [s for s in collector.spans if s.service == "ingest" and s.name == "mqtt receive"]
    assert root.parent_id == "", "ingest starts the trace"
    trace = [s for s in collector.spans if s.trace_id == root.trace_id]
    by_id = {s.span_id: s for s in trace}
    for service in ("processor", "alert-dispatcher"):
        spans = [s for s in trace if s.service == service]
        parents = {by_id[s.parent_id].service for s in spans if s.parent_id in by_id}
        assert parents - {service}, f"{service}'s spans continue no other service's span"
