"""The alert rules as pure functions: firing, cooldown, escalation, resolution, downgrade, cloud
observations; the trigger prefixes; the Slack message."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from aegis_alert_dispatcher.decide import Action, AlertKey, Policy, Stream, decide
from aegis_alert_dispatcher.dispatcher import triggered
from aegis_alert_dispatcher.settings import DispatcherSettings
from aegis_alert_dispatcher.slack import AlertEntry, AlertMessage, dashboard_link, reason_line
from aegis_contracts import keys
from aegis_contracts.items import AlertObservation, AlertState
from aegis_contracts.state import Reason

T0 = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
POLICY = Policy()


def reason(code: str, severity: str = "CRITICAL", **kw: object) -> Reason:
    return Reason(code=code, severity=severity, detail=code.lower().replace("_", " "), **kw)  # type: ignore[arg-type]


def state(
    code: str,
    severity: str = "CRITICAL",
    *,
    firing: bool = True,
    sent: datetime = T0,
    stream: Stream = Stream.STATE,
) -> AlertState:
    return AlertState(
        pk=keys.alert_pk("factory-a"),
        sk=keys.alert_sk(severity, code, stream.value),
        scope="factory-a",
        severity=severity,  # type: ignore[arg-type]
        reason=code,
        status=stream.value,
        firing=firing,
        version=3,
        last_sent_at=sent,
        ttl=2_000_000_000,
    )


def observation(count: int) -> AlertObservation:
    return AlertObservation(
        pk="ALERT#cloud-infra",
        sk="OBSERVATION#x",
        scope="cloud-infra",
        count=count,
        first_observed_at=T0,
        last_observed_at=T0,
        ttl=2_000_000_000,
    )


def actions(outcome) -> list[tuple[str, str, str]]:
    return [(d.action.value, d.severity, d.code) for d in outcome.decisions]


def run(
    reasons: list[Reason],
    states: dict[AlertKey, AlertState] | None = None,
    *,
    at: datetime = T0,
    stream: Stream = Stream.STATE,
    observations: dict[AlertKey, AlertObservation] | None = None,
):
    return decide(
        stream=stream,
        snapshot_at=at,
        reasons=reasons,
        states=states or {},
        observations=observations or {},
        policy=POLICY,
    )


def test_a_new_reason_fires_and_a_normal_snapshot_does_nothing() -> None:
    assert actions(run([reason("FIRE_DETECTED")])) == [("fire", "CRITICAL", "FIRE_DETECTED")]
    assert actions(run([])) == []


@pytest.mark.parametrize(("severity", "cooldown"), [("CRITICAL", 300), ("WARNING", 900)])
def test_cooldown_suppresses_until_it_has_passed(severity: str, cooldown: int) -> None:
    firing = {(severity, "CO_HIGH"): state("CO_HIGH", severity)}
    inside = run([reason("CO_HIGH", severity)], firing, at=T0 + timedelta(seconds=cooldown - 1))
    assert actions(inside) == [("suppressed_cooldown", severity, "CO_HIGH")]
    after = run([reason("CO_HIGH", severity)], firing, at=T0 + timedelta(seconds=cooldown))
    assert actions(after) == [("fire", severity, "CO_HIGH")]


def test_warning_to_critical_escalates_at_once_even_inside_the_warning_cooldown() -> None:
    warned = {("WARNING", "CO_HIGH"): state("CO_HIGH", "WARNING")}
    out = run([reason("CO_HIGH", "CRITICAL")], warned, at=T0 + timedelta(seconds=10))
    assert actions(out) == [("escalate", "CRITICAL", "CO_HIGH")]


def test_a_reason_gone_at_every_severity_resolves_once_for_its_worst_alert() -> None:
    both = {
        ("WARNING", "CO_HIGH"): state("CO_HIGH", "WARNING"),
        ("CRITICAL", "CO_HIGH"): state("CO_HIGH"),
    }
    out = run([], both, at=T0 + timedelta(seconds=30))
    assert actions(out) == [("resolve", "CRITICAL", "CO_HIGH")]
    assert [s.severity for s in out.decisions[0].also_clears] == ["WARNING"]
    # nothing firing: nothing to resolve
    assert actions(run([], {("CRITICAL", "CO_HIGH"): state("CO_HIGH", firing=False)})) == []


def test_critical_dropping_to_warning_clears_quietly_and_the_warning_speaks() -> None:
    firing = {("CRITICAL", "CO_HIGH"): state("CO_HIGH")}
    out = run([reason("CO_HIGH", "WARNING")], firing, at=T0 + timedelta(seconds=30))
    assert sorted(actions(out)) == [
        ("downgraded", "CRITICAL", "CO_HIGH"),
        ("fire", "WARNING", "CO_HIGH"),
    ]


def test_a_warning_under_a_firing_critical_is_left_alone() -> None:
    both = {
        ("WARNING", "CO_HIGH"): state("CO_HIGH", "WARNING"),
        ("CRITICAL", "CO_HIGH"): state("CO_HIGH"),
    }
    out = run([reason("CO_HIGH", "CRITICAL")], both, at=T0 + timedelta(seconds=30))
    assert actions(out) == [("suppressed_cooldown", "CRITICAL", "CO_HIGH")]


def test_cloud_warning_needs_three_consecutive_observations_and_critical_fires_at_once() -> None:
    key: AlertKey = ("WARNING", "CONSUMER_LAG")
    first = run([reason("CONSUMER_LAG", "WARNING")], stream=Stream.FAST)
    assert actions(first) == [
        ("waiting_observations", "WARNING", "CONSUMER_LAG")
    ] and first.observed == {key: 1}
    second = run(
        [reason("CONSUMER_LAG", "WARNING")], stream=Stream.FAST, observations={key: observation(1)}
    )
    assert actions(second)[0][0] == "waiting_observations" and second.observed == {key: 2}
    third = run(
        [reason("CONSUMER_LAG", "WARNING")], stream=Stream.FAST, observations={key: observation(2)}
    )
    assert actions(third) == [("fire", "WARNING", "CONSUMER_LAG")] and third.observed == {key: 3}
    # a run without it resets the count
    assert run([], stream=Stream.FAST, observations={key: observation(2)}).reset == [key]
    assert actions(run([reason("SERVICE_DOWN")], stream=Stream.FAST)) == [
        ("fire", "CRITICAL", "SERVICE_DOWN")
    ]
    # factory warnings need no observations (without a ``state_warning_for``)
    assert actions(run([reason("CO_HIGH", "WARNING")])) == [("fire", "WARNING", "CO_HIGH")]


def test_a_factory_warning_fires_once_reported_for_its_for_and_a_flicker_never_does() -> None:
    policy = Policy(state_warning_for=timedelta(seconds=10))
    key: AlertKey = ("WARNING", "NO_HELMET_DETECTED")
    helmet = [reason("NO_HELMET_DETECTED", "WARNING")]

    def at(
        seconds: float,
        reasons: list[Reason],
        seen_since: float | None,
        states: dict[AlertKey, AlertState] | None = None,
    ):
        seen = {} if seen_since is None else {key: observed_at(T0 + timedelta(seconds=seen_since))}
        return decide(
            stream=Stream.STATE,
            snapshot_at=T0 + timedelta(seconds=seconds),
            reasons=reasons,
            states=states or {},
            observations=seen,
            policy=policy,
        )

    first = at(0, helmet, None)
    assert actions(first) == [("waiting_observations", "WARNING", "NO_HELMET_DETECTED")]
    assert first.observed == {key: 1}
    assert "reported for 0 s of 10 s" in first.decisions[0].why
    assert at(1, [], 0).reset == [key]  # one frame, then gone: nothing sent, counting starts over
    assert actions(at(9.9, helmet, 0))[0][0] == "waiting_observations"
    assert actions(at(10, helmet, 0)) == [("fire", "WARNING", "NO_HELMET_DETECTED")]
    # once firing it is the cooldown that speaks, and a CRITICAL never waits
    firing = {key: state("NO_HELMET_DETECTED", "WARNING", sent=T0 + timedelta(seconds=10))}
    assert actions(at(11, helmet, 0, states=firing))[0][0] == "suppressed_cooldown"
    assert actions(at(0, [reason("FIRE_DETECTED")], None)) == [
        ("fire", "CRITICAL", "FIRE_DETECTED")
    ]


def observed_at(first: datetime) -> AlertObservation:
    return AlertObservation(
        pk="ALERT#factory-a",
        sk="OBSERVATION#WARNING#NO_HELMET_DETECTED#STATE",
        scope="factory-a",
        count=1,
        first_observed_at=first,
        last_observed_at=first,
        ttl=2_000_000_000,
    )


def test_several_reasons_with_one_code_make_one_alert() -> None:
    out = run(
        [
            reason("SERVICE_DOWN", source="service:processor"),
            reason("SERVICE_DOWN", source="service:ingest"),
        ],
        stream=Stream.FAST,
    )
    assert (
        actions(out) == [("fire", "CRITICAL", "SERVICE_DOWN")]
        and len(out.decisions[0].reasons) == 2
    )


@pytest.mark.parametrize(
    ("key", "hit"),
    [
        (
            "processed/factory-a/state_snapshot/yyyy=2026/mm=11/dd=30/hh=03/2026-11-30T03:00:00.000Z.json",
            True,
        ),
        (
            "processed/cloud_infra/fast/yyyy=2026/mm=11/dd=30/hh=03/2026-11-30T03:00:00.000Z.json",
            True,
        ),
        (
            "processed/cloud_infra/slow/yyyy=2026/mm=11/dd=30/hh=03/2026-11-30T03:00:00.000Z.json",
            True,
        ),
        ("processed/factory-a/risk_score/yyyy=2026/mm=11/dd=30/hh=03/m-00000001.json", False),
        ("processed_agg/factory-a/metrics_5m/yyyy=2026/mm=11/dd=30/hh=03/mm=00.json", False),
        ("processed/factory-a/state_snapshot", False),
        ("raw/factory-a/factory_state/yyyy=2026/mm=11/dd=30/m-00000001.json", False),
    ],
)
def test_only_trigger_prefixes_count(key: str, hit: bool) -> None:
    assert (
        triggered(
            key,
            (
                "processed/*/state_snapshot/",
                "processed/cloud_infra/fast/",
                "processed/cloud_infra/slow/",
            ),
        )
        is hit
    )


def test_the_slack_message_names_factory_severity_values_times_and_link() -> None:
    fire = reason("FIRE_DETECTED", value=0.93, threshold=0.8, source="cam-1")
    msg = AlertMessage(
        "factory-b",
        Stream.STATE,
        T0,
        (AlertEntry(Action.FIRE, "CRITICAL", "FIRE_DETECTED", (fire,)),),
    )
    payload = msg.payload("https://aegis.example.com/")
    text = str(payload)
    assert "CRITICAL · factory-b · FIRE_DETECTED" in payload["text"]
    assert "2026-11-30 12:00:00 KST" in text and "2026-11-30 03:00:00 UTC" in text
    assert "measured 0.93, threshold 0.8" in text
    button = payload["blocks"][3]["elements"][0]
    assert button["url"] == "https://aegis.example.com/factories/factory-b"
    resolved = AlertMessage(
        "cloud-infra", Stream.FAST, T0, (AlertEntry(Action.RESOLVE, "CRITICAL", "SERVICE_DOWN"),)
    )
    assert resolved.payload("http://x")["blocks"][3]["elements"][0]["url"] == "http://x/cloud"
    assert "RESOLVED" in resolved.payload("http://x")["text"]
    assert dashboard_link("http://x", "factory-a") == "http://x/factories/factory-a"


def test_mrkdwn_in_details_is_escaped() -> None:
    line = reason_line(Reason(code="X_Y", severity="WARNING", detail="<!channel> & co"))
    assert "&lt;!channel&gt; &amp; co" in line and "<!channel>" not in line


def test_one_message_lists_every_alert_of_a_decision_worst_first() -> None:
    gas = reason("CO_HIGH", "WARNING", value=60, threshold=50)
    fire = reason("FIRE_DETECTED", value=0.93)
    gone = AlertEntry(Action.RESOLVE, "WARNING", "NOISE_HIGH")
    msg = AlertMessage(
        "factory-b",
        Stream.STATE,
        T0,
        (
            gone,
            AlertEntry(Action.FIRE, "WARNING", "CO_HIGH", (gas,)),
            AlertEntry(Action.FIRE, "CRITICAL", "FIRE_DETECTED", (fire,)),
        ),
        attempt_id="abc123",
    )
    payload = msg.payload("http://x")
    assert payload["text"].startswith(
        ":red_circle: AEGIS CRITICAL · factory-b · FIRE_DETECTED, CO_HIGH, NOISE_HIGH at "
    )
    body = payload["blocks"][2]["text"]["text"]
    assert body.index("FIRE_DETECTED") < body.index("CO_HIGH") < body.index("NOISE_HIGH")
    assert "*NOISE_HIGH* (WARNING) is no longer reported." in body
    context = payload["blocks"][4]["elements"][0]["text"]
    assert "`WARNING#CO_HIGH#STATE`" in context and "alert id `abc123`" in context


def test_the_send_lease_stays_inside_the_ack_wait() -> None:
    assert DispatcherSettings().send_lease_s == 120
    assert DispatcherSettings(alert_ack_wait_s=3).send_lease_s == pytest.approx(2.4)
    assert DispatcherSettings(alert_ack_wait_s=3, alert_send_lease_s=1).send_lease_s == 1
    with pytest.raises(ValueError, match="AEGIS_ALERT_SEND_LEASE_S"):
        DispatcherSettings(alert_ack_wait_s=3, alert_send_lease_s=3)


def test_the_consumer_settings_are_the_dispatchers_own_and_the_old_names_still_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AEGIS_ALERT_ACK_WAIT_S", "200")
    monkeypatch.setenv("AEGIS_PROCESSOR_ACK_WAIT_S", "7")  # another service's: not read here
    assert DispatcherSettings().alert_ack_wait_s == 200
    monkeypatch.delenv("AEGIS_ALERT_ACK_WAIT_S")
    monkeypatch.setenv("AEGIS_ACK_WAIT_S", "100")  # deprecated, for one release
    monkeypatch.setenv("AEGIS_MAX_DELIVER", "9")
    settings = DispatcherSettings()
    assert (settings.alert_ack_wait_s, settings.alert_max_deliver) == (100, 9)
