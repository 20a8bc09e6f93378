"""Bearer tokens: the request's token is hashed and its digest compared, in constant time, with
every known digest (the tokens themselves are never stored); the one that matches says who the
bearer is (:class:`aegis_contracts.people.Identity`: a role and a scope of factories). A browser
brings its token in the ``Authorization`` header, the sign-in cookie, or once as ``?token=``."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from urllib.parse import parse_qsl, urlencode

import structlog
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from aegis_contracts.people import FLEET, Identity, Role, TokenRecord, parse_scope

log = structlog.get_logger(__name__)
_DIGEST = re.compile(r"[0-9a-f]{64}")


def is_digest(value: str) -> bool:
    """A SHA-256 hex digest, lower case: what token settings and files hold."""
    return _DIGEST.fullmatch(value) is not None


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


@dataclass(frozen=True, slots=True)
class Grant:
    """A token's digest and who it makes its bearer (until ``expires_at``, when set)."""

    digest: str
    identity: Identity
    expires_at: datetime | None = None


def configured_grant(
    entry: str, *, name: str | None = None, role: str | None = None, factories: str | None = None
) -> Grant:
    """A token of the settings or the tokens file: its digest, optionally ``ROLE:`` before it
    (viewer when none: a wall screen), the whole fleet unless ``factories`` narrows it; named by
    the digest's first 8 characters unless ``name`` is given."""
    given_role, _, digest = entry.strip().lower().rpartition(":")
    if not is_digest(digest):
        raise ValueError("a token entry is a SHA-256 hex digest (64 hex characters)")
    chosen = role or given_role or Role.VIEWER.value
    try:
        as_role = Role(chosen)
    except ValueError:
        raise ValueError(f"{chosen!r} is not a role (viewer, responder, admin)") from None
    identity = Identity(
        subject=f"token:{digest[:8]}",
        name=name or digest[:8],
        via="token",
        role=as_role,
        scope=parse_scope(factories) if factories is not None else (FLEET,),
    )
    return Grant(digest, identity)


def stored_grant(record: TokenRecord) -> Grant:
    return Grant(record.digest, record.identity(), record.expires_at)


class TokenSet:
    """The tokens that are allowed now, each with the identity it gives: those of
    ``AEGIS_DASHBOARD_TOKENS``, those listed in ``AEGIS_DASHBOARD_TOKENS_FILE`` (one per line,
    ``#`` comments), which :meth:`reload` reads again when it changed (a Kubernetes Secret
    mounted as a file is updated in place), and those `aegis tokens create` kept in the read
    model (:meth:`take_stored`). Removing a digest, or revoking a kept token, revokes it:
    requests are refused and open live streams end.

    A change of the file is taken once the file has stayed as it is from one look to the next:
    a file rewritten in place is empty (truncated) or half-written for a moment, and taken then
    it would revoke every token it lists. The file as it is at start is taken at once."""

    def __init__(self, fixed: Sequence[Grant], file: Path | None = None) -> None:
        self.fixed = tuple(fixed)
        self.file = file
        self._seen: tuple[int, int] | None = None  # the file as it was last taken
        self._changed: tuple[int, int] | None = None  # as it was at the last look, not yet taken
        self._listed: tuple[Grant, ...] = ()
        self._stored: tuple[Grant, ...] = ()
        self.grants: tuple[Grant, ...] = self.fixed
        self.reload(settled=True)

    def identify(self, token: str | None, now: datetime) -> Identity | None:
        """Who ``token`` makes its bearer, or None (unknown, or expired at ``now``). Its digest
        is compared, in constant time, with every known one (no early exit)."""
        if token is None:
            return None
        digest = token_digest(token).encode()
        found: Grant | None = None
        for grant in self.grants:
            if hmac.compare_digest(digest, grant.digest.encode()):
                found = grant
        if found is None or (found.expires_at is not None and now >= found.expires_at):
            return None
        return found.identity

    def allowed(self, token: str | None, now: datetime) -> bool:
        return self.identify(token, now) is not None

    def take_stored(self, records: Sequence[TokenRecord], now: datetime) -> bool:
        """The kept tokens, as read from the read model: the usable ones are allowed; True when
        what is allowed changed."""
        grants = tuple(stored_grant(r) for r in records if r.usable(now))
        if grants == self._stored:
            return False
        self._stored = grants
        return self._recompose()

    def _recompose(self) -> bool:
        before, self.grants = self.grants, self.fixed + self._listed + self._stored
        return set(before) != set(self.grants)

    def reload(self, *, settled: bool = False) -> bool:
        """Read the file again if it changed and has not changed since the previous look (or
        ``settled``: take it as it is); True when the allowed tokens changed."""
        if self.file is None:
            return False
        try:
            stat = self.file.stat()
        except OSError as err:
            seen: tuple[int, int] | None = (-1, -1)  # missing: said once, until it is back
            error: str | None = str(err)
        else:
            seen, error = (stat.st_mtime_ns, stat.st_size), None
        if seen == self._seen:
            self._changed = None
            return False
        if not settled and seen != self._changed:
            self._changed = seen  # still being written, maybe: taken at the next look
            return False
        self._seen, self._changed = seen, None
        if error is None:
            try:
                listed = parse_grants(self.file.read_text())
            except (OSError, ValueError) as err:
                error = str(err)
        if error is not None:
            # keep what was allowed: a half-written or missing file must not lock everyone out
            # (nor let anyone in); the log says why, once per change of the file
            log.warning("dashboard_tokens_file_unreadable", file=str(self.file), error=error)
            return False
        self._listed = tuple(listed)
        return self._recompose()


_FILE_FIELDS = ("name", "role", "factories")


def _file_grant(entry: str) -> Grant:
    digest, *fields = entry.split()
    if ":" in digest:
        raise ValueError("the role goes in role=, not before the digest")
    options: dict[str, str] = {}
    for field in fields:
        key, sep, value = field.partition("=")
        if not sep or key not in _FILE_FIELDS or key in options:
            raise ValueError(f"{field!r} is not one of name=, role=, factories=")
        options[key] = value
    return configured_grant(digest, **options)


def parse_grants(text: str) -> list[Grant]:
    """Tokens from a tokens file: per line a SHA-256 hex digest, then optionally ``role=``,
    ``name=`` and ``factories=a,plant-*`` (blank lines and ``#`` comments ignored); anything else
    is an error naming its line."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        try:
            found.append(_file_grant(entry))
        except ValueError as err:
            raise ValueError(f"line {n}: {err}") from None
    return found


# -- the web page: a browser cannot send the header -------------------------------------------

# the cookie the sign-in form (or a ?token= link) sets: HttpOnly, SameSite=Strict
COOKIE = "aegis_dashboard_token"
COOKIE_MAX_AGE_S = 30 * 86_400  # a wall screen signs in once a month
QUERY_TOKEN = "token"  # noqa: S105 - the name of the query parameter, not a secret
_SCOPE_KEY = "aegis.query_token"


class QueryTokenMiddleware:
    """Takes ``?token=`` out of every request's query string before anything else sees it (the
    routes, error pages, an access log): the token is kept aside in the ASGI scope and the query
    string is rewritten without it, so a token in a URL is never logged."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and QUERY_TOKEN.encode() in scope.get("query_string", b""):
            pairs = parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True)
            tokens = [v for k, v in pairs if k == QUERY_TOKEN]
            if tokens:
                scope[_SCOPE_KEY] = tokens[-1]
                kept = [(k, v) for k, v in pairs if k != QUERY_TOKEN]
                scope["query_string"] = urlencode(kept).encode("latin-1")
        await self.app(scope, receive, send)


def query_token(scope: Scope) -> str | None:
    token = scope.get(_SCOPE_KEY)
    return token if isinstance(token, str) and token else None


def request_token(request: Request) -> str | None:
    """The token of a request: the Authorization header, else the sign-in cookie, else ``?token=``."""
    return (
        bearer_token(request.headers.get("authorization"))
        or request.cookies.get(COOKIE)
        or query_token(request.scope)
    )
