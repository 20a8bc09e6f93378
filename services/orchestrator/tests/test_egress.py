"""Job egress: the attacks a registered job could make through its HTTP steps, each performed
against a real HTTP server on this machine and seen refused before a request reaches it."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from aiohttp import web

from aegis_orchestration.model import Job, JobStep, TaskKind
from aegis_orchestrator.egress import EgressPolicy, EgressRefused, guarded_session
from aegis_orchestrator.tasks import TaskFailed, Tasks

BIG = 1024 * 1024


@dataclass
class Server:
    port: int
    hits: Counter[str]

    def url(self, path: str, host: str = "127.0.0.1", scheme: str = "http") -> str:
        return f"{scheme}://{host}:{self.port}{path}"


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    hits: Counter[str] = Counter()

    async def handle(request: web.Request) -> web.StreamResponse:
        hits[request.path] += 1
        if request.path == "/redirect":
            raise web.HTTPFound("/secret")
        if request.path == "/big":
            return web.Response(body=b"x" * BIG)
        return web.json_response({"ok": True, "key": request.headers.get("Idempotency-Key")})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = cast("Any", site._server).sockets[0].getsockname()[1]
    try:
        yield Server(port, hits)
    finally:
        await runner.cleanup()


Call = Callable[..., Any]


@pytest.fixture
async def call() -> AsyncIterator[Callable[[list[str]], Call]]:
    """``call(allow)(url, method=...)``: one HTTP_WEBHOOK step under that allow-list."""
    sessions = []

    def make(allow: list[str]) -> Call:
        policy = EgressPolicy.parse(allow, max_response_bytes=64 * 1024)
        session = guarded_session(policy)
        sessions.append(session)
        tasks = Tasks(
            session=session,
            readmodel=cast("Any", None),
            publish=cast("Any", None),
            clock=lambda: datetime.now(UTC),
            slack_webhook_url=None,
            commands=[],
            command_timeout=1,
            egress=policy,
        )
        job = cast("Job", None)
        webhook = tasks.executors(job, "exec-1")[TaskKind.HTTP_WEBHOOK]
        step = cast("JobStep", None)

        async def one(url: str, method: str = "POST") -> Any:
            params = {"url": url, "method": method, "body": {"a": 1}}
            return await webhook(step, params, {}, key="respond.1/hook.1")

        return one

    yield make
    for session in sessions:
        await session.close()


async def test_an_allowed_local_host_is_called_with_its_idempotency_key(
    server: Server, call: Callable[[list[str]], Call]
) -> None:
    # the control for every refusal below: the same server, allowed, answers
    out = await call(["127.0.0.1"])(server.url("/hook"))
    assert out["status"] == 200 and '"key": "exec-1:respond.1/hook.1"' in out["body"]
    assert server.hits == {"/hook": 1}


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        # the instance metadata endpoint (credentials), over http and https
        ("http://169.254.169.254/latest/meta-data/iam/security-credentials/", "plain http"),
        ("https://169.254.169.254/latest/meta-data/iam/security-credentials/", "non-public"),
        ("https://[fd00:ec2::254]/latest/meta-data/", "non-public"),
        ("https://100.100.100.200/latest/meta-data/", "non-public"),
        ("ftp://example.com/x", r"not http\(s\)"),
    ],
)
async def test_metadata_and_non_http_urls_are_refused(
    call: Callable[[list[str]], Call], url: str, reason: str
) -> None:
    with pytest.raises(TaskFailed, match=rf"egress refused: .*{reason}"):
        await call([])(url)


async def test_loopback_is_refused_by_address_by_name_and_as_a_mapped_address(
    server: Server, call: Callable[[list[str]], Call]
) -> None:
    attempt = call([])
    for url in (
        server.url("/hook", scheme="https"),  # the literal loopback address
        server.url("/hook", host="localhost", scheme="https"),  # a name that resolves to it
        server.url("/hook", host="[::ffff:127.0.0.1]", scheme="https"),  # IPv4-mapped IPv6
    ):
        with pytest.raises(TaskFailed, match=r"egress refused: .*non-public address"):
            await attempt(url)
    # and over plain http, the host not being listed is refused before any address is looked at
    with pytest.raises(TaskFailed, match="plain http"):
        await attempt(server.url("/hook", host="localhost"))
    assert server.hits == {}  # not one request reached the server


async def test_a_listed_name_does_not_open_its_address_to_other_names(
    server: Server, call: Callable[[list[str]], Call]
) -> None:
    # "localhost" is listed: allowed at its loopback address; the literal address is not
    attempt = call(["localhost"])
    out = await attempt(server.url("/hook", host="localhost"))
    assert out["status"] == 200
    with pytest.raises(TaskFailed, match="egress refused"):
        await attempt(server.url("/hook"))
    assert server.hits == {"/hook": 1}


async def test_a_redirect_is_not_followed(
    server: Server, call: Callable[[list[str]], Call]
) -> None:
    with pytest.raises(TaskFailed, match=r"HTTP 302 redirect to '/secret' refused"):
        await call(["127.0.0.1"])(server.url("/redirect"))
    assert server.hits == {"/redirect": 1}  # /secret never asked for


@pytest.mark.parametrize("method", ["TRACE", "CONNECT", "OPTIONS", "PROPFIND"])
async def test_methods_outside_a_webhooks_are_refused(
    server: Server, call: Callable[[list[str]], Call], method: str
) -> None:
    with pytest.raises(TaskFailed, match=f"method '{method}' is not allowed"):
        await call(["127.0.0.1"])(server.url("/hook"), method=method)
    assert server.hits == {}


async def test_an_answer_is_read_up_to_the_cap(
    server: Server, call: Callable[[list[str]], Call]
) -> None:
    out = await call(["127.0.0.1"])(server.url("/big"))
    assert out["status"] == 200 and out["truncated"] is True
    assert len(out["body"]) <= 2000


def test_the_allow_list_takes_names_and_networks_and_refuses_anything_else() -> None:
    policy = EgressPolicy.parse(["hooks.internal", "10.0.0.0/8", " 127.0.0.1 ", ""])
    assert policy.hosts == {"hooks.internal"}
    policy.check_address("anything", "10.1.2.3")
    policy.check_address("hooks.internal", "192.168.1.1")
    with pytest.raises(EgressRefused):
        policy.check_address("other.internal", "192.168.1.1")
    policy.check_address("example.com", "93.184.216.34")  # public: no listing needed
    for bad in ("http://x", "a b", "*.example.com", "10.0.0.0/33"):
        with pytest.raises(ValueError, match="not a host name or network"):
            EgressPolicy.parse([bad])
