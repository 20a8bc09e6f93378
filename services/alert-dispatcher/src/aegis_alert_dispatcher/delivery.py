"""Delivering one message to one receiver: the retry loop every receiver shares, and its outcome.

:func:`deliver` repeats an attempt that failed in a way worth repeating (:class:`Retryable`: 429,
5xx, a network error, no answer in time) with exponential backoff and full jitter, waiting at least
what ``Retry-After`` asks (capped), and never runs an attempt past the caller's ``deadline``: each
attempt is cut at the deadline, and none starts when the wait before it would end past it. An
attempt that the far end refuses for good (:class:`Refused`: a revoked token, a 4xx other than 429)
is not repeated. Either way the caller gets :class:`Undeliverable`, whose text carries no secret:
the receiver's own secrets are masked in it, and so is what :func:`redact_text` knows (credentials
in URLs, Slack webhook paths).

:func:`post_json` is the one HTTP attempt of the JSON receivers (Slack incoming webhooks,
PagerDuty, signed webhooks): 2xx is taken, 429 and 5xx are :class:`Retryable`, any other status is
:class:`Refused`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from aegis_contracts.backoff import jittered_s
from aegis_runtime.redact import REDACTED, redact_text

Sleep = Callable[[float], Awaitable[None]]
OnAttempt = Callable[[int | None], None]


@dataclass(frozen=True, slots=True)
class Delivery:
    """The receiver took the message: after ``attempts`` attempts, answering ``status``; ``ref``
    names what it made where the receiver can change it later (Slack: ``channel`` and ``ts``)."""

    attempts: int
    status: int
    ref: dict[str, Any] | None = None


class Undeliverable(Exception):
    """The receiver refused the message for good (``permanent``), or every attempt failed."""

    def __init__(
        self, detail: str, *, attempts: int, status: int | None, permanent: bool = False
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.attempts = attempts
        self.status = status
        self.permanent = permanent


class Retryable(Exception):
    """One attempt failed in a way another attempt may not (429, 5xx, network, throttling)."""

    def __init__(
        self, detail: str, *, status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.retry_after = retry_after


class Refused(Exception):
    """The receiver refused the message in a way no later attempt would change."""

    def __init__(self, detail: str, *, status: int | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently one message is tried (seconds)."""

    max_attempts: int = 5
    first_delay: float = 0.5
    max_delay: float = 30.0
    max_retry_after: float = 120.0
    timeout: float = 10.0

    def backoff(self, attempt: int) -> float:
        """Full jitter: uniform in [0, min(max, first * 2^(attempt-1))]."""
        return jittered_s(attempt, first=self.first_delay, cap=self.max_delay)


Attempt = Callable[[float], Awaitable[Delivery]]
"""One try: given the seconds it may take, a :class:`Delivery` (its ``attempts`` is filled in),
or :class:`Retryable` / :class:`Refused`."""


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` without ``secrets`` (each replaced by the redaction mark) nor what
    :func:`redact_text` hides."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return redact_text(text)


async def deliver(
    attempt: Attempt,
    policy: RetryPolicy,
    *,
    deadline: float | None = None,
    sleep: Sleep = asyncio.sleep,
    on_attempt: OnAttempt | None = None,
    secrets: Iterable[str] = (),
) -> Delivery:
    """Run ``attempt`` until it delivers, is refused, or the attempts or ``deadline``
    (``loop.time()``) run out: then :class:`Undeliverable`."""
    secrets = tuple(secrets)
    loop = asyncio.get_running_loop()
    status: int | None = None
    detail = ""
    attempts = 0
    for number in range(1, policy.max_attempts + 1):
        left = None if deadline is None else deadline - loop.time()
        if left is not None and left <= 0:
            detail = f"the send's lease ran out; last: {detail or 'none'}"
            break
        attempts = number
        budget = policy.timeout if left is None else min(policy.timeout, left)
        retry_after: float | None = None
        try:
            # the attempt gets its budget to pass on; this bounds the ones that cannot
            async with asyncio.timeout(budget):
                delivery = await attempt(budget)
        except Retryable as err:
            status, detail, retry_after = err.status, scrub(err.detail, secrets), err.retry_after
        except Refused as err:
            if on_attempt:
                on_attempt(err.status)
            raise Undeliverable(
                scrub(err.detail, secrets), attempts=number, status=err.status, permanent=True
            ) from None
        except TimeoutError:
            status, detail = None, f"TimeoutError: no answer within {budget:g} s"
        else:
            if on_attempt:
                on_attempt(delivery.status)
            return replace(delivery, attempts=number)
        if on_attempt:
            on_attempt(status)
        if number == policy.max_attempts:
            break
        delay = policy.backoff(number)
        if retry_after is not None:
            delay = max(delay, min(retry_after, policy.max_retry_after))
        if deadline is not None and loop.time() + delay >= deadline:
            detail = f"the send's lease ends before the next attempt; last: {detail}"
            break
        await sleep(delay)
    raise Undeliverable(
        f"gave up after {attempts} attempts: {detail}", attempts=attempts, status=status
    )


class RetryingSender:
    """What every receiver's ``send`` keeps: its retry policy, the sleep between attempts (tests
    inject one) and a callback told each attempt's status (``None``: no answer)."""

    def __init__(
        self,
        *,
        policy: RetryPolicy | None = None,
        sleep: Sleep = asyncio.sleep,
        on_attempt: OnAttempt | None = None,
    ) -> None:
        self.policy = policy or RetryPolicy()
        self.sleep = sleep
        self.on_attempt = on_attempt

    async def _deliver(
        self, attempt: Attempt, deadline: float | None, secrets: Iterable[str] = ()
    ) -> Delivery:
        return await deliver(
            attempt,
            self.policy,
            deadline=deadline,
            sleep=self.sleep,
            on_attempt=self.on_attempt,
            secrets=secrets,
        )


class JsonPoster(RetryingSender):
    """A sender that POSTs JSON to one URL (:func:`post_json`, retried by :func:`deliver`)."""

    def __init__(
        self,
        url: str,
        session: aiohttp.ClientSession,
        *,
        policy: RetryPolicy | None = None,
        sleep: Sleep = asyncio.sleep,
        on_attempt: OnAttempt | None = None,
    ) -> None:
        super().__init__(policy=policy, sleep=sleep, on_attempt=on_attempt)
        self.url = url
        self.session = session

    async def _post(
        self,
        body: bytes,
        deadline: float | None,
        secrets: Iterable[str] = (),
        headers: Callable[[], Mapping[str, str]] | None = None,
    ) -> Delivery:
        """``body`` until it is taken; ``headers`` are made anew for each attempt."""
        url = self.url  # read at send time: the URL can be replaced on a live sender

        async def attempt(within: float) -> Delivery:
            sent = headers() if headers else None
            return await post_json(self.session, url, body, within=within, headers=sent)

        return await self._deliver(attempt, deadline, secrets)


async def post_json(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    *,
    within: float,
    headers: Mapping[str, str] | None = None,
) -> Delivery:
    """POST ``body`` (JSON) once, taking at most ``within`` seconds: 2xx is a :class:`Delivery`
    (the answer's body is not read: what it says must not fail a send the receiver took), 429
    and 5xx :class:`Retryable`, other statuses :class:`Refused`, network errors
    :class:`Retryable`."""
    sent = {"Content-Type": "application/json", **(headers or {})}
    try:
        async with session.post(
            url, data=body, headers=sent, timeout=aiohttp.ClientTimeout(total=within)
        ) as resp:
            status = resp.status
            if 200 <= status < 300:
                return Delivery(0, status)
            text = (await resp.read())[:200].decode(errors="replace")
            detail = f"HTTP {status}: {text}"
            if status == 429 or status >= 500:
                raise Retryable(
                    detail, status=status, retry_after=retry_after(resp.headers.get("Retry-After"))
                )
            raise Refused(detail, status=status)
    except (aiohttp.ClientError, TimeoutError) as err:
        # aiohttp names the URL in some errors (a mistyped webhook): its path can be the secret
        raise Retryable(redact_text(f"{type(err).__name__}: {err}")) from None


def retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds (Slack sends seconds; an HTTP date is not worth parsing here)."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
