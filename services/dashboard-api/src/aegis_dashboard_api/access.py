"""Read-only bearer tokens: the request's token is hashed and its digest compared, in constant
time, with every configured digest (the tokens themselves are never stored). A browser brings
its token in the ``Authorization`` header, the sign-in cookie, or once as ``?token=``."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from urllib.parse import parse_qsl, urlencode

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send


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
