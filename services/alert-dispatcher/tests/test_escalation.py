"""Escalation policies: the file (packaged default, schema, references, receiver validation),
routing, the timeline (escalate, repeat, late wake-up, acknowledgement, policy change) and the
receivers on failure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from aegis_alert_dispatcher.escalation import (
    EscalationConfig,
    EscalationError,
    Level,
    Policy,
    Step,
    StepKind,
    Update,
    dead_lettered,
    due_levels,
    failover,
    fallback_for,
    format_duration,
    load_escalation,
    next_step,
    parse_duration,
    parse_escalation,
    policy_for,
    rebase,
    update_receivers,
)

T0 = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
M = timedelta(minutes=1)

HEAD = """
[receivers.slack]
type = "slack_webhook"
url_env = "AEGIS_SLACK_WEBHOOK_URL"

[receivers.pager]
type = "pagerduty"
routing_key_env = "AEGIS_PD_KEY"

[receivers.sns]
type = "sns"
"""

POLICIES = """
[policies.loud]
fallback = "sns"
[[policies.loud.levels]]
after = "0s"
receivers = ["slack"]
[[policies.loud.levels]]
after = "5m"
receivers = ["pager"]
repeat = "10m"

[policies.quiet]
resolve_notify = false
[[policies.quiet.levels]]
after = "0s"
receivers = ["slack"]
"""

TAIL = """
[defaults]
critical = "loud"
warning = "quiet"
"""


def config(extra: str = "") -> EscalationConfig:
    return parse_escalation(HEAD + POLICIES + TAIL + extra)


def policy(
    *levels: tuple[int, tuple[str, ...], int | None], fallback: tuple[str, ...] = ()
) -> Policy:
    """A policy from (after minutes, receivers, repeat minutes) rows."""
    return Policy(
        name="p",
        levels=tuple(
            Level(
                after=timedelta(minutes=after),
                receivers=receivers,
                repeat=None if repeat is None else timedelta(minutes=repeat),
            )
            for after, receivers, repeat in levels
        ),
        fallback=fallback,
    )


def step_at(
    p: Policy,
    now: datetime,
    *,
    level: int | None,
    last: datetime | None,
    ack: bool = False,
    resolved: bool = False,
    base: datetime = T0,
) -> Step | None:
    """:func:`next_step` for an incident triggered at ``base``."""
    return next_step(
        p,
        triggered_at=base,
        level_reached=level,
        last_notified_at=last,
        acknowledged=ack,
        resolved=resolved,
        now=now,
    )


# -- the file ----------------------------------------------------------------------------------


def test_packaged_default() -> None:
    cfg = load_escalation()
    assert cfg.receivers == {
        "slack": {"type": "slack_webhook", "url_env": "AEGIS_SLACK_WEBHOOK_URL"}
    }
    critical = policy_for(cfg, "factory-a", "CRITICAL")
    assert critical.name == "critical"
    assert [(lv.after, lv.receivers, lv.repeat) for lv in critical.levels] == [
        (timedelta(0), ("slack",), None),
        (5 * M, ("slack",), 30 * M),
    ]
    warning = policy_for(cfg, "cloud-infra", "WARNING")
    assert warning.name == "warning"
    assert [(lv.after, lv.receivers, lv.repeat) for lv in warning.levels] == [
        (timedelta(0), ("slack",), None)
    ]
    assert (critical.resolve_notify, critical.ack_notify, fallback_for(critical)) == (
        True,
        True,
        [],
    )
    # the second CRITICAL post is an escalation, then reminders; the WARNING is posted once
    step = step_at(critical, T0, level=0, last=T0)
    assert step is not None and (step.due_at, step.kind, step.receivers) == (
        T0 + 5 * M,
        StepKind.ESCALATE,
        ("slack",),
    )
    assert step_at(warning, T0 + timedelta(days=1), level=0, last=T0) is None


def test_load_from_a_path(tmp_path: Path) -> None:
    path = tmp_path / "e.toml"
    path.write_text(HEAD + POLICIES + TAIL)
    cfg = load_escalation(path)
    assert sorted(cfg.policies) == ["loud", "quiet"]
    assert cfg.policies["loud"].fallback == ("sns",)  # a single name is a list of one
    assert cfg.policies["quiet"].resolve_notify is False


def test_missing_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(EscalationError, match=r"absent\.toml: cannot read escalation file"):
        load_escalation(tmp_path / "absent.toml")


def test_invalid_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(HEAD + POLICIES)
    with pytest.raises(EscalationError, match=r"bad\.toml: defaults: Field required"):
        load_escalation(path)


def level(after: str, receivers: str = '["slack"]', extra: str = "", name: str = "x") -> str:
    return f'[[policies.{name}.levels]]\nafter = "{after}"\nreceivers = {receivers}\n{extra}\n'


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        # TOML itself
        ("[defaults", "not TOML"),
        # unknown keys, at every depth
        ("surprise = 1", r"surprise: Extra inputs are not permitted"),
        ("[policies.x]\nescalate = true\n" + level("0s"), r"policies\.x\.escalate: Extra inputs"),
        (
            "[policies.x]\n" + level("0s", extra="when = 'now'"),
            r"policies\.x\.levels\[0\]\.when: Extra inputs",
        ),
        (
            "[[routes]]\nfactories = ['a']\ncritical = 'loud'\nfactory = 'b'",
            r"routes\[0\]\.factory",
        ),
        ("[policies.x]\nname = 'y'\n" + level("0s"), "the name is the table's"),
        # durations
        ("[policies.x]\n" + level("5"), r"policies\.x\.levels\[0\]\.after: '5' is not a duration"),
        ("[policies.x]\n" + level("5 minutes"), "is not a duration"),
        ("[policies.x]\n" + level("-5m"), "is not a duration"),
        ("[policies.x]\n" + level("m"), "is not a duration"),
        ("[policies.x]\n" + level("8d"), "longer than 7d"),
        ("[policies.x]\n[[policies.x.levels]]\nafter = 0\nreceivers = ['slack']", "a string"),
        ("[policies.x]\n" + level("0s", extra='repeat = "10s"'), "repeat must be at least 1m"),
        # the timeline
        ("[policies.x]\n" + level("1m"), r"levels\[0\]\.after must be '0s'"),
        (
            "[policies.x]\n" + level("0s") + level("5m") + level("5m"),
            r"levels\[2\]\.after \(5m\) must be later than levels\[1\]\.after \(5m\)",
        ),
        ("[policies.x]\n" + level("0s") + level("10m") + level("5m"), "must be later"),
        ("[policies.x]\nfallback = 'slack'\n", r"policies\.x\.levels: Field required"),
        ("[policies.x]\nlevels = []\n", r"policies\.x\.levels: .*at least 1 item"),
        ("[policies.x]\n" + level("0s", "[]"), r"levels\[0\]\.receivers: .*at least 1 item"),
        ("[policies.x]\n" + level("0s", '["slack", "slack"]'), "named twice"),
        # references
        (
            "[policies.x]\n" + level("0s", '["slak"]'),
            r"policies\.x\.levels\[0\]\.receivers: unknown receiver 'slak' \(defined: pager, slack, sns\)",
        ),
        (
            "[policies.x]\nfallback = ['nope']\n" + level("0s"),
            r"policies\.x\.fallback: unknown receiver 'nope'",
        ),
        (
            "[[routes]]\nfactories = ['a-*']\ncritical = 'lod'",
            r"routes\[0\]\.critical: unknown policy 'lod'",
        ),
        ("[[routes]]\nfactories = ['a-*']", r"routes\[0\]: a route sets critical, warning or both"),
        ("[[routes]]\nfactories = []\nwarning = 'quiet'", r"routes\[0\]\.factories: .*at least 1"),
        # receivers and names
        ("[receivers.email]\nto = 'x@example.com'", r"receivers\.email\.type: required"),
        ("[receivers.email]\ntype = 3", r"receivers\.email\.type: required"),
        ("[receivers.Email]\ntype = 'smtp'", r"receivers\.Email: invalid name"),
        ("[policies.X]\n" + level("0s", name="X"), r"policies\.X: invalid name"),
    ],
)
def test_invalid_files_are_refused_with_the_place(extra: str, fragment: str) -> None:
    with pytest.raises(EscalationError, match=rf"^<escalation>: .*{fragment}"):
        config(extra)


def test_defaults_must_name_defined_policies() -> None:
    text = HEAD + POLICIES + '[defaults]\ncritical = "loud"\nwarning = "gentle"\n'
    with pytest.raises(EscalationError, match=r"defaults\.warning: unknown policy 'gentle'"):
        parse_escalation(text, source="mine.toml")


def test_every_problem_is_listed_at_once() -> None:
    with pytest.raises(EscalationError) as err:
        config("[policies.x]\nfallback = ['a']\n" + level("0s", '["b"]'))
    assert "unknown receiver 'b'" in str(err.value) and "unknown receiver 'a'" in str(err.value)


class _SlackWebhook(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: str
    url_env: str


def _typed(name: str, table: dict[str, Any]) -> None:
    if table["type"] == "slack_webhook":
        _SlackWebhook.model_validate(table)
    elif table["type"] not in {"pagerduty", "sns"}:
        raise ValueError(f"unknown receiver type {table['type']!r}")


def test_receiver_validation_plugs_in() -> None:
    seen: list[str] = []

    def record(name: str, table: dict[str, Any]) -> None:
        seen.append(name)
        _typed(name, table)

    parse_escalation(HEAD + POLICIES + TAIL, validate_receiver=record)
    assert sorted(seen) == ["pager", "slack", "sns"]
    bad = HEAD.replace('url_env = "AEGIS_SLACK_WEBHOOK_URL"', 'url = "https://hooks"')
    with pytest.raises(
        EscalationError, match=r"receivers\.slack: url_env: Field required; url: Extra"
    ):
        parse_escalation(bad + POLICIES + TAIL, validate_receiver=_typed)
    odd = HEAD + '[receivers.fax]\ntype = "fax"\n'
    with pytest.raises(EscalationError, match=r"receivers\.fax: unknown receiver type 'fax'"):
        parse_escalation(odd + POLICIES + TAIL, validate_receiver=_typed)
    # without a validator, any type is kept as written
    assert parse_escalation(odd + POLICIES + TAIL).receivers["fax"] == {"type": "fax"}


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0s", timedelta(0)),
        ("90s", timedelta(seconds=90)),
        ("5m", 5 * M),
        ("1h30m", 90 * M),
        ("2d", timedelta(days=2)),
        ("1d2h3m4s", timedelta(days=1, hours=2, minutes=3, seconds=4)),
        (" 5m ", 5 * M),
        ("7d", timedelta(days=7)),
    ],
)
def test_durations(text: str, value: timedelta) -> None:
    assert parse_duration(text) == value


@pytest.mark.parametrize(
    "text", ["", "5", "m", "5M", "1m1h", "1.5h", "-1s", "1w", "9999999d", "5 m"]
)
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match=r"duration|longer"):
        parse_duration(text)


@given(st.integers(min_value=0, max_value=7 * 86400))
def test_duration_text_round_trips(seconds: int) -> None:
    value = timedelta(seconds=seconds)
    assert parse_duration(format_duration(value)) == value


# -- routing -----------------------------------------------------------------------------------

ROUTES = """
[policies.plant_a]
[[policies.plant_a.levels]]
after = "0s"
receivers = ["pager"]

[[routes]]
factories = ["plant-a-*", "plant-b-1"]
critical = "plant_a"

[[routes]]
factories = ["plant-*"]
warning = "loud"
critical = "quiet"

[[routes]]
factories = ["cloud-infra"]
warning = "plant_a"
"""


@pytest.mark.parametrize(
    ("scope", "severity", "name"),
    [
        ("plant-a-7", "CRITICAL", "plant_a"),  # first route
        ("plant-b-1", "CRITICAL", "plant_a"),  # its second pattern
        ("plant-a-7", "WARNING", "loud"),  # the first route names no WARNING policy: the next
        ("plant-b-2", "CRITICAL", "quiet"),  # second route
        ("plant-b-2", "WARNING", "loud"),
        ("cloud-infra", "WARNING", "plant_a"),
        ("cloud-infra", "CRITICAL", "loud"),  # no route for it: the default
        ("factory-a", "CRITICAL", "loud"),
        ("factory-a", "WARNING", "quiet"),
        ("PLANT-A-7", "CRITICAL", "loud"),  # patterns are case-sensitive
    ],
)
def test_policy_for(scope: str, severity: str, name: str) -> None:
    assert policy_for(config(ROUTES), scope, severity).name == name  # type: ignore[arg-type]


def test_a_star_route_covers_the_cloud_scope() -> None:
    cfg = config("[[routes]]\nfactories = ['*']\nwarning = 'loud'")
    assert policy_for(cfg, "cloud-infra", "WARNING").name == "loud"


# -- the timeline ------------------------------------------------------------------------------

LADDER = policy(
    (0, ("slack",), None),
    (5, ("pager",), None),
    (15, ("pager", "manager"), None),
    (30, ("director",), 60),
)


def brief(step: Step | None) -> tuple[object, ...] | None:
    if step is None:
        return None
    return ((step.due_at - T0) / M, step.level, step.kind.value, step.receivers, step.skipped)


@pytest.mark.parametrize(
    ("now", "level", "last", "expected"),
    [
        # nothing sent yet: level 0 at once
        (0, None, None, (0, 0, "notify", ("slack",), ())),
        # nothing sent yet, and late: one first notification up to the highest due level
        (6, None, None, (5, 1, "notify", ("slack", "pager"), (0,))),
        # on time: one level after the other
        (0, 0, 0, (5, 1, "escalate", ("pager",), ())),
        (5, 1, 5, (15, 2, "escalate", ("pager", "manager"), ())),
        (15, 2, 15, (30, 3, "escalate", ("director",), ())),
        # the last level repeats every hour from its last notification
        (30, 3, 30, (90, 3, "renotify", ("director",), ())),
        (95, 3, 90, (150, 3, "renotify", ("director",), ())),
        # woke late: one step, the highest due level, with the receivers of those jumped over
        (16, 0, 0, (15, 2, "escalate", ("pager", "manager"), (1,))),
        (600, 0, 0, (30, 3, "escalate", ("pager", "manager", "director"), (1, 2))),
        (600, 1, 5, (30, 3, "escalate", ("pager", "manager", "director"), (2,))),
        # a late repeat is one message, however many periods were missed
        (600, 3, 30, (90, 3, "renotify", ("director",), ())),
        # a level beyond the policy's (it changed) counts as its last
        (40, 9, 40, (100, 3, "renotify", ("director",), ())),
    ],
)
def test_next_step(
    now: int, level: int | None, last: int | None, expected: tuple[object, ...]
) -> None:
    step = step_at(LADDER, T0 + now * M, level=level, last=None if last is None else T0 + last * M)
    assert brief(step) == expected


@pytest.mark.parametrize(("ack", "resolved"), [(True, False), (False, True), (True, True)])
def test_nothing_after_acknowledge_or_resolve(ack: bool, resolved: bool) -> None:
    for level in (None, 0, 3):
        assert (
            step_at(LADDER, T0 + 600 * M, level=level, last=T0, ack=ack, resolved=resolved) is None
        )


def test_after_the_last_level_without_repeat_nothing() -> None:
    p = policy((0, ("slack",), None), (5, ("pager",), None))
    assert step_at(p, T0 + 5 * M, level=1, last=T0 + 5 * M) is None
    assert step_at(p, T0 + 9999 * M, level=1, last=T0 + 5 * M) is None


@pytest.mark.parametrize(
    ("now", "last", "expected"),
    [
        # level 0 repeats every 2 minutes until level 1 at 5
        (0, 0, (2, 0, "renotify", ("slack",), ())),
        (2, 2, (4, 0, "renotify", ("slack",), ())),
        # the repeat at 6 would come after the escalation at 5: the escalation first
        (4, 4, (5, 1, "escalate", ("pager",), ())),
        # both overdue (woke late): the escalation, not the repeat
        (7, 2, (5, 1, "escalate", ("pager",), ())),
    ],
)
def test_repeat_until_the_next_level(now: int, last: int, expected: tuple[object, ...]) -> None:
    p = policy((0, ("slack",), 2), (5, ("pager",), None))
    assert brief(step_at(p, T0 + now * M, level=0, last=T0 + last * M)) == expected


def test_an_overdue_repeat_comes_before_a_future_escalation() -> None:
    p = policy((0, ("slack",), 2), (50, ("pager",), None))
    assert brief(step_at(p, T0 + 9 * M, level=0, last=T0 + 4 * M)) == (
        6,
        0,
        "renotify",
        ("slack",),
        (),
    )


def test_repeat_without_a_recorded_notification_counts_from_the_level() -> None:
    p = policy((0, ("slack",), None), (5, ("pager",), 10))
    assert brief(step_at(p, T0 + 5 * M, level=1, last=None)) == (15, 1, "renotify", ("pager",), ())


@pytest.mark.parametrize(
    ("now", "level", "expected"),
    [
        (0, None, (0,)),
        (4, 0, ()),
        (5, 0, (1,)),
        (29, 0, (1, 2)),
        (30, 0, (1, 2, 3)),
        (30, 2, (3,)),
        (999, 3, ()),
    ],
)
def test_due_levels(now: int, level: int | None, expected: tuple[int, ...]) -> None:
    assert due_levels(LADDER, triggered_at=T0, level_reached=level, now=T0 + now * M) == expected


# -- a policy change: WARNING -> CRITICAL ------------------------------------------------------


def test_rebase_keeps_the_level_and_restarts_the_timers() -> None:
    critical = policy(
        (0, ("slack", "pager"), None), (5, ("manager",), None), (20, ("director",), 30)
    )
    at = T0 + 40 * M  # a WARNING at level 1 of its own policy becomes CRITICAL 40 minutes in
    moved = rebase(critical, level_reached=1, at=at)
    # at once: everybody up to the kept level, as if it had been CRITICAL all along
    assert (moved.level, moved.step.kind, moved.step.receivers, moved.step.due_at) == (
        1,
        StepKind.ESCALATE,
        ("slack", "pager", "manager"),
        at,
    )
    assert moved.triggered_at == at - 5 * M
    # then the next level after the new policy's own gap (20 - 5 minutes)
    nxt = step_at(critical, at, level=moved.level, last=at, base=moved.triggered_at)
    assert nxt is not None and (nxt.level, nxt.due_at, nxt.receivers) == (
        2,
        at + 15 * M,
        ("director",),
    )


@pytest.mark.parametrize(("reached", "kept"), [(None, 0), (0, 0), (1, 1), (7, 2)])
def test_rebase_clamps_the_level(reached: int | None, kept: int) -> None:
    moved = rebase(
        LADDER.model_copy(update={"levels": LADDER.levels[:3]}), level_reached=reached, at=T0
    )
    assert moved.level == kept
    assert moved.step.skipped == tuple(range(kept))


# -- updates and failures ----------------------------------------------------------------------


def test_update_receivers() -> None:
    assert update_receivers(LADDER, level_reached=2, update=Update.RESOLVED) == [
        "slack",
        "pager",
        "manager",
    ]
    assert update_receivers(LADDER, level_reached=0, update=Update.ACKNOWLEDGED) == ["slack"]
    assert update_receivers(LADDER, level_reached=None, update=Update.RESOLVED) == []
    quiet = LADDER.model_copy(update={"resolve_notify": False})
    assert update_receivers(quiet, level_reached=3, update=Update.RESOLVED) == []
    assert update_receivers(quiet, level_reached=0, update=Update.ACKNOWLEDGED) == ["slack"]
    no_ack = LADDER.model_copy(update={"ack_notify": False})
    assert update_receivers(no_ack, level_reached=3, update=Update.ACKNOWLEDGED) == []


@pytest.mark.parametrize(
    ("failed", "next_try", "dead"),
    [
        ((), ["sns", "webhook"], False),
        (("slack",), ["sns", "webhook"], False),
        (("slack", "sns"), ["webhook"], False),
        # every fallback failed: the policy's other receivers before a dead letter
        (("slack", "sns", "webhook"), ["pager"], False),
        (("slack", "sns", "webhook", "pager"), [], True),
    ],
)
def test_failover_and_dead_letter(failed: tuple[str, ...], next_try: list[str], dead: bool) -> None:
    p = policy((0, ("slack",), None), (5, ("pager", "slack"), None), fallback=("sns", "webhook"))
    assert fallback_for(p) == ["sns", "webhook"]
    assert p.receivers == ["slack", "pager", "sns", "webhook"]
    assert failover(p, failed=failed) == next_try
    assert dead_lettered(p, failed=failed) is dead


def test_without_fallback_the_other_levels_are_tried() -> None:
    p = policy((0, ("slack",), None), (5, ("pager",), None))
    assert fallback_for(p) == []
    assert failover(p, failed={"slack"}) == ["pager"]
    assert dead_lettered(p, failed={"slack", "pager", "unrelated"})


# -- properties of the timeline ----------------------------------------------------------------


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    count = draw(st.integers(min_value=1, max_value=5))
    gaps = draw(st.lists(st.integers(1, 120), min_size=count - 1, max_size=count - 1))
    afters = [0]
    for gap in gaps:
        afters.append(afters[-1] + gap)
    rows = [
        (
            after,
            (f"r{i}", *draw(st.sets(st.sampled_from(["a", "b"])))),
            draw(st.none() | st.integers(1, 90)),
        )
        for i, after in enumerate(afters)
    ]
    return policy(*rows)


@settings(max_examples=200, deadline=None)
@given(policies(), st.lists(st.integers(0, 240), min_size=1, max_size=30))
def test_a_dispatcher_that_wakes_at_any_times(p: Policy, wakes: list[int]) -> None:
    """Whatever the wake-up times: levels never go down, each is reached at most once and never
    before its time, a repeat never comes before its period, and one wake-up sends one step."""
    level: int | None = None
    last: datetime | None = None
    reached: list[int] = []
    for minute in sorted(wakes):
        now = T0 + minute * M
        step = step_at(p, now, level=level, last=last)
        if step is None:
            assert level == len(p.levels) - 1 and p.levels[-1].repeat is None
            continue
        if step.due_at > now:
            continue  # not yet: the dispatcher sleeps until due_at
        assert step.level >= (level or 0)
        if step.kind is StepKind.RENOTIFY:
            assert level == step.level and last is not None
            repeat = p.levels[step.level].repeat
            assert repeat is not None and now - last >= repeat
        else:
            assert T0 + p.levels[step.level].after <= now
            assert step.level not in reached
            # the highest level due: nothing due is left behind
            assert due_levels(p, triggered_at=T0, level_reached=step.level, now=now) == ()
            covered = {r for i in (*step.skipped, step.level) for r in p.levels[i].receivers}
            assert set(step.receivers) == covered and len(step.receivers) == len(covered)
            reached.append(step.level)
        level, last = step.level, now
        # the step sent, the same wake-up owes nothing more
        again = step_at(p, now, level=level, last=last)
        assert again is None or again.due_at > now
