"""Waits between attempts: capped exponential back-off, the one formula every retry loop of the
platform uses. Jittered where many clients retry against one server (so that they do not all
come back at once): full jitter (anywhere from no wait to the back-off) or a spread (half to all
of it, so that a retry never comes straight back)."""

from __future__ import annotations

import random


def exponential_s(attempt: int, *, first: float, cap: float) -> float:
    """``first * 2**(attempt-1)`` seconds, at most ``cap`` (``attempt`` 1 is the first retry)."""
    return float(min(cap, first * 2 ** max(0, min(attempt - 1, 60))))


def jittered_s(attempt: int, *, first: float, cap: float) -> float:
    """A wait drawn evenly from 0 to :func:`exponential_s` (full jitter)."""
    return random.uniform(0, exponential_s(attempt, first=first, cap=cap))  # noqa: S311 (jitter)


def spread_s(attempt: int, *, first: float, cap: float) -> float:
    """A wait drawn evenly from half of :func:`exponential_s` to all of it."""
    return exponential_s(attempt, first=first, cap=cap) * random.uniform(0.5, 1.0)  # noqa: S311
