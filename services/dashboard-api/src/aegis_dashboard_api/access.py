"""Read-only bearer tokens: the request's token is hashed and its digest compared, in constant
time, with every configured digest (the tokens themselves are never stored). A browser brings
its token in the ``Authorization`` header, the sign-in cookie, or once as ``?token=``."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import parse_qsl, urlencode

import structlog
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

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


def allowed(token: str | None, digests: Sequence[str]) -> bool:
    """True when ``token`` hashes to one of ``digests``; every digest is compared (no early exit)."""
    if token is None:
        return False
    digest = token_digest(token).encode()
    matched = False
    for expected in digests:
        matched |= hmac.compare_digest(digest, expected.encode())
    return matched


class TokenSet:
    """The digests that are allowed now: those of ``AEGIS_DASHBOARD_TOKENS`` plus those listed in
    ``AEGIS_DASHBOARD_TOKENS_FILE`` (one per line, ``#`` comments), which :meth:`reload` reads
    again when it changed (a Kubernetes Secret mounted as a file is updated in place). Removing
    a digest revokes its token: requests are refused and open live streams end.

    A change is taken once the file has stayed as it is from one look to the next: a file
    rewritten in place is empty (truncated) or half-written for a moment, and taken then it
    would revoke every token it lists. The file as it is at start is taken at once."""

    def __init__(self, fixed: Sequence[str], file: Path | None = None) -> None:
        self.fixed = tuple(d.lower() for d in fixed)
        self.file = file
        self._seen: tuple[int, int] | None = None  # the file as it was last taken
        self._changed: tuple[int, int] | None = None  # as it was at the last look, not yet taken
        self.digests: tuple[str, ...] = self.fixed
        self.reload(settled=True)

    def allowed(self, token: str | None) -> bool:
        return allowed(token, self.digests)

    def reload(self, *, settled: bool = False) -> bool:
        """Read the file again if it changed and has not changed since the previous look (or
        ``settled``: take it as it is); True when the allowed digests changed."""
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
                listed = parse_digests(self.file.read_text())
            except (OSError, ValueError) as err:
                error = str(err)
        if error is not None:
            # keep what was allowed: a half-written or missing file must not lock everyone out
            # (nor let anyone in); the log says why, once per change of the file
            log.warning("dashboard_tokens_file_unreadable", file=str(self.file), error=error)
            return False
        before, self.digests = self.digests, self.fixed + tuple(listed)
        return set(before) != set(self.digests)


def parse_digests(text: str) -> list[str]:
    """Digests from a tokens file: one SHA-256 hex digest per line; blank lines and ``#``
    comments ignored; anything else is an error naming its line."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        entry = line.split("#", 1)[0].strip().lower()
        if not entry:
            continue
        if not is_digest(entry):
            raise ValueError(f"line {n} is not a SHA-256 hex digest")
        found.append(entry)
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
