"""nats-py stays behind :mod:`aegis_runtime.natsio`: no other module of a library or a service
imports it, not even for the type checker (tests may); and what the wrapper does to the pull
consumers' fetch."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import nats.errors
import pytest

from aegis_runtime.natsio import pace_fetches

ROOT = Path(__file__).resolve().parents[3]
WRAPPER = ROOT / "libs" / "runtime" / "src" / "aegis_runtime" / "natsio.py"


def _imports_nats(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        if any(name == "nats" or name.startswith("nats.") for name in names):
            lines.append(node.lineno)
    return lines


def test_only_the_wrapper_imports_nats_py() -> None:
    sources = sorted((ROOT / "libs").glob("*/src/**/*.py"))
    sources += sorted((ROOT / "services").glob("*/src/**/*.py"))
    assert WRAPPER in sources
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sources
        if path != WRAPPER
        for line in _imports_nats(path)
    ]
    assert not found, "nats-py imported outside aegis_runtime.natsio:\n" + "\n".join(found)


class _Subscription:
    """A pull subscription whose fetch fails as nats-py's does when its deadline ran out."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    async def fetch(self, *args: object, **kwargs: object) -> list[object]:
        raise self.error


async def test_an_empty_fetch_said_the_plain_way_reaches_the_pull_loop_as_nats_py_s_timeout() -> (
    None
):
    """FastStream's pull loop passes over ``nats.errors.TimeoutError`` (an empty fetch) and logs
    anything else as a crash of its task; nats-py also raises the plain one."""
    plain, own = _Subscription(TimeoutError()), _Subscription(nats.errors.TimeoutError())
    for subscription in (plain, own):
        assert pace_fetches(subscription)  # type: ignore[arg-type]
        assert not pace_fetches(subscription)  # type: ignore[arg-type]  # wrapped once
        with pytest.raises(nats.errors.TimeoutError):
            await subscription.fetch(batch=1, timeout=0.1)


async def test_a_fetch_on_a_closed_connection_pauses_before_it_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Such a fetch fails without giving the event loop a turn, and FastStream's pull loop
    fetches again at once: unpaced, it would spin at full CPU."""
    paused: list[float] = []

    async def sleep(seconds: float) -> None:
        paused.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    closed = _Subscription(nats.errors.ConnectionClosedError())
    assert pace_fetches(closed, pause=0.5)  # type: ignore[arg-type]
    with pytest.raises(nats.errors.ConnectionClosedError):
        await closed.fetch(batch=1, timeout=0.1)
    assert paused == [0.5]
