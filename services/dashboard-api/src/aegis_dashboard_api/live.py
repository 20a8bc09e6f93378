"""Live updates: the change events of the queue, turned into the page's events and fanned out
in-process to every open screen (server-sent events).

One :class:`Hub` per process holds a bounded queue per connected browser. Publishing never
waits: a browser whose queue is full (a slow or stalled client) is dropped, its stream ends, and
its EventSource reconnects and starts again from a fresh snapshot, so one slow screen never
delays the others. The translation of queue events into page events is pure (``factory_event``,
``family_of``) so it is tested without a broker.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog
from sse_starlette import ServerSentEvent

from aegis_contracts.events import ChangeEvent
from aegis_contracts.people import Act, Identity, decide, factory_of
from aegis_dashboard_api.models import Item

log = structlog.get_logger(__name__)

# how long a browser waits before reconnecting after the stream ends (the SSE `retry:` field)
RETRY_MS = 3000


EVERYONE = "<everyone>"  # an event every listener gets (resync)
# a list event's entries and the factory of each: each listener gets the entries it may read
ENTRY_FACTORY: dict[str, tuple[str, Callable[[dict[str, Any]], str | None]]] = {
    "fleet": ("factories", lambda e: str(e.get("factory_id"))),
    "alerts": ("alerts", lambda a: factory_of(alert_scope(a))),
}


def alert_scope(alert: Item) -> str:
    """An ALERT# item's scope: a factory id, or ``cloud-infra``."""
    return str(alert.get("scope") or str(alert.get("pk", "")).removeprefix("ALERT#"))


@dataclass(frozen=True, slots=True)
class LiveEvent:
    """One page event: ``name`` is the SSE event type, ``data`` its JSON body, ``about`` whose
    it is: a factory (seen by those who may read it), None (the platform's: the cloud, seen with
    the whole fleet in scope), :data:`EVERYONE`; a list event (fleet, alerts) is cut per
    listener to the entries it may read."""

    name: str
    data: dict[str, Any]
    about: str | None = EVERYONE

    def frame(self, event_id: str) -> bytes:
        """The event as it goes on the wire (encoded once per audience, however many browsers
        get it)."""
        body = json.dumps(self.data, separators=(",", ":"), ensure_ascii=False, default=str)
        return ServerSentEvent(body, event=self.name, id=event_id, sep="\n").encode()

    def seen_by(self, who: Identity) -> LiveEvent | None:
        """The event as ``who`` may see it, or None: nothing of a factory out of scope."""
        listed = ENTRY_FACTORY.get(self.name)
        if listed is not None:
            key, factory = listed
            entries = [e for e in self.data.get(key) or [] if decide(who, Act.READ, factory(e))]
            return LiveEvent(self.name, {**self.data, key: entries}, self.about)
        if self.about == EVERYONE or decide(who, Act.READ, self.about):
            return self
        return None


Queued = tuple[LiveEvent, bytes]


class Listener:
    """One connected browser: a bounded queue; ``None`` in it ends the stream. ``who`` sees
    only what it may read; ``token`` (or ``session``) is what it came with: the stream ends
    when that is revoked or gives someone else."""

    def __init__(
        self,
        maxsize: int,
        who: Identity,
        token: str | None = None,
        session: str | None = None,
    ) -> None:
        self.queue: asyncio.Queue[Queued | None] = asyncio.Queue(maxsize)
        self.dropped = False
        self.who = who
        self.token = token
        self.session = session

    def offer(self, item: Queued) -> bool:
        """Queue the event without waiting; False (and the stream ends) when the queue is full."""
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            self.dropped = True
            self.close(drain=True)
            return False
        return True

    def close(self, *, drain: bool = False) -> None:
        """End the stream: after what is queued, or at once (``drain``, or no room left)."""
        if drain or self.queue.full():
            while not self.queue.empty():
                self.queue.get_nowait()
        self.queue.put_nowait(None)

    async def events(self) -> AsyncIterator[Queued]:
        while (item := await self.queue.get()) is not None:
            yield item


class Hub:
    """The process's fan-out: every published event goes to every listener's queue."""

    def __init__(self, queue_size: int = 256) -> None:
        self.queue_size = queue_size
        self.listeners: set[Listener] = set()
        # event ids are unique to this process, so an id from before a restart is recognised
        self.boot = secrets.token_hex(3)
        self._seq = itertools.count(1)
        self.published = 0
        self.dropped = 0
        self.closed = False

    def next_id(self) -> str:
        return f"{self.boot}-{next(self._seq)}"

    def listen(
        self, who: Identity, token: str | None = None, session: str | None = None
    ) -> Listener:
        listener = Listener(self.queue_size, who, token, session)
        if self.closed:
            listener.close()
        else:
            self.listeners.add(listener)
        return listener

    def forget(self, listener: Listener) -> None:
        self.listeners.discard(listener)

    def publish(self, event: LiveEvent) -> None:
        """Hand ``event`` to every listener that may see it, as it may see it, now; never waits
        for a browser. Encoded once per audience (the same role and scope)."""
        self.published += 1
        event_id = self.next_id()
        cut: dict[tuple[bool, tuple[str, ...]], Queued | None] = {}
        for listener in list(self.listeners):
            who = listener.who
            audience = (who.fleet, who.scope)
            if audience not in cut:
                seen = event.seen_by(who)
                cut[audience] = None if seen is None else (seen, seen.frame(event_id))
            item = cut[audience]
            if item is None:
                continue
            if not listener.offer(item):
                self.listeners.discard(listener)
                self.dropped += 1
                log.warning("live_client_dropped", reason="queue_full", size=self.queue_size)

    def revoke(self, still_allowed: Callable[[Listener], bool]) -> int:
        """End the streams no longer allowed (their token revoked, or now someone else's); how
        many ended."""
        ended = [listener for listener in self.listeners if not still_allowed(listener)]
        for listener in ended:
            self.listeners.discard(listener)
            listener.close()
        if ended:
            log.info("live_clients_revoked", streams=len(ended))
        return len(ended)

    def close(self) -> None:
        """End every stream (shutdown): browsers reconnect to whichever replica answers."""
        self.closed = True
        for listener in list(self.listeners):
            listener.close()
        self.listeners.clear()


async def stream(
    hub: Hub, listener: Listener, snapshot: Iterable[LiveEvent], *, resumed_from: str | None
) -> AsyncIterator[ServerSentEvent | bytes]:
    """One browser's event stream: the ``retry:`` field, the current state (on every connect,
    also a resumed one: the page's state is latest-wins, so a snapshot replaces any replay),
    then the live events until the hub drops or closes the listener."""
    try:
        yield ServerSentEvent(comment="aegis live", retry=RETRY_MS, sep="\n")
        for event in snapshot:
            seen = event.seen_by(listener.who)
            if seen is not None:
                yield seen.frame(hub.next_id())
        if resumed_from:
            log.debug("live_client_resumed", last_event_id=resumed_from[:64])
        async for _, frame in listener.events():
            yield frame
    finally:
        hub.forget(listener)


# -- translation of queue events (pure) --------------------------------------------------------


def factory_id_of(item: Item) -> str:
    return str(item.get("factory_id") or str(item.get("pk", "")).removeprefix("FACTORY#"))


def factory_event(
    change: ChangeEvent, *, table: str, now: datetime, entry_of: Any
) -> LiveEvent | None:
    """The page event of a FACTORY LATEST change in ``table``: the fleet entry and the new LATEST
    (the detail page appends it to its 1 h chart: a HISTORY#STATE item is a LATEST snapshot).
    None for other tables (another stack on the same NATS) and other items."""
    if change.table != table or not change.pk.startswith("FACTORY#") or change.sk != "LATEST":
        return None
    factory_id = change.pk.removeprefix("FACTORY#")
    if change.new_image is None:
        return LiveEvent("factory_removed", {"factory_id": factory_id}, factory_id)
    image = dict(change.new_image)
    image.pop("ttl", None)
    entry = entry_of(image, now)
    return LiveEvent(
        "factory", {"entry": entry.model_dump(mode="json"), "latest": image}, factory_id
    )


def family_of(key: str) -> tuple[str, str] | None:
    """(family, factory or target) of an announced object the page shows, else None:
    ``processed_agg/{f}/metrics_5m/…`` (graphs), ``processed/cloud_infra/…`` (cloud),
    ``reports/daily/…/{target}/report.md`` (reports)."""
    parts = key.split("/")
    if len(parts) > 2 and parts[0] == "processed_agg" and parts[2] == "metrics_5m":
        return "graph", parts[1]
    if len(parts) > 2 and parts[0] == "processed" and parts[1] == "cloud_infra":
        return "cloud", parts[2]
    if len(parts) > 2 and parts[0] == "reports" and parts[-1] == "report.md":
        return "reports", parts[-2]
    return None
