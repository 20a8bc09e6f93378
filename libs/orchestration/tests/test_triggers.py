"""The trigger index (only the event's own jobs are touched; conditions on beforeData/afterData;
disabled and soft-deleted jobs never fire) and cron fires with time zones and misfire policies."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from aegis_orchestration.model import Job
from aegis_orchestration.triggers import (
    TriggerIndex,
    biz_object_trigger,
    due_fires,
    fires_between,
    platform_trigger,
)

CONDITION = (
    'AND(StringEQ([$.afterData.risk.level], "CRITICAL"),'
    ' NOT(StringEQ([$.beforeData.risk.level], "CRITICAL")))'
)


def job(job_id: str, **overrides: Any) -> Job:
    doc: dict[str, Any] = {
        "id": job_id,
        "job_name": job_id,
        "trigger_type": "BizObject",
        "object_id": "factory_latest",
        "trigger_sub_type": "Update",
        "trigger_condition_expr": CONDITION,
        "steps": [{"id": "a", "step_type": "DUMMY", "is_start_point": True}],
    }
    doc.update(overrides)
    return Job.model_validate(doc)


def change(before: str, after: str, event: str = "MODIFY") -> dict[str, Any]:
    return {
        "event_name": event,
        "pk": "FACTORY#f",
        "sk": "LATEST",
        "old_image": {"risk": {"level": before}},
        "new_image": {"risk": {"level": after}},
    }


def test_a_bizobject_update_job_fires_only_when_its_condition_holds() -> None:
    index = TriggerIndex([job("on")])
    fire = index.matching(biz_object_trigger(change("WARNING", "CRITICAL"), "factory_latest"))
    assert [j.id for j in fire] == ["on"]
    for c in (change("CRITICAL", "CRITICAL"), change("WARNING", "WARNING")):
        assert index.matching(biz_object_trigger(c, "factory_latest")) == []
    assert (
        index.matching(
            biz_object_trigger(change("WARNING", "CRITICAL", "INSERT"), "factory_latest")
        )
        == []
    )
    assert index.matching(biz_object_trigger(change("WARNING", "CRITICAL"), "other_entity")) == []


def test_replayed_data_starts_no_job_unless_replayed_with_notify() -> None:
    index = TriggerIndex(
        [
            job("on"),
            job(
                "raw",
                trigger_type="Platform",
                object_id="factory_state",
                trigger_sub_type="Insert",
                trigger_condition_expr=None,
            ),
        ]
    )
    replayed = {**change("WARNING", "CRITICAL"), "replayed": True}
    assert index.matching(biz_object_trigger(replayed, "factory_latest")) == []
    notified = {**replayed, "replayed": False}  # aegis replay --notify
    assert [j.id for j in index.matching(biz_object_trigger(notified, "factory_latest"))] == ["on"]
    raw = {"source_type": "factory_state", "payload_text": "{}"}
    assert [j.id for j in index.matching(platform_trigger(raw))] == ["raw"]
    assert index.matching(platform_trigger({**raw, "replayed": True})) == []


def test_disabled_or_soft_deleted_jobs_never_fire() -> None:
    index = TriggerIndex([job("off", is_enabled=False), job("gone", is_active=False)])
    assert index.matching(biz_object_trigger(change("WARNING", "CRITICAL"), "factory_latest")) == []
    index.put(job("off"))  # enabled again
    assert [
        j.id
        for j in index.matching(biz_object_trigger(change("NORMAL", "CRITICAL"), "factory_latest"))
    ] == ["off"]


def test_cron_fires_in_the_job_time_zone() -> None:
    after = datetime(2026, 11, 30, 14, 0, tzinfo=UTC)  # 23:00 KST
    fires = fires_between("30 0 * * *", "Asia/Seoul", after, after + timedelta(days=1))
    assert [f.astimezone(UTC) for f in fires] == [datetime(2026, 11, 30, 15, 30, tzinfo=UTC)]


def test_misfire_policies() -> None:
    now = datetime(2026, 11, 30, 3, 10, 30, tzinfo=UTC)
    base = {
        "trigger_type": "Schedule",
        "object_id": None,
        "trigger_sub_type": None,
        "trigger_condition_expr": None,
        "trigger_cron": "* * * * *",
        "misfire_grace_s": 300,
    }
    once = job("s1", **base)
    every = job("s2", **base, misfire_policy="FIRE_ALL")
    skip = job("s3", **base, misfire_policy="SKIP")
    assert len(due_fires(every, None, now)) == 5
    assert due_fires(once, None, now) == [datetime(2026, 11, 30, 12, 10, tzinfo=once_tz())]
    assert due_fires(skip, None, now) == []
    assert len(due_fires(once, now - timedelta(seconds=120), now)) == 2  # on time after a tick


def once_tz() -> ZoneInfo:
    return ZoneInfo("Asia/Seoul")
