"""Silences in the read model: one partition (``SILENCE`` / ``{silence_id}``) read whole.

A silence is written once (if absent) and changed only to end it early; it expires from the
table 30 days after its end. Readers that ask often (the dispatcher, before each notification)
keep what they read for a few seconds: a new silence takes effect within that time.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta
from typing import Any

import pydantic

from aegis_contracts import keys
from aegis_contracts.silences import Silence, end_early
from aegis_storage.errors import NotFound
from aegis_storage.items import Items

log = logging.getLogger(__name__)

KEPT_AFTER_END = timedelta(days=30)


def _item(silence: Silence) -> dict[str, Any]:
    body = silence.model_dump(mode="json")
    body["matchers"] = [str(m) for m in silence.matchers]
    return {
        "pk": keys.SILENCE_PK,
        "sk": keys.silence_id(silence.id),
        **body,
        "ttl": int((silence.ends_at + KEPT_AFTER_END).timestamp()),
    }


class SilenceStore:
    def __init__(self, readmodel: Items, *, cache_s: float = 0.0) -> None:
        self.readmodel = readmodel
        self.cache_s = cache_s
        self._cached: list[Silence] | None = None
        self._read_at = 0.0

    async def add(self, silence: Silence) -> None:
        await self.readmodel.put_item(_item(silence), if_absent=True)
        self._cached = None

    async def listed(self, *, now: datetime) -> list[Silence]:
        """Every silence not yet expired from the table, by start (cached ``cache_s``)."""
        if self._cached is not None and time.monotonic() - self._read_at < self.cache_s:
            return self._cached
        started = time.monotonic()
        found: list[Silence] = []
        for item in await self.readmodel.partition(keys.SILENCE_PK, now=now):
            fields = {k: v for k, v in item.items() if k not in ("pk", "sk", "ttl")}
            try:
                found.append(Silence.model_validate(fields))
            except pydantic.ValidationError as err:
                log.warning("silence_unreadable %s: %s", item.get("sk"), err)
        found.sort(key=lambda s: (s.starts_at, s.id))
        self._cached, self._read_at = found, started
        return found

    async def get(self, silence_id: str) -> Silence | None:
        item = await self.readmodel.get_item(keys.SILENCE_PK, keys.silence_id(silence_id))
        if item is None:
            return None
        return Silence.model_validate(
            {k: v for k, v in item.items() if k not in ("pk", "sk", "ttl")}
        )

    async def end(self, silence_id: str, *, by: str, at: datetime) -> Silence:
        """End it now (kept: who and when); ending an ended one changes nothing."""
        current = await self.get(silence_id)
        if current is None:
            raise NotFound(f"no silence {silence_id}")
        if current.ends <= at:
            return current
        ended = end_early(current, at=at, by=by)
        await self.readmodel.put_item(_item(ended))  # two people ending it: the same end
        self._cached = None
        return ended
