"""The dashboard process's one listener on the queue: a NATS connection whose core subscriptions
hear the events the other services publish, and turn them into page events on the :class:`Hub`.

The number of subscriptions is fixed per process (one per subject below), never per open screen.
Core NATS, not a JetStream consumer: a live view needs no replay (every browser starts from a
snapshot on each connect), and a dashboard that stops leaves no consumer behind on the server.
A connection of its own (:func:`aegis_runtime.natsio.connect`), not a FastStream broker's: it must
come back after any outage and close while NATS is away (the natsio module says why FastStream's
does not).

| subject | published by | page event |
|---|---|---|
| ``aegis.changes.factory_latest`` | processor, its refresh | ``factory`` (fleet entry + LATEST) |
| ``aegis.objects.created.cloud_infra`` | cloud collectors | ``cloud`` (CLOUD#infra LATEST, read once) |
| ``aegis.events.alert_sent`` | alert dispatcher | ``alerts`` (the firing alerts, read once) |
| ``aegis.objects.created.metrics_5m`` | aggregator | ``graph`` (which factory's 6-24 h charts) |
| ``aegis.objects.created.reports`` | reporter | ``reports`` (date and target) |
| ``aegis.changes.incident`` | alert dispatcher, dashboards | ``incident`` (its id, state, version) |

What it publishes: the incidents people acknowledge or resolve on a dashboard and the jobs
admins change there (:meth:`LiveFeed.announce`, the read model's change sink), so every other
dashboard replica's screens, and the orchestrator's triggers, hear of them as they hear of the
dispatcher's changes and of ``aegis jobs``; and each sign-in (:meth:`LiveFeed.announce_event`,
``aegis.events.login``, the orchestrator's Login triggers).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pydantic
import structlog

from aegis_contracts.backoff import spread_s
from aegis_contracts.events import ChangeEvent, ObjectCreated, SystemEvent
from aegis_contracts.people import factory_of
from aegis_contracts.subjects import change_subject, object_created_subject, system_subject
from aegis_dashboard_api.live import Hub, LiveEvent, factory_event, family_of
from aegis_dashboard_api.routes import Reader, fleet_entry
from aegis_runtime import natsio
from aegis_runtime.bus import MSG_ID_HEADER, connect_options
from aegis_runtime.service import change_message
from aegis_storage.items import Change

if TYPE_CHECKING:
    from aegis_runtime.natsio import Client, Msg

log = structlog.get_logger(__name__)

FACTORY_CHANGES = change_subject("factory_latest")
CLOUD_OBJECTS = object_created_subject("cloud_infra")
GRAPH_OBJECTS = object_created_subject("metrics_5m")
REPORT_OBJECTS = object_created_subject("reports")
ALERTS_SENT = system_subject("alert_sent")
INCIDENT_CHANGES = change_subject("incident")
SUBJECTS = (
    FACTORY_CHANGES,
    CLOUD_OBJECTS,
    GRAPH_OBJECTS,
    REPORT_OBJECTS,
    ALERTS_SENT,
    INCIDENT_CHANGES,
)
# how long a dashboard waits for JetStream to take an incident change it announces
ANNOUNCE_TIMEOUT_S = 5.0
# changes written here and not announced yet (in order, off the request's path): beyond this
# many, while NATS cannot take them, a new one is counted lost
ANNOUNCE_BACKLOG = 1000
# how long a change is tried again (NATS away, or not taking it) before it is counted lost
ANNOUNCE_HOLD_S = 30.0
# the cloud and alert views a connecting browser gets are read again when older than this (an
# alert can also clear without a message being sent)
SNAPSHOT_MAX_AGE_S = 15.0
ERROR_LOG_EVERY_S = 60.0
STOPPED = "the dashboard stopped before announcing it"


def _nothing() -> None:
    return None


class LiveFeed:
    """Connects in the background (the read API serves while NATS is away), subscribes once,
    and keeps the latest cloud and alert views for the snapshot a browser gets on connect."""

    def __init__(self, reader: Reader, hub: Hub, *, on_lost: Callable[[], None] = _nothing) -> None:
        """Connects as the reader's settings say: their NATS identity (``dashboard-api``, which
        may read these subjects and publish incident changes only), its inbox, TLS. ``on_lost``
        counts a change written here that could not be announced."""
        self.reader, self.hub = reader, hub
        self.on_lost = on_lost
        # (change, when it was written) in write order, announced by run()
        self.changes: asyncio.Queue[tuple[Change, datetime]] = asyncio.Queue(ANNOUNCE_BACKLOG)
        self._unannounced = 0
        self.nc: Client | None = None
        self.cloud: dict[str, Any] | None = None
        self.alerts: list[dict[str, Any]] | None = None
        self._refresh_lock = asyncio.Lock()
        self._cloud_at = self._alerts_at = 0.0
        self._closing = False
        self._error_logged_at = -ERROR_LOG_EVERY_S

    @property
    def connected(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    async def run(self, stop: asyncio.Event) -> None:
        """Connect (retrying until ``stop``: the API serves meanwhile), subscribe, stay; announce
        the changes written here as they come (at ``stop``, what is queued gets
        ``ANNOUNCE_TIMEOUT_S`` more)."""
        connecting = asyncio.create_task(self._connect(), name="live-feed-connect")
        stopping = asyncio.create_task(stop.wait(), name="live-feed-stop")
        announcing = asyncio.create_task(self._announce_changes(), name="live-feed-announce")
        try:
            await asyncio.wait({connecting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if connecting.done():
                self.nc = connecting.result()
                for subject in SUBJECTS:
                    await self.nc.subscribe(subject, cb=self._on_message)
                log.info("live_feed_subscribed", subjects=list(SUBJECTS))
                await stopping
        finally:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changes.join(), ANNOUNCE_TIMEOUT_S)
            self._closing = True
            for task in (connecting, stopping, announcing):
                task.cancel()
            await asyncio.gather(connecting, stopping, announcing, return_exceptions=True)
            self._give_up_queued()
            if self.nc is not None:
                with contextlib.suppress(Exception):
                    await self.nc.close()

    async def _connect(self) -> Client:
        return await natsio.connect(
            connect_options(self.reader.settings),
            name="aegis-dashboard-api",
            allow_reconnect=True,
            max_reconnect_attempts=-1,  # forever: live updates resume when NATS is back
            reconnect_time_wait=1,
            error_cb=self._on_error,
            disconnected_cb=self._on_disconnected,
            reconnected_cb=self._on_reconnected,
        )

    async def _on_error(self, err: Exception) -> None:
        # one line per minute while NATS is away, not one per connection attempt
        now = time.monotonic()
        if now - self._error_logged_at >= ERROR_LOG_EVERY_S:
            self._error_logged_at = now
            log.warning("live_feed_nats_error", error=str(err) or type(err).__name__)

    async def _on_disconnected(self) -> None:
        if not self._closing:
            log.warning("live_feed_disconnected")

    async def _on_reconnected(self) -> None:
        # events were missed while away: every screen gets the state again (read once for all),
        # and the open charts reload
        log.info("live_feed_reconnected")
        self._cloud_at = self._alerts_at = 0.0
        try:
            for event in await self.snapshot():
                self.hub.publish(event)
        except Exception as err:
            log.warning("live_feed_resync_failed", error=str(err)[:300])
        self.hub.publish(LiveEvent("resync", {}))

    async def _on_message(self, msg: Msg) -> None:
        try:
            await self.handle(msg.subject, msg.data)
        except (pydantic.ValidationError, ValueError) as err:
            log.warning("live_event_ignored", subject=msg.subject, error=str(err)[:300])
        except Exception as err:  # a read for the page failed: the next event tries again
            log.warning("live_event_failed", subject=msg.subject, error=str(err)[:300])

    async def handle(self, subject: str, data: bytes) -> None:
        """Turn one queue event into page events (also called by tests with made-up events)."""
        settings = self.reader.settings
        if subject == FACTORY_CHANGES:
            change = ChangeEvent.model_validate_json(data)
            event = factory_event(
                change, table=settings.table, now=self.reader.clock(), entry_of=fleet_entry
            )
            if event is not None:
                if event.name == "factory":
                    self.reader.note_latest(event.data["latest"])
                self.hub.publish(event)
        elif subject == ALERTS_SENT:
            self.hub.publish(LiveEvent("alerts", {"alerts": await self.read_alerts()}))
        elif subject == INCIDENT_CHANGES:
            change = ChangeEvent.model_validate_json(data)
            image = change.new_image or change.old_image or {}
            self.hub.publish(
                LiveEvent(
                    "incident",
                    {
                        "incident_id": image.get("incident_id"),
                        "scope": image.get("scope"),
                        "state": image.get("state"),
                        "version": image.get("version"),
                    },
                    factory_of(str(image.get("scope"))),
                )
            )
        else:
            created = ObjectCreated.model_validate_json(data)
            found = family_of(created.key) if created.bucket == settings.bucket else None
            if found is None:
                return
            family, target = found
            if family == "cloud":
                self.hub.publish(LiveEvent("cloud", {"latest": await self.read_cloud()}, None))
            else:
                about = factory_of(target)
                self.hub.publish(LiveEvent(family, {"target": target, "key": created.key}, about))

    async def announce(self, change: Change) -> None:
        """The read model's change sink: a write this dashboard made (an incident acknowledged
        or resolved, a job changed), queued to go on ``aegis.changes.{entity}`` in write order
        (:meth:`run` announces it, taken by JetStream like every other service's). The person
        who made it never waits for NATS: the write stands, and screens see it at their next
        read of the list whatever becomes of its announcement. A change the queue has no room
        for, or that JetStream has not taken within ``ANNOUNCE_HOLD_S`` of tries, is logged and
        counted lost (``dashboard_change_events_lost_total``)."""
        try:
            self.changes.put_nowait((change, self.reader.clock()))
        except asyncio.QueueFull:
            self._lost(change, "the queue of changes to announce is full")
        else:
            self._unannounced += 1

    @property
    def unannounced(self) -> int:
        """Changes written here whose announcement is queued or under way."""
        return self._unannounced

    async def _announce_changes(self) -> None:
        while True:
            change, at = await self.changes.get()
            try:
                await self._announce_one(change, at)
            except asyncio.CancelledError:
                self._lost(change, STOPPED)
                raise
            except Exception as err:
                self._lost(change, str(err) or type(err).__name__)
            finally:
                self._unannounced -= 1
                self.changes.task_done()

    async def _announce_one(self, change: Change, at: datetime) -> None:
        """Publish one change, again after each failure (its message id makes a repeat one
        stored message) until ``ANNOUNCE_HOLD_S`` has passed since it was taken up."""
        settings = self.reader.settings
        subject, event, msg_id = change_message(
            change, table=settings.table, producer=settings.service, at=at
        )
        body = event.model_dump_json().encode()
        deadline = time.monotonic() + ANNOUNCE_HOLD_S
        attempt = 0
        while True:
            try:
                await self._publish(subject, body, msg_id)
            except Exception:
                attempt += 1
                wait = spread_s(attempt, first=0.2, cap=5.0)
                if time.monotonic() + wait >= deadline:
                    raise
                await asyncio.sleep(wait)
            else:
                return

    def _lost(self, change: Change, why: str) -> None:
        self.on_lost()
        log.warning(
            "change_not_announced",
            entity=change.entity,
            pk=change.pk,
            sk=change.sk,
            event_name=change.event_name,
            error=why[:300],
        )

    def _give_up_queued(self) -> None:
        while not self.changes.empty():
            change, _ = self.changes.get_nowait()
            self._unannounced -= 1
            self.changes.task_done()
            self._lost(change, STOPPED)

    async def announce_event(self, event: SystemEvent, *, msg_id: str) -> None:
        """A system event of this dashboard's (a sign-in: ``aegis.events.login``), taken by
        JetStream; raises while NATS is away."""
        await self._publish(system_subject(event.kind), event.model_dump_json().encode(), msg_id)

    async def _publish(self, subject: str, body: bytes, msg_id: str) -> None:
        if self.nc is None or not self.nc.is_connected:
            raise ConnectionError(f"NATS is not connected: {subject} is not announced")
        await self.nc.jetstream().publish(
            subject, body, timeout=ANNOUNCE_TIMEOUT_S, headers={MSG_ID_HEADER: msg_id}
        )

    async def read_cloud(self) -> dict[str, Any] | None:
        self.cloud = await self.reader.readmodel.get_cloud_latest()
        self._cloud_at = time.monotonic()
        return self.cloud

    async def read_alerts(self) -> list[dict[str, Any]]:
        self.alerts = await self.reader.readmodel.firing_alerts(now=self.reader.clock())
        self._alerts_at = time.monotonic()
        return self.alerts

    async def snapshot(self) -> list[LiveEvent]:
        """What a browser gets on every connect: the fleet, the firing alerts, cloud infra."""
        now = self.reader.clock()
        fleet = [
            fleet_entry(i, now).model_dump(mode="json") for i in await self.reader.fleet_items()
        ]
        async with self._refresh_lock:  # N screens reconnecting at once read these once
            fresh = time.monotonic() - SNAPSHOT_MAX_AGE_S
            alerts = self.alerts
            if alerts is None or self._alerts_at < fresh:
                alerts = await self.read_alerts()
            cloud = self.cloud if self._cloud_at >= fresh else await self.read_cloud()
        return [
            LiveEvent("fleet", {"factories": fleet, "generated_at": now.isoformat()}),
            LiveEvent("alerts", {"alerts": alerts}),
            LiveEvent("cloud", {"latest": cloud}, None),
        ]
