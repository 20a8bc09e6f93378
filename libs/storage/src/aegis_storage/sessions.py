"""Sign-in sessions in the read model: one item per session (``SESSION#{digest}`` /
``SESSION``), so every replica of the dashboard knows it and signing out ends it everywhere.

The browser's cookie carries a random session id; the table knows only its SHA-256. An item
holds the identity, when the session ends (``expires_at``, and ``ttl``: DynamoDB removes it some
time later) and the ID token the provider's sign-out wants as a hint. Signing out writes the
item again with ``ended_at`` and without the ID token (it stays, a record, until its ``ttl``).
Reading checks both itself, at the caller's ``now``: DynamoDB's TTL deletion is late by hours.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

import pydantic
from pydantic import BaseModel, ConfigDict

from aegis_contracts import keys
from aegis_contracts.people import Identity
from aegis_storage.readmodel import ReadModel


class Session(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    identity: Identity
    started_at: datetime
    expires_at: datetime
    id_token: str | None = None  # for the provider's sign-out (id_token_hint)
    ended_at: datetime | None = None  # signed out

    def valid(self, now: datetime) -> bool:
        """Neither signed out nor expired at ``now``."""
        return self.ended_at is None and now < self.expires_at


def session_digest(session_id: str) -> str:
    """What the table keys a session by: the SHA-256 hex of its id."""
    return hashlib.sha256(session_id.encode()).hexdigest()


class SessionStore:
    def __init__(self, readmodel: ReadModel) -> None:
        self.readmodel = readmodel

    async def start(
        self,
        session_id: str,
        identity: Identity,
        *,
        now: datetime,
        max_age: timedelta,
        id_token: str | None = None,
    ) -> Session:
        """Record a new session of ``identity`` lasting ``max_age`` from ``now``; a session id
        that is already taken is a :class:`~aegis_storage.errors.Conflict` (never overwritten)."""
        session = Session(
            identity=identity, started_at=now, expires_at=now + max_age, id_token=id_token
        )
        await self.readmodel.put_item(self._item(session_id, session), if_absent=True)
        return session

    async def get(self, session_id: str, *, now: datetime) -> Session | None:
        """The session if it is valid at ``now``; None when unknown, expired or signed out. A
        consistent read: a sign-out on another replica has taken effect."""
        item = await self.readmodel.get_item(
            keys.session_pk(session_digest(session_id)), keys.SESSION_SK
        )
        if item is None:
            return None
        try:
            session = Session.model_validate(
                {k: v for k, v in item.items() if k not in ("pk", "sk", "ttl")}
            )
        except pydantic.ValidationError:
            return None  # written by another release, or by hand: no session
        return session if session.valid(now) else None

    async def end(self, session_id: str, *, now: datetime) -> Session | None:
        """Sign out: the session is ended from ``now`` on (its ID token dropped). The session as
        it was when valid (its ID token for the provider's sign-out), else None."""
        session = await self.get(session_id, now=now)
        if session is None:
            return None
        ended = session.model_copy(update={"ended_at": now, "id_token": None})
        await self.readmodel.put_item(self._item(session_id, ended))
        return session

    @staticmethod
    def _item(session_id: str, session: Session) -> dict[str, object]:
        return {
            "pk": keys.session_pk(session_digest(session_id)),
            "sk": keys.SESSION_SK,
            **session.model_dump(mode="json"),
            "ttl": int(session.expires_at.timestamp()),
        }
