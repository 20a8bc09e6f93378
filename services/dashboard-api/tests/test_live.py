"""The live fan-out, the translation of queue events, languages and sign-in redirects: pure parts,
no server."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from aegis_contracts.events import ChangeEvent
from aegis_contracts.people import Identity, Role
from aegis_dashboard_api.access import QueryTokenMiddleware, query_token
from aegis_dashboard_api.i18n import LABELS, from_accept_language, pick_lang
from aegis_dashboard_api.live import RETRY_MS, Hub, LiveEvent, factory_event, family_of, stream
from aegis_dashboard_api.pages import freshness, safe_next
from aegis_dashboard_api.routes import fleet_entry

# a wall screen: sees the whole fleet
WALL = Identity(subject="token:wall", name="wall", via="token", role=Role.VIEWER, scope=("*",))

NOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)


def event(n: int) -> LiveEvent:
    return LiveEvent("factory", {"n": n})


async def test_every_listener_gets_every_event_in_order() -> None:
    hub = Hub(queue_size=8)
    a, b = hub.listen(WALL), hub.listen(WALL)
    for n in range(3):
        hub.publish(event(n))
    hub.close()
    for listener in (a, b):
        got = [e.data["n"] async for e, _ in listener.events()]
        assert got == [0, 1, 2]


async def test_a_slow_listener_is_dropped_and_the_others_go_on() -> None:
    hub = Hub(queue_size=3)
    slow, fast = hub.listen(WALL), hub.listen(WALL)
    received: list[int] = []

    async def read_fast() -> None:
        async for e, _ in fast.events():
            received.append(e.data["n"])

    reader = asyncio.create_task(read_fast())
    for n in range(10):  # the slow one never reads: its queue fills at 3
        hub.publish(event(n))
        await asyncio.sleep(0)  # the fast one reads as events come
    assert slow.dropped and slow not in hub.listeners
    assert hub.dropped == 1 and fast in hub.listeners
    assert [e async for e in slow.events()] == []  # its stream ends (the browser reconnects)
    hub.close()
    await reader
    assert received == list(range(10))


async def test_an_event_is_encoded_once_for_every_listener() -> None:
    hub = Hub()
    a, b = hub.listen(WALL), hub.listen(WALL)
    hub.publish(event(1))
    hub.close()
    (first,) = [frame async for _, frame in a.events()]
    (second,) = [frame async for _, frame in b.events()]
    assert first is second


async def test_publish_never_waits_for_a_listener() -> None:
    hub = Hub(queue_size=1)
    hub.listen(WALL)
    for n in range(1000):  # no await in between: publish must not block
        hub.publish(event(n))
    assert hub.published == 1000 and hub.listeners == set()


async def test_a_listener_after_close_ends_at_once() -> None:
    hub = Hub()
    hub.close()
    assert [e async for e in hub.listen(WALL).events()] == []


async def test_the_stream_starts_with_retry_then_the_snapshot_then_live_events() -> None:
    hub = Hub()
    listener = hub.listen(WALL)
    hub.publish(event(7))
    hub.close()
    frames = [
        (f if isinstance(f, bytes) else f.encode()).decode()
        async for f in stream(
            hub, listener, [LiveEvent("fleet", {"factories": []})], resumed_from="x-1"
        )
    ]
    assert frames[0] == f": aegis live\nretry: {RETRY_MS}\n\n"
    assert frames[1].startswith(f"id: {hub.boot}-") and "event: fleet\n" in frames[1]
    assert 'data: {"factories":[]}' in frames[1]
    assert "event: factory" in frames[2] and 'data: {"n":7}\n\n' in frames[2]
    assert listener not in hub.listeners


def change(**overrides: Any) -> ChangeEvent:
    fields: dict[str, Any] = {
        "table": "T",
        "pk": "FACTORY#factory-a",
        "sk": "LATEST",
        "event_name": "MODIFY",
        "old_image": {"factory_id": "factory-a"},
        "new_image": {
            "pk": "FACTORY#factory-a",
            "factory_id": "factory-a",
            "risk": {"level": "CRITICAL", "score": 90, "reasons": [{"code": "FIRE_DETECTED"}]},
            "last_factory_state_at": "2026-11-30T02:59:50.000Z",
            "updated_at": "2026-11-30T02:59:51.000Z",
            "ttl": 1,
        },
        "producer": "processor",
        "at": NOW,
    }
    return ChangeEvent(**{**fields, **overrides})


def test_a_latest_change_becomes_the_fleet_entry_and_the_latest() -> None:
    got = factory_event(change(), table="T", now=NOW, entry_of=fleet_entry)
    assert got is not None and got.name == "factory"
    assert got.data["entry"]["level"] == "CRITICAL" and got.data["entry"]["age_s"] == 10.0
    assert got.data["latest"]["updated_at"] == "2026-11-30T02:59:51.000Z"
    assert "ttl" not in got.data["latest"]


@pytest.mark.parametrize(
    "overrides",
    [{"table": "another-stack"}, {"pk": "CLOUD#infra"}, {"sk": "HISTORY#STATE#x"}],
)
def test_other_tables_and_items_are_not_shown(overrides: dict[str, Any]) -> None:
    assert factory_event(change(**overrides), table="T", now=NOW, entry_of=fleet_entry) is None


def test_a_removed_factory() -> None:
    got = factory_event(
        change(event_name="REMOVE", new_image=None), table="T", now=NOW, entry_of=fleet_entry
    )
    assert got == LiveEvent("factory_removed", {"factory_id": "factory-a"}, "factory-a")


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        (
            "processed_agg/factory-a/metrics_5m/yyyy=2026/mm=11/dd=30/hh=03/mm=05.json",
            ("graph", "factory-a"),
        ),
        ("processed/cloud_infra/fast/yyyy=2026/mm=11/dd=30/hh=03/x.json", ("cloud", "fast")),
        ("reports/daily/yyyy=2026/mm=11/dd=29/factory-a/report.md", ("reports", "factory-a")),
        ("reports/daily/yyyy=2026/mm=11/dd=29/factory-a/report-context.json", None),
        ("processed/factory-a/state_snapshot/yyyy=2026/x.json", None),
        ("raw/factory-a/factory_state/yyyy=2026/mm=11/dd=30/m.json", None),
        ("", None),
    ],
)
def test_family_of_an_announced_object(key: str, expected: tuple[str, str] | None) -> None:
    assert family_of(key) == expected


@pytest.mark.parametrize(
    ("header", "lang"),
    [
        ("ko-KR,ko;q=0.9,en-US;q=0.8,en;q=0.7", "ko"),
        ("en-US,en;q=0.9,ko;q=0.8", "en"),
        ("fr-FR,ko;q=0.5,en;q=0.4", "ko"),
        ("en;q=0.1, ko;q=0.2", "ko"),
        ("ko;q=0, en", "en"),
        ("ko;q=abc, en;q=0.5", "en"),
        ("fr, de", "en"),
        ("", "en"),
        (";;;,,,", "en"),
    ],
)
def test_accept_language(header: str, lang: str) -> None:
    assert from_accept_language(header) == lang


def test_the_query_wins_then_the_cookie_then_the_browser() -> None:
    assert pick_lang("ko", "en", "en") == "ko"
    assert pick_lang(None, "ko", "en") == "ko"
    assert pick_lang("xx", "yy", "ko-KR") == "ko"


def test_every_label_has_both_languages() -> None:
    assert all(set(text) == {"ko", "en"} and all(text.values()) for text in LABELS.values())


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("/factories/factory-a?window=6h", "/factories/factory-a?window=6h"),
        ("/", "/"),
        (None, "/"),
        ("", "/"),
        ("//evil.example/x", "/"),
        ("https://evil.example/", "/"),
        ("/\\evil.example", "/"),
        ("factories", "/"),
        ("javascript:alert(1)", "/"),
    ],
)
def test_after_sign_in_only_paths_of_this_site(value: str | None, expected: str) -> None:
    assert safe_next(value) == expected


@pytest.mark.parametrize(
    ("age", "state"),
    [
        (0.0, "fresh"),
        (59.9, "fresh"),
        (60.0, "stale"),
        (299.0, "stale"),
        (300.0, "offline"),
        (None, "offline"),
    ],
)
def test_freshness(age: float | None, state: str) -> None:
    assert freshness(age) == state


@pytest.mark.parametrize(
    ("query", "left", "token"),
    [
        (b"token=abc&window=6h", b"window=6h", "abc"),
        (b"window=6h&token=abc", b"window=6h", "abc"),
        (b"token=a&token=b", b"", "b"),
        (b"token=", b"", None),
        (b"tokens=x", b"tokens=x", None),
        (b"window=6h", b"window=6h", None),
    ],
)
async def test_a_query_token_leaves_the_query_string(
    query: bytes, left: bytes, token: str | None
) -> None:
    seen: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.update(scope)

    scope = {"type": "http", "query_string": query}
    await QueryTokenMiddleware(app)(scope, None, None)  # type: ignore[arg-type]
    assert seen["query_string"] == left
    assert query_token(seen) == token
