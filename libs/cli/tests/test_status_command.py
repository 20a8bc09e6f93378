"""``aegis status`` against the real DynamoDB emulator: LATEST items in, rows out."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from datetime import UTC, datetime, timedelta

import pytest

from aegis_contracts.times import format_ts
from aegis_devstack.testing.builders import latest_fields, seed_latest
from aegis_devstack.testing.cli import run_aegis
from aegis_devstack.testing.storage import Foundation

pytestmark = pytest.mark.integration


def _env(aws_endpoint: str, table: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AEGIS_")}
    env.update(AEGIS_AWS_ENDPOINT_URL=aws_endpoint, AEGIS_TABLE=table, COLUMNS="160")
    return env


async def test_status_lists_the_fleet_from_latest_items(
    aws_endpoint: str, foundation: Foundation, unique_id: str
) -> None:
    now = datetime.now(UTC)
    hot, calm = f"f-{unique_id}-b", f"f-{unique_id}-a"
    rm = foundation.readmodel
    await seed_latest(
        rm,
        hot,
        latest_fields(
            "factory_state",
            {
                "factory_state": {"sensors": {"co_ppm": 120.0}},
                "risk": {
                    "score": 90,
                    "level": "CRITICAL",
                    "reasons": [{"code": "CO_HIGH", "severity": "CRITICAL", "detail": "120 ppm"}],
                },
            },
            event_time=now - timedelta(seconds=3),
            updated_at=now,
        ),
    )
    await seed_latest(rm, hot, {"pipeline_status": {"status": "OK", "checked_at": format_ts(now)}})
    await seed_latest(
        rm,
        calm,
        latest_fields(
            "factory_state",
            {
                "factory_state": {"sensors": {}},
                "risk": {"score": 0, "level": "NORMAL", "reasons": []},
            },
            event_time=now - timedelta(minutes=2),
            updated_at=now,
        ),
    )
    env = _env(aws_endpoint, foundation.table)

    code, out, err = await run_aegis(env, "status", "--json")
    assert code == 0, err
    doc = json.loads(out)
    rows = {r["factory_id"]: r for r in doc["factories"]}
    assert set(rows) == {hot, calm}
    assert [r["factory_id"] for r in doc["factories"]] == [hot, calm]  # worst first
    assert doc["cloud_infra"]["overall_status"] == "-"  # no collector ran on this table
    assert rows[hot]["level"] == "CRITICAL" and rows[hot]["score"] == 90
    assert rows[hot]["reasons"] == ["CO_HIGH"] and rows[hot]["pipeline"] == "OK"
    assert 2 <= rows[hot]["age_s"] < 60 and rows[hot]["freshness"].endswith("s ago")
    assert rows[calm]["level"] == "NORMAL" and rows[calm]["freshness"] == "2m ago"
    assert rows[calm]["pipeline"] == "NO_DATA"

    code, out, err = await run_aegis(env, "status")
    assert code == 0, err
    line = next(line for line in out.splitlines() if hot in line)
    for cell in ("CRITICAL", "90", "CO_HIGH", "s ago", "OK"):
        assert cell in line
    assert "2 factories: 1 critical, 0 warning, 1 normal" in out


async def test_status_of_a_missing_table_says_what_to_do(aws_endpoint: str, unique_id: str) -> None:
    code, _out, err = await run_aegis(_env(aws_endpoint, f"AEGIS-missing-{unique_id}"), "status")
    assert code == 1
    assert "not found" in err and "aegis bootstrap" in err and aws_endpoint in err


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def test_status_watch_refreshes_until_interrupted(
    aws_endpoint: str, foundation: Foundation, unique_id: str
) -> None:
    factory = f"f-{unique_id}"
    now = datetime.now(UTC)
    await seed_latest(
        foundation.readmodel,
        factory,
        latest_fields(
            "factory_state",
            {"factory_state": {}, "risk": {"score": 10, "level": "NORMAL", "reasons": []}},
            event_time=now,
            updated_at=now,
        ),
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aegis_cli.app", "status", "--watch", "--json",
        "--interval", "0.3",
        env=_env(aws_endpoint, foundation.table), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        # Ctrl-C as on a terminal: a process started in the background by a non-interactive
        # shell (a CI runner, a test worker) ignores SIGINT, and its children inherit that
        preexec_fn=_interruptible,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        docs = [json.loads(await asyncio.wait_for(proc.stdout.readline(), 20)) for _ in range(3)]
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), timeout=20)
    assert all(d["factories"][0]["factory_id"] == factory for d in docs)
    assert proc.returncode == 0, err.decode()


async def test_status_fail_on_exits_3_at_or_above_the_level(
    aws_endpoint: str, foundation: Foundation, unique_id: str
) -> None:
    now = datetime.now(UTC)
    for name, level in ((f"f-{unique_id}-w", "WARNING"), (f"f-{unique_id}-n", "NORMAL")):
        await seed_latest(
            foundation.readmodel,
            name,
            latest_fields(
                "factory_state",
                {"factory_state": {}, "risk": {"score": 40, "level": level, "reasons": []}},
                event_time=now,
                updated_at=now,
            ),
        )
    env = _env(aws_endpoint, foundation.table)
    code, out, err = await run_aegis(env, "status", "--fail-on", "critical", "--json")
    assert code == 0, err
    assert len(json.loads(out)["factories"]) == 2  # the output is the same with --fail-on
    code, out, err = await run_aegis(env, "status", "--fail-on", "warning", "--json")
    assert code == 3, err
    assert len(json.loads(out)["factories"]) == 2
    assert f"at or above WARNING: f-{unique_id}-w (WARNING)" in err
    code, _, err = await run_aegis(env, "status", "--fail-on", "warning", "--watch")
    assert code == 2 and "--fail-on" in err
