"""The trigger index (only the event's own jobs are touched; conditions on beforeData/afterData;
disabled and soft-deleted jobs never fire) and cron fires with time zones and misfire policies."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from aegis_contracts.subjects import CHANGE_ENTITIES, EXPIRING_ENTITIES, OBJECT_FAMILIES
from aegis_orchestration.model import BIZ_SUB_TYPES, Job
from aegis_orchestration.tenants import Tenants
from aegis_orchestration.triggers import (
    Trigger,
    TriggerIndex,
    automation_trigger,
    biz_object_trigger,
    component_trigger,
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


# -- Component triggers, the entity catalog, skips -------------------------------------------------


def created(key: str, *, replayed: bool = False) -> dict[str, Any]:
    return {
        "bucket": "aegis-data",
        "key": key,
        "size_bytes": 10,
        "producer": "reporter",
        "created_at": "2025-01-02T03:04:05.000Z",
        "replayed": replayed,
    }


def component(job_id: str, family: str | None, condition: str | None = None) -> Job:
    return job(
        job_id,
        trigger_type="Component",
        object_id=family,
        trigger_sub_type="Insert",
        trigger_condition_expr=condition,
    )


def test_a_component_job_fires_on_objects_of_its_family_and_key_pattern() -> None:
    index = TriggerIndex(
        [
            component("reports", "reports"),
            component("md-only", "reports", 'StringMatches([$.key], "reports/daily/*/report.md")'),
            component("any", None, 'StringEQ([$.bucket], "aegis-data")'),
            component("windows", "metrics_5m"),
        ]
    )
    report = component_trigger(created("reports/daily/2025-01-02/all/report.md"), "reports")
    assert report.data["family"] == "reports" and report.sub_type == "Insert"
    assert sorted(j.id for j in index.matching(report)) == ["any", "md-only", "reports"]
    csv = component_trigger(created("reports/daily/2025-01-02/all/hourly.csv"), "reports")
    evaluation = index.evaluate(csv)
    assert sorted(j.id for j in evaluation.fired) == ["any", "reports"]
    assert [(j.id, why) for j, why in evaluation.skipped] == [("md-only", "condition")]
    # another family's jobs are not even looked at
    assert "windows" not in {j.id for j, _ in evaluation.skipped}


def test_a_replayed_object_starts_nothing_and_counts_as_skipped() -> None:
    index = TriggerIndex([component("reports", "reports")])
    evaluation = index.evaluate(component_trigger(created("reports/x", replayed=True), "reports"))
    assert evaluation.fired == []
    assert [(j.id, why) for j, why in evaluation.skipped] == [("reports", "replayed")]


def test_a_delete_of_another_entity_fires_a_bizobject_delete_job() -> None:
    index = TriggerIndex(
        [
            job(
                "cleared",
                object_id="factory_late",
                trigger_sub_type="Delete",
                trigger_condition_expr=None,
            )
        ]
    )
    removed = {"event_name": "REMOVE", "pk": "FACTORY#f", "sk": "LATE#x", "old_image": {"marks": 2}}
    trigger = biz_object_trigger(removed, "factory_late")
    assert trigger.sub_type == "Delete" and trigger.data["beforeData"] == {"marks": 2}
    assert [j.id for j in index.matching(trigger)] == ["cleared"]


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"object_id": "factory_history"}, "no entity whose changes are announced"),
        (
            {"object_id": "cloud_infra", "trigger_sub_type": "Delete"},
            "cloud_infra never announces a Delete",
        ),
        ({"object_id": "orch_job", "trigger_sub_type": "Delete"}, "orch_job never announces"),
        ({"trigger_sub_type": "Upsert"}, "none of Insert, Update, Delete"),
        ({"trigger_type": "Component", "object_id": "raw"}, "no object family"),
        (
            {"trigger_type": "Component", "object_id": "reports", "trigger_sub_type": "Delete"},
            "objects are only created",
        ),
    ],
)
def test_a_trigger_that_can_never_fire_is_refused(overrides: dict[str, Any], reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        job("never", **overrides)


def test_every_announced_entity_and_family_is_accepted() -> None:
    for entity, names in CHANGE_ENTITIES.items():
        for sub, name in BIZ_SUB_TYPES.items():
            if name in names:
                job("ok", object_id=entity, trigger_sub_type=sub)
    for entity in EXPIRING_ENTITIES:  # their expiries, where the table's stream is read
        job("ok", object_id=entity, trigger_sub_type="Delete")
    for family in OBJECT_FAMILIES:
        component("ok", family)
    job("ok", object_id="*", trigger_sub_type="*")


def test_a_sign_in_event_is_an_automation_login_trigger_a_job_filters_by_its_exception() -> None:
    locked = job(
        "locked-out",
        trigger_type="Automation",
        object_id="dashboard-api",
        trigger_sub_type="Login",
        trigger_condition_expr='StringEQ([$.detail.exception], "locked")',
    )
    index = TriggerIndex([locked])

    def sign_in(exception: str | None) -> Trigger:
        return automation_trigger(
            {
                "kind": "login",
                "producer": "dashboard-api",
                "at": "2026-11-30T03:00:00Z",
                "detail": {"outcome": "ok" if exception is None else "refused",
                           "exception": exception},
            }
        )  # fmt: skip

    assert sign_in("locked").sub_type == "Login"
    assert [j.id for j in index.matching(sign_in("locked"))] == ["locked-out"]
    assert index.matching(sign_in("wrong_token")) == []
    assert index.matching(sign_in(None)) == []


# -- tenants --------------------------------------------------------------------------------------

TENANTS = Tenants({"aegis/plant-ops": ("factory-a", "north-*"), "aegis/empty": ()})


def tenant_job(job_id: str, tenant: str, **overrides: Any) -> Job:
    return job(job_id, tenant=tenant, trigger_condition_expr=None, **overrides)


def factory_change(factory: str, level: str = "CRITICAL") -> Trigger:
    event = change("WARNING", level) | {
        "pk": f"FACTORY#{factory}",
        "new_image": {"factory_id": factory, "risk": {"level": level}},
    }
    return biz_object_trigger(event, "factory_latest")


def test_a_tenants_job_starts_only_for_its_tenants_factories() -> None:
    index = TriggerIndex(
        [
            tenant_job("mine", "aegis/plant-ops"),
            tenant_job("empty", "aegis/empty"),
            tenant_job("stray", "aegis/unknown"),
            job("everyone", trigger_condition_expr=None),
        ],
        TENANTS,
    )
    for factory in ("factory-a", "north-7"):
        evaluation = index.evaluate(factory_change(factory))
        assert sorted(j.id for j in evaluation.fired) == ["everyone", "mine"]
        assert sorted((j.id, why) for j, why in evaluation.skipped) == [
            ("empty", "factory_out_of_scope"),
            ("stray", "tenant_undeclared"),
        ]
    other = index.evaluate(factory_change("factory-b"))
    assert [j.id for j in other.fired] == ["everyone"]
    assert ("mine", "factory_out_of_scope") in [(j.id, why) for j, why in other.skipped]


def test_another_tenants_event_is_refused_as_such_before_the_condition_is_read() -> None:
    index = TriggerIndex([job("mine", tenant="aegis/plant-ops")], TENANTS)  # with CONDITION
    for level in ("CRITICAL", "WARNING"):  # the condition holds, and does not
        (skipped,) = index.evaluate(factory_change("factory-b", level)).skipped
        assert skipped[1] == "factory_out_of_scope"
    (skipped,) = index.evaluate(factory_change("factory-a", "WARNING")).skipped
    assert skipped[1] == "condition"
    assert [j.id for j in index.evaluate(factory_change("factory-a")).fired] == ["mine"]


def test_an_event_of_no_factory_starts_a_tenants_job_only_when_it_says_so() -> None:
    automation = {
        "trigger_type": "Automation",
        "object_id": "dashboard-api",
        "trigger_sub_type": "Login",
    }
    index = TriggerIndex(
        [
            tenant_job("quiet", "aegis/plant-ops", **automation),
            tenant_job("opted", "aegis/empty", unscoped_events=True, **automation),
            job("everyone", trigger_condition_expr=None, **automation),
        ],
        TENANTS,
    )
    login = automation_trigger({"kind": "login", "producer": "dashboard-api", "detail": {}})
    assert login.factory is None
    evaluation = index.evaluate(login)
    assert sorted(j.id for j in evaluation.fired) == ["everyone", "opted"]
    assert [(j.id, why) for j, why in evaluation.skipped] == [("quiet", "no_factory")]


def test_without_a_tenants_file_a_tenants_job_never_starts() -> None:
    index = TriggerIndex([tenant_job("mine", "aegis/plant-ops")])
    (skipped,) = index.evaluate(factory_change("factory-a")).skipped
    assert skipped[1] == "tenant_undeclared"
    assert [j.id for j in index.undeclared()] == ["mine"]


def test_a_tenants_schedule_runs_when_its_tenant_is_declared() -> None:
    nightly = {"trigger_type": "Schedule", "trigger_cron": "30 0 * * *", "object_id": None}
    index = TriggerIndex(
        [
            tenant_job("declared", "aegis/empty", **nightly),
            tenant_job("undeclared", "aegis/unknown", **nightly),
        ],
        TENANTS,
    )
    assert [j.id for j in index.schedules()] == ["declared"]


@pytest.mark.parametrize(
    ("trigger", "factory"),
    [
        (
            biz_object_trigger({"pk": "FACTORY#factory-a", "event_name": "MODIFY"}, "graph_5m"),
            "factory-a",
        ),
        (
            biz_object_trigger({"pk": "ALERT#factory-a", "event_name": "INSERT"}, "alert"),
            "factory-a",
        ),
        (biz_object_trigger({"pk": "ALERT#cloud-infra", "event_name": "INSERT"}, "alert"), None),
        (biz_object_trigger({"pk": "CLOUD#infra", "event_name": "MODIFY"}, "cloud_infra"), None),
        (
            biz_object_trigger(
                {"pk": "X", "event_name": "REMOVE", "old_image": {"factory_id": "factory-a"}},
                "factory_late",
            ),
            "factory-a",
        ),
        (
            platform_trigger({"factory_id": "factory-a", "source_type": "factory_state"}),
            "factory-a",
        ),
        (
            component_trigger(
                {"key": "image_snapshot/factory_id=factory-a/yyyy=2025/mm=11/dd=03/hh=09/cam.jpg"},
                "image_upload",
            ),
            "factory-a",
        ),
        (
            component_trigger(
                {"key": "reports/daily/yyyy=2025/mm=11/dd=03/cloud-infra/report.md"}, "reports"
            ),
            None,
        ),
        (component_trigger({"key": "uploads/anything.csv"}, "external"), None),
        (
            automation_trigger(
                {"kind": "alert_sent", "producer": "x", "detail": {"scope": "factory-a"}}
            ),
            "factory-a",
        ),
        (
            automation_trigger(
                {"kind": "select", "producer": "x", "detail": {"factory": "factory-a"}}
            ),
            "factory-a",
        ),
        (
            automation_trigger(
                {"kind": "alert_sent", "producer": "x", "detail": {"scope": "cloud-infra"}}
            ),
            None,
        ),
    ],
)
def test_each_trigger_names_the_factory_of_its_event(trigger: Trigger, factory: str | None) -> None:
    assert trigger.factory == factory
