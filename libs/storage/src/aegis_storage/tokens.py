"""Dashboard tokens in the read model: one partition (``TOKEN`` / ``{name}``) read whole.

A token is written once (a name is taken once: two `aegis tokens create` of one name, one
wins) and changed only to revoke it; revoked tokens stay, as a record of who had what. Only the
token's SHA-256 digest is kept. The dashboard reads the partition every few seconds and takes
what it finds: a token created or revoked here is in effect there within that time.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import pydantic

from aegis_contracts import keys
from aegis_contracts.people import TokenRecord
from aegis_storage.errors import Conflict, NotFound
from aegis_storage.readmodel import ReadModel

log = logging.getLogger(__name__)


class TokenNameTaken(Exception):
    """A token of that name exists (revoked ones too: a name is never reused)."""


def _item(token: TokenRecord) -> dict[str, Any]:
    body = token.model_dump(mode="json")
    body["scope"] = list(token.scope)
    return {"pk": keys.TOKEN_PK, "sk": keys.token_name(token.name), **body}


def _record(item: dict[str, Any]) -> TokenRecord:
    return TokenRecord.model_validate({k: v for k, v in item.items() if k not in ("pk", "sk")})


class TokenStore:
    def __init__(self, readmodel: ReadModel) -> None:
        self.readmodel = readmodel

    async def add(self, token: TokenRecord) -> None:
        """Keep ``token``; :class:`TokenNameTaken` when its name is taken."""
        try:
            await self.readmodel.put_item(_item(token), if_absent=True)
        except Conflict:
            raise TokenNameTaken(f"a token named {token.name!r} exists") from None

    async def listed(self, *, now: datetime) -> list[TokenRecord]:
        """Every token kept, revoked and expired ones included, by name. An item that does not
        read as a token is left out (and logged), not allowed in."""
        found: list[TokenRecord] = []
        for item in await self.readmodel.partition(keys.TOKEN_PK, now=now):
            try:
                found.append(_record(item))
            except pydantic.ValidationError as err:
                log.warning("token_unreadable %s: %s", item.get("sk"), err)
        return sorted(found, key=lambda t: t.name)

    async def get(self, name: str) -> TokenRecord | None:
        item = await self.readmodel.get_item(keys.TOKEN_PK, keys.token_name(name))
        return None if item is None else _record(item)

    async def revoke(self, name: str, *, by: str, at: datetime) -> TokenRecord:
        """Revoke it now (who and when are kept); revoking a revoked one changes nothing."""
        current = await self.get(name)
        if current is None:
            raise NotFound(f"no token {name!r}")
        if current.revoked_at is not None:
            return current
        revoked = current.model_copy(update={"revoked_at": at, "revoked_by": by})
        await self.readmodel.put_item(_item(revoked), expected={"digest": current.digest})
        return revoked
