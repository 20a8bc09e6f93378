"""The alerting rules of the cloud checks (for, clear, starting) on a clock the test moves: each run
is ``rules.evaluate`` at a time the test gives, on the previous run's snapshot read back from its
JSON, as the collector reads it back from CLOUD#infra LATEST."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from aegis_cloud_collector import domain, rules
from aegis_cloud_collector.app import timing
from aegis_cloud_collector.domain import SysState
from aegis_cloud_collector.settings import CollectorSettings
from aegis_contracts.cloud import CheckState, CloudCheck, CloudSnapshot
from aegis_contracts.events import Heartbeat
from aegis_contracts.state import Level

T0 = datetime(2026, 11, 30, 10, 0, 0, tzinfo=UTC)  # the collector's start
EXPECTED = ["ingest", "processor", "aggregator", "cloud-collector", "alert-dispatcher"]
TIMING = timing(CollectorSettings(), timedelta(seconds=60))


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class Runs:
    """A tier's runs: each files its snapshot, which the next one reads back (as JSON)."""

    def __init__(self, timing_: rules.Timing = TIMING) -> None:
        self.timing = timing_
        self.previous: CloudSnapshot | None = None

    def run(self, t: float, checks: Sequence[CloudCheck]) -> CloudSnapshot:
        now = at(t)
        reported = rules.evaluate(checks, self.previous, now, self.timing)
        snapshot = CloudSnapshot.of("fast", now, reported, collector="test")
        self.previous = CloudSnapshot.model_validate_json(snapshot.model_dump_json())
        return self.previous


def state(snapshot: CloudSnapshot, name: str) -> CheckState | None:
    check = snapshot.check(name)
    assert check is not None, f"{name} not in the snapshot"
    return check.alerting.state if check.alerting else None


def codes(snapshot: CloudSnapshot) -> list[tuple[str, str]]:
    return [(r.severity, r.code) for r in snapshot.reasons]


def beat(service: str, t: float, **fields: Any) -> Heartbeat:
    """A heartbeat of ``service`` sent at ``t`` (seconds after T0)."""
    sent = at(t)
    return Heartbeat(
        service=service,
        instance=fields.pop("instance", f"{service}-1"),
        at=sent,
        started_at=fields.pop("started_at", sent - timedelta(hours=1)),
        interval_s=10,
        ready=fields.pop("ready", True),
        **fields,
    )


def services(beats: list[Heartbeat], t: float, expected: Sequence[str] = EXPECTED) -> list[Any]:
    return domain.service_checks(beats, expected, at(t), watching_since=T0, grace_s=TIMING_GRACE)


TIMING_GRACE = CollectorSettings().cloud_startup_grace_s


def down(name: str = "service:processor", level: Level = Level.CRITICAL) -> CloudCheck:
    return CloudCheck(name=name, status=level, reason="SERVICE_DOWN", detail="gone")


def up(name: str = "service:processor") -> CloudCheck:
    return CloudCheck.ok(name, 1, "replicas")


# -- start-up -------------------------------------------------------------------------------------


def test_the_first_run_before_any_service_is_up_reports_nothing() -> None:
    """make run: the collector's first run comes before the others have sent a heartbeat, and
    the last heartbeats in the stream are a previous run's."""
    old = [beat(s, -3600, stopping=True) for s in EXPECTED] + [beat("ingest", -7200)]
    checks = [
        *services(old, 1),
        domain.mqtt_check(SysState(False, None, running_for_s=1.0), sys_interval_s=10, grace_s=120),
    ]
    snapshot = Runs().run(1, checks)
    assert snapshot.status is Level.NORMAL and snapshot.reasons == []
    assert {c.alerting.state for c in snapshot.checks if c.alerting} == {CheckState.STARTING}
    assert {c.reason for c in snapshot.checks} == {"SERVICE_STARTING", "MQTT_STARTING"}


def test_start_up_takes_longer_than_a_run_and_still_reports_nothing() -> None:
    runs = Runs()
    first = runs.run(1, services([], 1))
    # 59 s later every service but the aggregator beats; the aggregator's replica is not ready yet
    beats = [beat(s, 55) for s in EXPECTED if s != "aggregator"]
    beats.append(beat("aggregator", 58, ready=False, started_at=at(40)))
    second = runs.run(60, services(beats, 60))
    assert first.reasons == second.reasons == []
    assert state(second, "service:aggregator") is CheckState.STARTING
    assert state(second, "service:ingest") is CheckState.OK


def test_a_service_that_never_starts_is_down_after_the_grace_and_its_for() -> None:
    runs = Runs()
    grace, for_s = TIMING_GRACE, TIMING.for_of("SERVICE_DOWN")
    live = [beat(s, 0) for s in EXPECTED if s != "processor"]
    for t in range(0, int(grace) + 1, 60):
        assert runs.run(t, services([beat(b.service, t) for b in live], t)).reasons == []
    after = grace + 60
    pending = runs.run(after, services([beat(b.service, after) for b in live], after))
    assert state(pending, "service:processor") is CheckState.PENDING
    assert pending.reasons == []
    fired = after + for_s
    snapshot = runs.run(fired, services([beat(b.service, fired) for b in live], fired))
    assert codes(snapshot) == [("CRITICAL", "SERVICE_DOWN")]


# -- for ------------------------------------------------------------------------------------------


def test_a_failure_shorter_than_for_is_pending_only() -> None:
    runs = Runs()
    pending = runs.run(0, [down()])
    check = pending.check("service:processor")
    assert check is not None and check.alerting is not None
    assert (check.status, check.reason, check.alerting.state) == (
        Level.NORMAL,
        "SERVICE_DOWN",
        CheckState.PENDING,
    )
    assert check.alerting.observed is Level.CRITICAL and check.alerting.failing_since == at(0)
    assert check.detail.startswith("pending CRITICAL for 0 s of 60 s")
    assert pending.status is Level.NORMAL and pending.reasons == []
    still = runs.run(30, [down()])
    assert state(still, "service:processor") is CheckState.PENDING and still.reasons == []
    passed = runs.run(50, [up()])
    assert state(passed, "service:processor") is CheckState.OK and passed.reasons == []
    # failing again counts from the start
    again = runs.run(70, [down()])
    check = again.check("service:processor")
    assert check is not None and check.alerting is not None
    assert check.alerting.failing_since == at(70) and again.reasons == []


def test_a_failure_that_lasts_its_for_fires() -> None:
    runs = Runs()
    runs.run(0, [down()])
    fired = runs.run(60, [down()])
    assert codes(fired) == [("CRITICAL", "SERVICE_DOWN")]
    assert state(fired, "service:processor") is CheckState.FIRING
    check = fired.check("service:processor")
    assert check is not None and check.detail == "gone"  # as measured, nothing added


def test_each_reason_has_its_own_for() -> None:
    runs = Runs()
    silent = domain.mqtt_check(SysState(True, 40.0, running_for_s=600), sys_interval_s=10)
    assert silent.reason == "MQTT_SYS_SILENT"
    assert runs.run(0, [silent]).reasons == []
    assert runs.run(60, [silent]).reasons == []  # 60 s of MQTT_SYS_SILENT's 90
    assert codes(runs.run(120, [silent])) == [("WARNING", "MQTT_SYS_SILENT")]
    # new dead letters are reported in the run that counted them, and no longer after
    letters = Runs()
    new = CloudCheck(name="dead_letters:x", status=Level.WARNING, reason="DEAD_LETTERS")
    assert codes(letters.run(0, [new])) == [("WARNING", "DEAD_LETTERS")]
    assert letters.run(60, [CloudCheck.ok("dead_letters:x", 0, "messages")]).reasons == []


def test_a_run_started_late_in_its_window_still_reaches_for() -> None:
    runs = Runs()
    runs.run(0.8, [down()])  # the first run took 0.8 s to claim its window
    assert codes(runs.run(60, [down()])) == [("CRITICAL", "SERVICE_DOWN")]


def test_a_change_of_reason_keeps_counting_and_of_level_is_reported_as_measured() -> None:
    runs = Runs()
    runs.run(0, [CloudCheck(name="service:p", status=Level.WARNING, reason="SERVICE_NOT_READY")])
    fired = runs.run(60, [down("service:p")])
    assert codes(fired) == [("CRITICAL", "SERVICE_DOWN")]
    lower = runs.run(120, [down("service:p", Level.WARNING)])
    assert codes(lower) == [("WARNING", "SERVICE_DOWN")]


# -- clear and flapping ---------------------------------------------------------------------------


def test_a_firing_check_that_passes_briefly_stays_reported_until_its_clear_duration() -> None:
    runs = Runs()
    runs.run(0, [down()])
    runs.run(60, [down()])
    clearing = runs.run(120, [up()])
    assert codes(clearing) == [("CRITICAL", "SERVICE_DOWN")]
    check = clearing.check("service:processor")
    assert check is not None and check.alerting is not None
    assert check.alerting.state is CheckState.CLEARING
    assert check.value == 1 and check.detail.startswith("clearing: passing for 0 s of 120 s")
    assert codes(runs.run(180, [up()])) == [("CRITICAL", "SERVICE_DOWN")]  # 60 s of 120
    cleared = runs.run(240, [up()])
    assert cleared.reasons == [] and state(cleared, "service:processor") is CheckState.OK


def test_a_flapping_check_fires_once_and_resolves_once() -> None:
    runs = Runs()
    reported = []
    # fails two runs (fires), then passes and fails every other run for ten minutes
    pattern = [down(), down()] + [up(), down()] * 5 + [up(), up(), up()]
    for i, check in enumerate(pattern):
        reported.append(bool(runs.run(60 * i, [check]).reasons))
    # never fired before its for, then reported in every run until it passed for 120 s: one
    # alert, one resolve
    assert reported == [False] + [True] * (len(pattern) - 2) + [False]
    assert runs.previous is not None
    last_firing = Runs()
    for i, check in enumerate(pattern[:-3]):
        snapshot = last_firing.run(60 * i, [check])
    flapped = snapshot.check("service:processor")
    assert flapped is not None and flapped.alerting is not None
    assert flapped.alerting.state is CheckState.FIRING and flapped.alerting.flaps == 5
    assert flapped.alerting.failing_since == at(0)


def test_a_check_that_flaps_below_its_for_is_never_reported() -> None:
    runs = Runs()
    for i in range(10):
        assert runs.run(30 * i, [down() if i % 2 == 0 else up()]).reasons == []


def test_a_firing_check_no_longer_measured_clears_then_goes() -> None:
    runs = Runs()
    failed = domain.failed_check("services", Level.CRITICAL, TimeoutError())
    runs.run(0, [failed])
    assert codes(runs.run(60, [failed])) == [("CRITICAL", "CHECK_FAILED")]
    gone = runs.run(120, [up()])
    assert codes(gone) == [("CRITICAL", "CHECK_FAILED")]
    check = gone.check("services")
    assert check is not None and "no longer measured" in check.detail
    assert runs.run(180, [up()]).reasons  # 60 s of 120
    final = runs.run(240, [up()])
    assert final.reasons == [] and final.check("services") is None


# -- starting -------------------------------------------------------------------------------------


def test_a_replica_replaced_by_a_newer_one_is_starting_not_down() -> None:
    t = 600.0  # long after the collector started
    # the old replica stopped cleanly; its replacement has not sent a heartbeat yet
    stopped = services([beat("processor", t - 5, stopping=True)], t, ["processor"])
    assert [(c.status, c.reason) for c in stopped] == [(Level.NORMAL, "SERVICE_STARTING")]
    assert "waiting for its replacement" in stopped[0].detail
    # the new replica beats, not ready yet; the old one draining (not ready either)
    new = beat("processor", t, instance="p-2", ready=False, started_at=at(t - 20))
    old = beat("processor", t, instance="p-1", ready=False, started_at=at(t - 3600))
    both = services([new, old], t, ["processor"])
    assert [(c.status, c.reason) for c in both] == [(Level.NORMAL, "SERVICE_STARTING")]
    assert both[0].measures == {"ready": 0, "starting": 1, "draining": 1}
    # the new one took over; the old one, not ready, drains
    ready = beat("processor", t, instance="p-2", started_at=at(t - 20))
    taken = services([ready, old], t, ["processor"])
    assert [(c.status, c.reason) for c in taken] == [(Level.NORMAL, "OK")]
    assert "1 draining" in taken[0].detail
    # through the rules: never a reason
    runs = Runs()
    for i, checks in enumerate((stopped, both, taken)):
        snapshot = runs.run(t + 30 * i, checks)
        assert snapshot.reasons == []
    assert state(runs.run(t + 90, stopped), "service:processor") is CheckState.STARTING


def test_a_replacement_that_never_comes_is_down_after_the_grace() -> None:
    t = 600.0
    stopped = beat("processor", t, stopping=True)
    later = t + TIMING_GRACE + 1
    check = services([stopped], later, ["processor"])[0]
    assert (check.status, check.reason) == (Level.CRITICAL, "SERVICE_DOWN")


def test_a_replica_not_ready_past_the_grace_is_not_ready() -> None:
    t = 600.0
    stuck = beat("processor", t, ready=False, started_at=at(t - TIMING_GRACE - 1))
    check = services([stuck], t, ["processor"])[0]
    assert (check.status, check.reason) == (Level.WARNING, "SERVICE_NOT_READY")


def test_a_service_seen_since_the_collector_started_and_then_lost_is_down() -> None:
    check = services([beat("processor", 10)], 60, ["processor"])[0]
    assert (check.status, check.reason) == (Level.CRITICAL, "SERVICE_DOWN")


def test_mqtt_is_starting_until_its_first_sys_message_within_the_grace() -> None:
    def check(state: SysState) -> tuple[Level, str]:
        found = domain.mqtt_check(state, sys_interval_s=10, grace_s=120)
        return found.status, found.reason

    assert check(SysState(True, None, running_for_s=5)) == (Level.NORMAL, "MQTT_STARTING")
    assert check(SysState(False, None, error="refused", running_for_s=5)) == (
        Level.NORMAL,
        "MQTT_STARTING",
    )
    assert check(SysState(True, None, running_for_s=121)) == (Level.WARNING, "MQTT_SYS_SILENT")
    # once a message came, silence and a lost connection count as they always did
    assert check(SysState(False, 3.0, running_for_s=5)) == (Level.CRITICAL, "MQTT_UNREACHABLE")


# -- restarts and replicas ------------------------------------------------------------------------


def test_a_collector_restart_goes_on_counting_from_the_previous_snapshot() -> None:
    first = Runs()
    first.run(0, [down()])
    # another process (a restart, or a second replica) reads the same snapshot back
    second = Runs()
    second.previous = first.previous
    assert codes(second.run(60, [down()])) == [("CRITICAL", "SERVICE_DOWN")]


def test_a_collector_restart_while_a_service_is_down_keeps_its_alert() -> None:
    """Just restarted, the collector has not seen the processor since its start and would call it
    starting; the previous snapshot says it was firing: it stays reported, same code."""
    runs = Runs()
    runs.run(0, [down()])
    runs.run(60, [down()])
    restarted = T0 + timedelta(seconds=100)
    t = 120
    starting = domain.service_checks(
        [beat("processor", 0)], ["processor"], at(t), watching_since=restarted, grace_s=120
    )
    assert starting[0].reason == "SERVICE_STARTING"
    snapshot = runs.run(t, starting)
    assert codes(snapshot) == [("CRITICAL", "SERVICE_DOWN")]
    assert state(snapshot, "service:processor") is CheckState.FIRING
    # and when pending, it goes on pending from when it started failing
    pending = Runs()
    pending.run(0, [down()])
    kept = pending.run(45, starting)
    assert state(kept, "service:processor") is CheckState.PENDING
    assert codes(pending.run(60, starting)) == [("CRITICAL", "SERVICE_DOWN")]


def test_a_previous_snapshot_from_before_a_long_stop_is_not_carried_over() -> None:
    runs = Runs()
    runs.run(0, [down()])
    runs.run(60, [down()])  # firing when the collector was stopped
    later = 60 + TIMING.max_gap_s + 1
    snapshot = runs.run(later, [down()])
    assert snapshot.reasons == [] and state(snapshot, "service:processor") is CheckState.PENDING


def test_a_snapshot_filed_before_the_rules_counts_as_firing_when_not_normal() -> None:
    runs = Runs()
    runs.previous = CloudSnapshot.of("fast", at(0), [down()])
    assert runs.previous.checks[0].alerting is None
    assert codes(runs.run(60, [up()])) == [("CRITICAL", "SERVICE_DOWN")]  # clearing


# -- settings -------------------------------------------------------------------------------------


def test_durations_by_reason_read_from_the_environment_keep_the_other_defaults() -> None:
    s = CollectorSettings(cloud_for_by_reason="SERVICE_DOWN=120, STORAGE_SLOW=300")  # type: ignore[arg-type]
    assert s.cloud_for_by_reason["SERVICE_DOWN"] == 120
    assert s.cloud_for_by_reason["STORAGE_SLOW"] == 300
    assert s.cloud_for_by_reason["MQTT_SYS_SILENT"] == 90
    json_form = CollectorSettings(cloud_clear_by_reason='{"SERVICE_DOWN": 30}')  # type: ignore[arg-type]
    assert json_form.cloud_clear_by_reason == {"DEAD_LETTERS": 0, "SERVICE_DOWN": 30}
    t = timing(s, timedelta(seconds=300))
    assert (t.for_of("SERVICE_DOWN"), t.for_of("GRAPH_BEHIND"), t.max_gap_s) == (120, 60, 900)
    for bad in ("SERVICE_DOWN", "service_down=1", "SERVICE_DOWN=-1", "SERVICE_DOWN=x"):
        with pytest.raises(ValueError, match="AEGIS_CLOUD_FOR_BY_REASON"):
            CollectorSettings(cloud_for_by_reason=bad)  # type: ignore[arg-type]
