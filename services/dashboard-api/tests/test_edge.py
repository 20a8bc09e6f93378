"""The dashboard's edge, attacked over real sockets on a uvicorn server as ``main()`` runs it:
an oversized sign-in body, guessing tokens, dodging the limit with forged forwarded headers,
holding open more live streams than a process takes, and the sign-in cookie behind a
TLS-terminating proxy."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from aegis_dashboard_api.access import TokenSet, configured_grant, token_digest
from aegis_dashboard_api.app import create_app
from aegis_dashboard_api.settings import DashboardSettings
from aegis_devstack.localservers import free_port
from aegis_devstack.testing.storage import Foundation

TOKEN = "edge-token"
SAME_SITE = {"Sec-Fetch-Site": "same-origin"}

Serve = Callable[..., Any]


@pytest.fixture
def serve(aws_endpoint: str, foundation: Foundation, uvicorn_served: Any) -> Serve:
    """``with serve(**settings) as base_url``: the dashboard on a free port, as main() runs it."""

    @contextmanager
    def run(**overrides: Any) -> Iterator[str]:
        settings = DashboardSettings(
            **{
                "aws_endpoint_url": aws_endpoint,
                "bucket": foundation.bucket,
                "table": foundation.table,
                "dashboard_host": "127.0.0.1",
                "dashboard_port": free_port(),
                "dashboard_tokens": token_digest(TOKEN),
                "dashboard_live": False,
            }
            | overrides
        )
        with uvicorn_served(create_app(settings), settings) as base:
            yield base

    return run


def raw_request(base: str, head: str, body: bytes, *, then_wait_s: float = 5.0) -> bytes:
    """Send ``head`` and ``body`` on one socket and read what the server answers, without
    sending anything more (the rest of a declared body is never sent)."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=then_wait_s) as sock:
        sock.sendall(head.encode() + body)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
        return answer


def test_a_huge_sign_in_body_is_refused_before_it_is_sent(serve: Serve) -> None:
    with serve() as base:
        # 100 MB declared, 16 KiB sent: the answer comes without the rest
        head = (
            "POST /login HTTP/1.1\r\nHost: x\r\nSec-Fetch-Site: same-origin\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\n"
            f"Content-Length: {100 * 1024 * 1024}\r\n\r\n"
        )
        answer = raw_request(base, head, b"token=" + b"a" * 16 * 1024)
        assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
        # no length declared: read in chunks no further than the limit
        head = (
            "POST /login HTTP/1.1\r\nHost: x\r\nSec-Fetch-Site: same-origin\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b"a" * 4096
        body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(4))  # 16 KiB, no end
        answer = raw_request(base, head, body)
        assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
        # the form itself still works
        ok = httpx.post(f"{base}/login", data={"token": TOKEN}, headers=SAME_SITE)
        assert ok.status_code == 303


def test_guessing_tokens_is_limited_per_client_and_forged_forwarding_does_not_dodge_it(
    serve: Serve,
) -> None:
    with serve(dashboard_signin_attempts=3, dashboard_signin_window_s=60) as base:
        answers = []
        for n in range(5):
            # an attacker rotating X-Forwarded-For: not a trusted proxy, so it is ignored
            headers = SAME_SITE | {"X-Forwarded-For": f"203.0.113.{n}"}
            answers.append(
                httpx.post(f"{base}/login", data={"token": f"guess-{n}"}, headers=headers)
            )
        assert [a.status_code for a in answers] == [401, 401, 401, 429, 429]
        assert 1 <= int(answers[-1].headers["retry-after"]) <= 60
        # over the limit even the right token is not looked at
        right = httpx.post(f"{base}/login", data={"token": TOKEN}, headers=SAME_SITE)
        assert right.status_code == 429


def test_behind_a_trusted_proxy_each_user_is_limited_as_themselves_and_the_cookie_is_secure(
    serve: Serve,
) -> None:
    with serve(dashboard_signin_attempts=2, dashboard_trusted_proxies="127.0.0.1/32") as base:

        def login(token: str, user: str, proto: str = "https") -> httpx.Response:
            headers = SAME_SITE | {"X-Forwarded-For": user, "X-Forwarded-Proto": proto}
            return httpx.post(f"{base}/login", data={"token": token}, headers=headers)

        assert [login("bad", "198.51.100.7").status_code for _ in range(3)] == [401, 401, 429]
        signed_in = login(TOKEN, "198.51.100.8")  # another user behind the same proxy
        assert signed_in.status_code == 303
        cookie = signed_in.headers["set-cookie"].lower()
        assert "secure" in cookie and "httponly" in cookie and "samesite=strict" in cookie
        # the user's connection was http: no Secure (the browser would drop it over http)
        assert "secure" not in login(TOKEN, "198.51.100.9", "http").headers["set-cookie"].lower()
    with serve() as base:  # no trusted proxy: X-Forwarded-Proto from anyone means nothing
        headers = SAME_SITE | {"X-Forwarded-Proto": "https"}
        answer = httpx.post(f"{base}/login", data={"token": TOKEN}, headers=headers)
        assert answer.status_code == 303 and "secure" not in answer.headers["set-cookie"].lower()


async def test_live_streams_per_process_are_bounded(serve: Serve) -> None:
    with serve(dashboard_live=True, dashboard_live_max_listeners=2) as base:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=base, headers=auth, timeout=10) as client:
            async with (
                client.stream("GET", "/api/live") as first,
                client.stream("GET", "/api/live") as second,
            ):
                assert first.status_code == second.status_code == 200
                third = await client.get("/api/live")
                assert third.status_code == 503
                assert third.json()["error"] == "too_many_streams"
            # the two went away: a stream is taken again
            for _ in range(50):
                async with client.stream("GET", "/api/live") as again:
                    if again.status_code == 200:
                        break
                await asyncio.sleep(0.1)
            assert again.status_code == 200


async def test_revoking_a_token_in_the_tokens_file_ends_its_open_streams(
    serve: Serve, tmp_path: Path
) -> None:
    keep, revoke = "kept-token", "revoked-token"
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# wall screens\n{token_digest(keep)}\n{token_digest(revoke)}\n")
    with serve(
        dashboard_live=True, dashboard_tokens_file=tokens, dashboard_tokens_reload_s=0.1
    ) as base:
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            kept = {"Authorization": f"Bearer {keep}"}
            gone = {"Authorization": f"Bearer {revoke}"}
            async with (
                client.stream("GET", "/api/live", headers=kept) as stays,
                client.stream("GET", "/api/live", headers=gone) as ends,
            ):
                assert stays.status_code == ends.status_code == 200
                tokens.write_text(f"{token_digest(keep)}\n")  # revoke one
                # the revoked stream ends (its body finishes) while the other stays open
                async with asyncio.timeout(10):
                    async for _ in ends.aiter_bytes():
                        pass
                assert not stays.is_closed
            assert (await client.get("/api/fleet", headers=gone)).status_code == 401
            assert (await client.get("/api/fleet", headers=kept)).status_code == 200
            # a file that cannot be read keeps what was allowed (nobody is locked out or let in)
            tokens.write_text("not a digest\n")
            await asyncio.sleep(0.3)
            assert (await client.get("/api/fleet", headers=kept)).status_code == 200
            assert (await client.get("/api/fleet", headers=gone)).status_code == 401


def test_a_tokens_file_caught_mid_rewrite_revokes_nothing(tmp_path: Path) -> None:
    """A file rewritten in place is empty, then half-written, for a moment (the server's look
    can fall between the truncation and the write): a change is taken only once the file is the
    same at two looks in a row."""
    keep, revoke = "kept-token", "revoked-token"
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{token_digest(keep)}\n{token_digest(revoke)}\n")
    allowed = TokenSet([configured_grant(token_digest(TOKEN))], tokens)
    now = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)  # these tokens never expire: any time does
    assert allowed.allowed(keep, now) and allowed.allowed(revoke, now)  # taken at once at start

    tokens.write_text("")  # truncated, not written yet
    assert not allowed.reload()
    tokens.write_text(token_digest(keep)[:40])  # half-written
    assert not allowed.reload()
    assert (
        allowed.allowed(keep, now) and allowed.allowed(revoke, now) and allowed.allowed(TOKEN, now)
    )

    tokens.write_text(f"{token_digest(keep)}\n")  # written: taken at the next look
    assert not allowed.reload()
    assert allowed.reload()
    assert (
        allowed.allowed(keep, now)
        and not allowed.allowed(revoke, now)
        and allowed.allowed(TOKEN, now)
    )
    assert not allowed.reload()  # nothing changed since


def test_metrics_are_on_the_health_port_by_route_template_and_not_on_the_api_port(
    serve: Serve,
) -> None:
    """The dashboard's /metrics, as an operator scrapes it: on the health port (with
    /healthz and /readyz), one series per route template however many factory ids clients ask
    for, and nothing of it on the public API port."""
    health = free_port()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with serve(health_port=health) as base:
        assert httpx.get(f"{base}/api/fleet", headers=auth).status_code == 200
        for factory in ("f-one", "f-two", "f-three"):
            assert httpx.get(f"{base}/api/factories/{factory}", headers=auth).status_code == 404
        assert httpx.get(f"{base}/api/fleet").status_code == 401
        assert httpx.get(f"{base}/no/such/page").status_code == 404
        assert httpx.get(f"{base}/metrics").status_code == 404  # not public
        assert httpx.get(f"http://127.0.0.1:{health}/readyz").status_code == 200
        text = httpx.get(f"http://127.0.0.1:{health}/metrics").text

    counts = {
        (s.labels["route"], s.labels["method"], s.labels["status"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "aegis_http_requests_total"
    }
    assert counts.get(("/api/fleet", "GET", "200")) == 1, counts
    assert counts[("/api/fleet", "GET", "401")] == 1
    assert counts[("/api/factories/{factory_id}", "GET", "404")] == 3
    assert counts[("unmatched", "GET", "404")] == 2  # /no/such/page, /metrics
    assert "f-one" not in text and "/no/such/page" not in text
    assert "aegis_http_request_seconds_bucket" in text
    assert "aegis_live_clients 0.0" in text
    assert "process_cpu_seconds_total" in text  # what every AEGIS /metrics has
