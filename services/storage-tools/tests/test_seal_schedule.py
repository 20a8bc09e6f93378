"""``aegis seal schedule``, the daily seal of compose and ``make run``: when its runs are due
(pure), what a run seals with the test's clock on the S3 emulator, and the command itself as
compose and ``aegis up`` start it: a process that seals at start, answers ``/readyz`` and stops
cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime, time, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from aegis_contracts import keys
from aegis_contracts.ids import SourceType
from aegis_devstack.localservers import free_port
from aegis_devstack.testing.builders import FakeClock
from aegis_devstack.testing.waiting import eventually
from aegis_runtime.health import answers_ready
from aegis_storage.s3 import ObjectStore
from aegis_storage_tools.schedule import SealSchedule, next_run
from aegis_storage_tools.settings import StorageToolsSettings

FS = SourceType.FACTORY_STATE
AT = time(2, 30)


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        (datetime(2026, 11, 30, 1, 0, tzinfo=UTC), datetime(2026, 11, 30, 2, 30, tzinfo=UTC)),
        (datetime(2026, 11, 30, 2, 30, tzinfo=UTC), datetime(2026, 12, 1, 2, 30, tzinfo=UTC)),
        (datetime(2026, 12, 31, 23, 59, tzinfo=UTC), datetime(2027, 1, 1, 2, 30, tzinfo=UTC)),
        (datetime(2028, 2, 28, 3, 0, tzinfo=UTC), datetime(2028, 2, 29, 2, 30, tzinfo=UTC)),
    ],
)
def test_the_next_run_is_the_first_schedule_time_after(after: datetime, expected: datetime) -> None:
    assert next_run(after, AT) == expected


@pytest.mark.parametrize("bad", ["2:30", "24:00", "02:60", "0230", "02:30:00"])
def test_a_schedule_time_that_is_no_hh_mm_is_refused_naming_the_variable(
    bad: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AEGIS_SEAL_SCHEDULE_UTC", bad)
    with pytest.raises(ValidationError, match="seal_schedule_utc"):
        StorageToolsSettings()


async def put_message(store: ObjectStore, factory: str, at: datetime, n: int) -> str:
    key = keys.raw_key(factory, FS, at, f"m-sched-{n:04d}")
    await store.put_immutable(key, b'{"n": %d}' % n)
    return key


@pytest.mark.integration
async def test_a_run_seals_the_due_days_and_the_next_is_due_at_the_schedule_time(
    foundation_env: Any, unique_id: str
) -> None:
    store: ObjectStore = foundation_env.store
    f = f"f-{unique_id}"
    clock = FakeClock(datetime(2026, 11, 30, 9, 0, tzinfo=UTC))
    await put_message(store, f, datetime(2026, 11, 29, 10, tzinfo=UTC), 1)
    await put_message(store, f, datetime(2026, 11, 30, 8, tzinfo=UTC), 2)  # today: not due
    schedule = SealSchedule(StorageToolsSettings(), clock=clock)
    schedule.clients = foundation_env.clients
    assert schedule.due()  # the run at start

    assert await schedule.once() == {"sealed": 1, "empty": 6}
    assert schedule.next_at == datetime(2026, 12, 1, 2, 30, tzinfo=UTC)
    assert await store.list_keys(keys.raw_metadata_key(f, FS, datetime(2026, 11, 29).date()))
    clock.advance(timedelta(hours=17, minutes=29))  # 02:29 the next day
    assert not schedule.due()
    clock.advance(timedelta(minutes=1))
    assert schedule.due()
    assert (await schedule.once()).get("sealed") == 1  # 30 Nov, now over plus grace
    assert schedule.metrics.total("seal_runs_total", outcome="ok") == 2
    assert schedule.metrics.total("seal_partitions_total", outcome="sealed") == 2


@pytest.mark.integration
async def test_the_command_seals_at_start_answers_ready_and_stops_on_sigterm(
    foundation_env: Any, unique_id: str, aws_endpoint: str, tmp_path: Path
) -> None:
    store: ObjectStore = foundation_env.store
    f = f"f-{unique_id}"
    # two days ago (as the process's clock sees it): due whatever the calendar says
    key = await put_message(store, f, datetime.now(UTC) - timedelta(days=2), 1)
    seal = key.rsplit("/", 1)[0] + "/" + keys.RAW_METADATA_NAME
    port = free_port()
    env = os.environ | {
        "AEGIS_AWS_ENDPOINT_URL": aws_endpoint,
        "AEGIS_BUCKET": foundation_env.bucket,
        "AEGIS_HEALTH_PORT": str(port),
        "AEGIS_LOG_FORMAT": "json",
    }
    aegis = Path(sys.executable).with_name("aegis")
    with (tmp_path / "schedule.log").open("wb") as log:
        proc = subprocess.Popen(  # noqa: ASYNC220 - starting a process does not block
            [str(aegis), "seal", "schedule"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:

        async def sealed_and_ready() -> bool:
            return bool(await store.list_keys(seal)) and await asyncio.to_thread(
                answers_ready, port
            )

        await eventually(sealed_and_ready, within=30, what="sealed at start and ready")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    logged = (tmp_path / "schedule.log").read_text()
    assert '"event": "seal_schedule_ran"' in logged and '"sealed": 1' in logged
