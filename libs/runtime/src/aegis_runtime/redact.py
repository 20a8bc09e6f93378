"""Secrets out of logs: the structlog processor every AEGIS process runs last before rendering.

It redacts, in every event (structlog's and the stdlib's: botocore, aiohttp, nats, uvicorn):

* values of ``SecretStr`` (wherever they sit: a settings dump, a nested dict);
* values under keys that name a secret (``password``, ``token``, ``secret``, ``authorization``,
  ``webhook``, ``api_key``, ``credentials``, ``cookie``, ``signature``, ``private_key``);
* inside any string, exception texts included: the ``user:password@`` of URLs, query parameters that
  carry credentials (``?token=``, ``access_token``, ``X-Amz-Signature`` …) and the secret path of
  Slack webhooks (``hooks.slack.com/services/…``).

:func:`redact_url` is the same rule for one URL, for code that shows a URL to a person.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

from pydantic import SecretBytes, SecretStr
from structlog.typing import EventDict, WrappedLogger

REDACTED = "**********"

SECRET_KEY = re.compile(
    r"pass(word|wd|phrase)?($|_)|secret|token|authori[sz]ation|webhook|api_?key|credential"
    r"|cookie|signature|private_?key",
    re.IGNORECASE,
)
# user:password@ keeps the user; a lone userinfo is a token (nats://TOKEN@host) and goes whole
_USERINFO = re.compile(r"(?P<scheme>\b[a-z][a-z0-9+.-]*://)(?P<user>[^\s/?#@:]*):[^\s/?#@]*@", re.I)
_TOKEN_USERINFO = re.compile(r"(?P<scheme>\b[a-z][a-z0-9+.-]*://)[^\s/?#@:]+@", re.I)
_QUERY = re.compile(
    r"(?P<name>[?&;](?:[a-z0-9_.-]*token|key|api_?key|secret|password|passwd|pwd|sig|signature"
    r"|code|auth|x-amz-signature|x-amz-credential|x-amz-security-token)=)[^&#\s\"'<>]+",
    re.I,
)
_SLACK = re.compile(
    r"(?P<base>hooks\.slack(?:-gov)?\.com(?::\d+)?/(?:services|workflows|triggers)/)[^\s\"'<>]+"
)


def redact_text(text: str) -> str:
    """``text`` with credentials in URLs, secret query parameters and Slack hook paths hidden."""
    # cheap membership tests first: most log values (ids, keys, numbers as text) need no regex
    if "@" in text and "://" in text:
        text = _USERINFO.sub(rf"\g<scheme>\g<user>:{REDACTED}@", text)
        text = _TOKEN_USERINFO.sub(rf"\g<scheme>{REDACTED}@", text)
    if "=" in text and ("?" in text or "&" in text or ";" in text):
        text = _QUERY.sub(rf"\g<name>{REDACTED}", text)
    if "hooks.slack" in text:
        text = _SLACK.sub(rf"\g<base>{REDACTED}", text)
    return text


def redact_url(url: str) -> str:
    """A URL safe to print or log (``mqtt://factory-a:**********@broker:8883``)."""
    return redact_text(url)


def redact(value: Any, key: str | None = None, _depth: int = 0) -> Any:
    """``value`` with its secrets hidden; ``key`` is the name it is logged under."""
    if isinstance(value, SecretStr | SecretBytes):
        return REDACTED
    if value is None or isinstance(value, bool | int | float | bytes):
        return value
    if key is not None and _secret_key(key):
        return REDACTED
    if isinstance(value, str):
        return redact_text(value)
    return _redact_object(value, _depth)


def _redact_object(value: Any, depth: int) -> Any:
    if depth > 8:  # a structure this deep is not a settings dump; do not walk it further
        return value
    if isinstance(value, Mapping):
        return {k: redact(v, str(k), depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return type(value)(redact(v, None, depth + 1) for v in value)
    text = str(value)  # URLs (yarl, httpx), exceptions, paths: as the renderer would show them
    cleaned = redact_text(text)
    return value if cleaned == text else cleaned


@functools.lru_cache(maxsize=4096)
def _secret_key(key: str) -> bool:
    return SECRET_KEY.search(key) is not None


# rendered by structlog itself, never carrying user data
_SAFE_KEYS = frozenset({"timestamp", "level", "logger", "logger_name"})


def redact_secrets(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """structlog processor: see the module docstring. Runs after ``format_exc_info``."""
    return {
        k: v if k in _SAFE_KEYS else redact(v, k if k != "event" else None)
        for k, v in event_dict.items()
    }
