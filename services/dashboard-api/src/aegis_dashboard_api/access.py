"""Read-only bearer tokens: the request's token is hashed and its digest compared, in constant
time, with every configured digest (the tokens themselves are never stored)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence


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
