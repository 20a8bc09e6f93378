"""The dashboard's own metrics: what every AEGIS service exposes (process, GC, ``service_info``)
plus its HTTP traffic and live streams, served on the health port (``AEGIS_HEALTH_PORT``, 8081
in the images) beside ``/healthz`` and ``/readyz``, not on the public API port.

* ``aegis_http_requests_total{route,method,status}``: requests answered, by route template
  (``/api/factories/{factory_id}``, never the path a client sent: one series per route);
* ``aegis_http_request_seconds{route}``: time until the response started (a live stream counts
  until its headers, not for as long as it stays open);
* ``aegis_live_clients``: live streams open now;
* ``aegis_slack_interactions_refused_total{why}``: Slack interaction requests refused (signature
  or timestamp, replay, payload, incident).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from aegis_runtime.metrics import Metrics

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, MutableMapping

    from aegis_dashboard_api.live import Hub

    Scope = MutableMapping[str, Any]
    Message = MutableMapping[str, Any]
    Receive = Callable[[], Awaitable[Message]]
    Send = Callable[[Message], Awaitable[None]]
    ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# a request no route matched (404s of random paths): one series, whatever the path
UNMATCHED = "unmatched"


class DashboardMetrics:
    def __init__(self, service: str, hub: Hub) -> None:
        self.metrics = Metrics(service)
        self.requests = self.metrics.counter(
            "http_requests_total",
            "HTTP requests answered, by route template, method and status.",
            ("route", "method", "status"),
        )
        self.seconds = self.metrics.histogram(
            "http_request_seconds",
            "Time until the response started, by route template.",
            ("route",),
        )
        clients = self.metrics.gauge("live_clients", "Live event streams open now.")
        clients.set_function(lambda: len(hub.listeners))
        self.slack_refusals = self.metrics.counter(
            "slack_interactions_refused_total",
            "Slack interaction requests refused: signature (or timestamp), replay, payload, "
            "incident (unknown or resolved).",
            ("why",),
        )
        self.audit_failures = self.metrics.counter(
            "dashboard_audit_failures_total",
            "Audit events that could not be written (the action stands; the event is in the log).",
        )
        self.change_events_lost = self.metrics.counter(
            "dashboard_change_events_lost_total",
            "Writes made here (incidents acknowledged or resolved, jobs changed) whose "
            "announcement on aegis.changes JetStream did not confirm (NATS away or not taking "
            "them): other screens see them at their next read; jobs they would start may not.",
        )
        self.login_events_lost = self.metrics.counter(
            "dashboard_login_events_lost_total",
            "Sign-ins not announced as a login system event (NATS away): Login jobs did not start.",
        )

        self.select_events_lost = self.metrics.counter(
            "dashboard_select_events_lost_total",
            "Reads of one entity not announced as a select system event (NATS away): Select "
            "jobs did not start.",
        )

    def slack_refused(self, why: str) -> None:
        self.slack_refusals.labels(why=why).inc()

    def middleware(self, app: ASGIApp) -> ASGIApp:
        """Pure ASGI (a live stream passes through untouched): counts each HTTP request once
        its response starts, under the route the router matched."""

        async def observed(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            started = time.perf_counter()
            status = 500  # an exception before any response

            async def sending(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = int(message["status"])
                    self.seconds.labels(route=_route(scope)).observe(time.perf_counter() - started)
                await send(message)

            try:
                await app(scope, receive, sending)
            finally:
                self.requests.labels(
                    route=_route(scope), method=scope.get("method", ""), status=str(status)
                ).inc()

        return observed


def _route(scope: Scope) -> str:
    """The template of the path the router matched: each path parameter's segment back to
    ``{name}`` (the route object FastAPI leaves in the scope has its path without the prefix
    of the router it was included from)."""
    if scope.get("route") is None:
        return UNMATCHED
    segments = str(scope.get("path", "")).split("/")
    for name, value in (scope.get("path_params") or {}).items():
        segments = [f"{{{name}}}" if part == str(value) else part for part in segments]
    return "/".join(segments)
