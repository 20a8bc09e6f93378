"""Composition root of the alert dispatcher: the service shell (broker, clients, health,
heartbeat), a durable pull consumer of ObjectCreated events and an aiohttp session for Slack."""

from __future__ import annotations

import asyncio
import contextlib
from contextlib import AsyncExitStack
from datetime import timedelta
from typing import Any

import aiohttp
import structlog

from aegis_alert_dispatcher.decide import Policy
from aegis_alert_dispatcher.dispatcher import (
    SERVICE,
    UNDELIVERABLE,
    Dispatcher,
    Result,
    dead_letter_body,
)
from aegis_alert_dispatcher.escalation import EscalationConfig, load_escalation
from aegis_alert_dispatcher.escalator import Escalator
from aegis_alert_dispatcher.incident_metrics import IncidentMetrics
from aegis_alert_dispatcher.receivers import (
    Receiver,
    ReceiverConfigError,
    SnsClientPool,
    build_receiver,
    parse_receiver_config,
)
from aegis_alert_dispatcher.settings import DispatcherSettings
from aegis_alert_dispatcher.slack import SlackWebhook
from aegis_contracts import keys
from aegis_contracts.bus import consumer
from aegis_contracts.events import ObjectCreated, SystemEvent
from aegis_contracts.subjects import STREAMS, system_subject
from aegis_contracts.times import Clock, utc_now
from aegis_runtime import logging as aegis_logging
from aegis_runtime.bus import dead_letter, durable_pull, stop_consuming
from aegis_runtime.lifecycle import run_service, start_background
from aegis_runtime.service import ServiceApp
from aegis_storage.clients import AwsClients
from aegis_storage.errors import StorageError
from aegis_storage.fleetindex import FIRING_ALERTS
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore

log = structlog.get_logger(__name__)

EVENTS_STREAM = next(s for s in STREAMS if s.name == "AEGIS_EVENTS")


class DispatcherApp(ServiceApp):
    """``await run(stop)`` under run_service; tests call ``start()``/``stop()`` or ``run``."""

    settings: DispatcherSettings

    def __init__(self, settings: DispatcherSettings, *, clock: Clock = utc_now) -> None:
        super().__init__(settings, clock=clock)
        self.decisions = self.metrics.counter(
            "alert_decisions_total",
            "Alert decisions by outcome (sent, suppressed_cooldown, waiting_observations, "
            "stale, resolved, undeliverable, ...) and action.",
            ("outcome", "action", "severity"),
        )
        self.webhook_attempts = self.metrics.counter(
            "slack_webhook_attempts_total",
            "POSTs to the Slack webhook by HTTP status.",
            ("status",),
        )
        self.incidents_swept = self.metrics.counter(
            "incident_sweeps_total",
            "What the sweep over open incidents did: escalate, renotify, failover, taken_over, "
            "archived, claimed_elsewhere, silenced, unsilenced, no_longer_reported.",
            ("outcome",),
        )
        self.incident_metrics = IncidentMetrics(
            self.metrics, clock=self.clock, refresh_s=settings.incident_metrics_refresh_s
        )
        self.dispatcher: Dispatcher | None = None
        self.escalator: Escalator | None = None
        # the escalation file is read at start: a file with a mistake stops the service at once
        self.escalation = load_escalation(settings.escalation_file, validate_receiver=_typed)

        @durable_pull(
            self.broker,
            EVENTS_STREAM,
            settings.alert_durable,
            subject=consumer("alert-dispatcher").subject,
            batch_size=settings.alert_batch_size,
            fetch_timeout=settings.alert_fetch_timeout_s,
            ack_wait=settings.alert_ack_wait_s,
            max_deliver=settings.alert_max_deliver,
            user=settings.nats_user,
        )
        async def on_object_created(event: ObjectCreated) -> None:
            await self.handle(event)

    async def handle(self, event: ObjectCreated) -> list[Result]:
        if self.dispatcher is None:
            raise RuntimeError("the dispatcher is not started")  # nacked: retried later
        return await self.dispatcher.handle(event)

    def _count(self, result: Result) -> None:
        self.decisions.labels(
            outcome=result.outcome,
            action=result.action.value if result.action else "",
            severity=result.severity or "",
        ).inc()

    def _count_attempt(self, status: int | None) -> None:
        self.webhook_attempts.labels(status=str(status) if status is not None else "error").inc()

    async def _dead_letter(self, record: dict[str, Any], detail: str, message_id: str) -> None:
        await dead_letter(
            self.broker,
            service=SERVICE,
            reason=UNDELIVERABLE,
            payload=dead_letter_body(record),
            detail=detail,
            message_id=message_id,
        )

    async def _announce(self, detail: dict[str, Any], msg_id: str) -> None:
        event = SystemEvent(kind="alert_sent", producer=SERVICE, at=self.clock(), detail=detail)
        await self.publish(system_subject("alert_sent"), event, msg_id=msg_id)

    async def setup(self, stack: AsyncExitStack, clients: AwsClients) -> None:
        s = self.settings
        session = await stack.enter_async_context(aiohttp.ClientSession())
        webhook = s.slack_webhook_url.get_secret_value() if s.slack_webhook_url else None
        sender = (
            SlackWebhook(
                webhook,
                session,
                max_attempts=s.slack_max_attempts,
                first_delay=s.slack_first_delay_s,
                max_delay=s.slack_max_delay_s,
                timeout=s.slack_timeout_s,
                on_attempt=self._count_attempt,
            )
            if webhook
            else None
        )
        self.dispatcher = Dispatcher(
            store=ObjectStore(clients, s.bucket),
            readmodel=ReadModel(clients.items, s.table, changes=self.publish_change),
            sender=sender,
            dead_letter=self._dead_letter,
            announce=self._announce,
            policy=Policy(
                cooldown_critical=timedelta(seconds=s.alert_cooldown_critical_s),
                cooldown_warning=timedelta(seconds=s.alert_cooldown_warning_s),
                cloud_warning_observations=s.alert_cloud_warning_observations,
                state_warning_for=timedelta(seconds=s.alert_warning_for_s),
            ),
            ttl=s.ttl,
            dashboard_url=s.dashboard_url,
            clock=self.clock,
            triggers=s.alert_trigger_prefixes,
            on_result=self._count,
            lease=timedelta(seconds=s.send_lease_s),
            escalation=self.escalation,
            post_in_background=True,
            incident_store=self.incident_metrics.watch(
                clients, table=s.table, bucket=s.bucket, changes=self.publish_change
            ),
        )
        sns = await stack.enter_async_context(SnsClientPool(s.aws()))
        receivers = build_receivers(
            self.escalation, session=session, sns_clients=sns, on_attempt=self._count_attempt
        )
        self.escalator = Escalator(
            store=self.dispatcher.incidents,
            config=self.escalation,
            receivers=receivers,
            clock=self.clock,
            dashboard_url=s.dashboard_url,
            instance=self.dispatcher.instance,
            lease=timedelta(seconds=s.notification_lease_s),
            on_swept=lambda swept: self.incidents_swept.labels(outcome=swept.outcome).inc(),
            owner_dead=self.dispatcher.owner_dead,
            first_receiver=self.dispatcher.receiver_name,
            still_reported=self.dispatcher.still_reported,
        )
        # the policy's other level-0 receivers hear of a fire as its message is posted
        self.dispatcher.alongside = self.escalator.notify_now
        start_background(stack, self._heartbeats, "replica-heartbeat")
        # closed before the session, the receivers' clients and the heartbeat: the consumers
        # stop (in-flight messages finish or are cancelled), then the posts in progress finish,
        # are confirmed and announced, while this replica still says it is alive (no other
        # takes its messages over meanwhile); the broker itself is closed after
        stack.push_async_callback(self._drain)
        start_background(stack, self._sweeps, "incident-sweep")
        start_background(stack, self.incident_metrics.run, "incident-metrics")
        self.backfill_fleet_index(stack, clients, FIRING_ALERTS)
        log.info(
            "alert_dispatcher_started",
            webhook=bool(webhook),
            triggers=s.alert_trigger_prefixes,
            receivers={name: r is not None for name, r in receivers.items()},
        )

    async def _heartbeats(self, stop: asyncio.Event) -> None:
        """This replica is alive: every quarter of ``alive_for`` (a missed one is tried again)."""
        dispatcher = self.dispatcher
        assert dispatcher is not None
        every = dispatcher.alive_for.total_seconds() / 4
        while not stop.is_set():
            try:
                await dispatcher.heartbeat()
            except StorageError as err:
                log.warning("replica_heartbeat_failed", error=str(err))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=every)

    async def _sweeps(self, stop: asyncio.Event) -> None:
        """Every ``AEGIS_ESCALATION_TICK_S``: one read of the index entries the sweep watches,
        then the messages whose sender stopped, then the open incidents."""
        dispatcher, escalator = self.dispatcher, self.escalator
        assert dispatcher is not None and escalator is not None
        while not stop.is_set():
            try:
                members = await dispatcher.readmodel.index_members(keys.FLEET_INCIDENT)
                await dispatcher.complete_abandoned(members)
                await escalator.sweep(members)
            except StorageError as err:
                log.warning("incident_sweep_failed", error=str(err))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.settings.escalation_tick_s)

    async def _drain(self) -> None:
        await stop_consuming(self.broker)
        if self.dispatcher is not None:
            await self.dispatcher.drain()

    async def stop(self) -> None:
        await super().stop()
        self.dispatcher = None


def _typed(name: str, raw: dict[str, Any]) -> None:
    """A receiver table of the escalation file, checked as its type says (at start-up)."""
    parse_receiver_config(raw)


def build_receivers(
    config: EscalationConfig,
    *,
    session: aiohttp.ClientSession,
    sns_clients: SnsClientPool,
    on_attempt: Any = None,
) -> dict[str, Receiver | None]:
    """Every receiver of the escalation file; one whose secret's variable is unset is None (its
    notifications are logged only, as alerts are without a webhook) and said once at start."""
    built: dict[str, Receiver | None] = {}
    for name, raw in config.receivers.items():
        try:
            built[name] = build_receiver(
                name,
                parse_receiver_config(raw),
                session=session,
                sns_clients=sns_clients,
                on_attempt=on_attempt,
            )
        except ReceiverConfigError as err:
            log.warning("receiver_not_configured", receiver=name, why=str(err))
            built[name] = None
    return built


def main() -> None:
    settings = DispatcherSettings()
    aegis_logging.configure(settings.log_format, settings.log_level)
    run_service(DispatcherApp(settings).run)
