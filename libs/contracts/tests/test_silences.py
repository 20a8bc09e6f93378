"""Silences: matchers (parsing, operators, regexes), the active window, the guard on new silences,
and the notification owed when a silence ends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from aegis_contracts.silences import (
    Label,
    Matcher,
    MatcherError,
    Op,
    Silence,
    SilenceRefused,
    active_silences,
    check_new_silence,
    could_cover_critical,
    covers,
    end_early,
    ended_between,
    labels_of,
    matches_everything,
    notification_owed,
    silenced_by,
)

T0 = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
H = timedelta(hours=1)
M = timedelta(minutes=1)

FIRE_A1 = labels_of(scope="plant-a-1", reason="FIRE_DETECTED", severity="CRITICAL", source="STATE")
CO_A2 = labels_of(scope="plant-a-2", reason="CO_HIGH", severity="WARNING", source="STATE")
CLOUD = labels_of(
    scope="cloud-infra", reason="PIPELINE_STAGE_DOWN", severity="CRITICAL", source="FAST"
)


def silence(*matchers: str, start: datetime = T0, end: datetime = T0 + H, **kw: Any) -> Silence:
    fields: dict[str, Any] = {
        "id": "s1",
        "matchers": matchers,
        "starts_at": start,
        "ends_at": end,
        "created_by": "kim",
        "reason": "maintenance of line 3",
        "created_at": start,
        **kw,
    }
    return Silence.model_validate(fields)


# -- matchers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "field", "op", "value"),
    [
        ("factory=~plant-a-.*", Label.FACTORY, Op.RE, "plant-a-.*"),
        ("factory=plant-a-1", Label.FACTORY, Op.EQ, "plant-a-1"),
        ("severity!=CRITICAL", Label.SEVERITY, Op.NE, "CRITICAL"),
        ("reason!~CO_.*", Label.REASON, Op.NRE, "CO_.*"),
        (" source = STATE ", Label.SOURCE, Op.EQ, "STATE"),
        ('reason="CO HIGH"', Label.REASON, Op.EQ, "CO HIGH"),
        ('reason=" padded "', Label.REASON, Op.EQ, " padded "),
        ("reason=", Label.REASON, Op.EQ, ""),
        ("factory=a=b", Label.FACTORY, Op.EQ, "a=b"),
        ("factory=~a|b", Label.FACTORY, Op.RE, "a|b"),
        ("factory==x", Label.FACTORY, Op.EQ, "=x"),
        ('factory="~x"', Label.FACTORY, Op.EQ, "~x"),  # unquoted, "=~x" would be a regex
    ],
)
def test_parse(text: str, field: Label, op: Op, value: str) -> None:
    m = Matcher.parse(text)
    assert (m.field, m.op, m.value) == (field, op, value)
    assert Matcher.parse(str(m)) == m


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("factory", "is not a matcher like 'factory=~plant-a-.*'"),
        ("", "is not a matcher"),
        ("=~x", "is not a matcher"),
        ("plant=x", "no label 'plant' \\(one of factory, reason, severity, source\\)"),
        ("factory=~(", "factory=~\\(: invalid regular expression: missing \\)"),
        ("reason!~[a-", "invalid regular expression"),
        ("reason=~[[A]", "invalid regular expression: Possible nested set"),
        ("severity=critical", "severity is WARNING or CRITICAL"),
        ("severity!=INFO", "severity is WARNING or CRITICAL"),
        ("factory=~" + "a" * 257, "at most 256 characters"),
    ],
)
def test_parse_refuses_clearly(text: str, fragment: str) -> None:
    with pytest.raises(MatcherError, match=fragment):
        Matcher.parse(text)


@pytest.mark.parametrize(
    ("matcher", "value", "expected"),
    [
        ("factory=plant-a-1", "plant-a-1", True),
        ("factory=plant-a-1", "plant-a-10", False),
        ("factory!=plant-a-1", "plant-a-1", False),
        ("factory!=plant-a-1", "plant-b-1", True),
        # a regex matches the whole value, never a part of it
        ("factory=~plant-a", "plant-a-1", False),
        ("factory=~plant-a-.*", "plant-a-1", True),
        ("factory=~plant-a-.*", "xplant-a-1", False),
        ("factory=~a|b", "a", True),
        ("factory=~a|b", "ab", False),
        ("factory!~plant-a-.*", "plant-a-1", False),
        ("factory!~plant-a-.*", "plant-b-1", True),
        # the empty string: a label the incident lacks
        ("factory=", "", True),
        ("factory=~.+", "", False),
        ("factory!~.+", "", True),
        ("factory!=", "x", True),
    ],
)
def test_matches(matcher: str, value: str, expected: bool) -> None:
    assert Matcher.parse(matcher).matches(value) is expected


_values = st.text(st.sampled_from('ab-.*+?|()[]^$\\~=!" '), max_size=8)


@given(st.sampled_from(list(Label)), _values, _values)
def test_negations_are_complements(field: Label, value: str, probe: str) -> None:
    if field is Label.SEVERITY:
        value = "CRITICAL"
    eq = Matcher(field=field, op=Op.EQ, value=value)
    ne = Matcher(field=field, op=Op.NE, value=value)
    assert eq.matches(probe) != ne.matches(probe)
    assert Matcher.parse(str(eq)) == eq and Matcher.parse(str(ne)) == ne
    try:
        regex = Matcher(field=field, op=Op.RE, value=value)
    except ValidationError:
        return  # not a valid regex: refused at once, never matched
    nregex = Matcher(field=field, op=Op.NRE, value=value)
    assert regex.matches(probe) != nregex.matches(probe)
    assert Matcher.parse(str(regex)) == regex


def test_matchers_from_dicts_and_strings() -> None:
    s = silence("factory=plant-a-1", {"field": "reason", "op": "=~", "value": "CO_.*"})  # type: ignore[arg-type]
    assert [str(m) for m in s.matchers] == ["factory=plant-a-1", "reason=~CO_.*"]
    assert Silence.model_validate_json(s.model_dump_json()) == s
    with pytest.raises(ValidationError, match="no label 'plant'"):
        silence("plant=x")


# -- the window and coverage -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("at", "expected"),
    [
        (T0 - timedelta(microseconds=1), False),
        (T0, True),  # starts_at is in
        (T0 + 59 * M, True),
        (T0 + H, False),  # ends_at is out
    ],
)
def test_the_window(at: datetime, expected: bool) -> None:
    s = silence("factory=plant-a-1")
    assert covers(s, FIRE_A1, at) is expected
    assert (active_silences([s], at) == [s]) is expected


@pytest.mark.parametrize(
    ("matchers", "labels", "expected"),
    [
        (("factory=plant-a-1",), FIRE_A1, True),
        (("factory=plant-a-1",), CO_A2, False),
        (("factory=~plant-a-.*", "severity=WARNING"), CO_A2, True),
        (("factory=~plant-a-.*", "severity=WARNING"), FIRE_A1, False),  # every matcher must match
        (("reason=~CO_.*|FIRE_.*",), FIRE_A1, True),
        (("source=FAST",), CLOUD, True),
        (("factory=cloud-infra", "reason=PIPELINE_STAGE_DOWN"), CLOUD, True),
        (("factory!=cloud-infra",), CLOUD, False),
        # a label the incident lacks is the empty string
        (("source=",), {"factory": "plant-a-1"}, True),
        (("source!=",), {"factory": "plant-a-1"}, False),
    ],
)
def test_covers(matchers: tuple[str, ...], labels: dict[str, str], expected: bool) -> None:
    assert covers(silence(*matchers), labels, T0 + M) is expected


def test_silenced_by_lists_the_covering_silences() -> None:
    a = silence("factory=plant-a-1", id="a")
    b = silence("reason=FIRE_DETECTED", id="b", start=T0 + 2 * H, end=T0 + 3 * H)
    c = silence("severity=WARNING", id="c")
    assert silenced_by([a, b, c], FIRE_A1, T0 + M) == [a]
    assert silenced_by([a, b, c], FIRE_A1, T0 + 2 * H) == [b]
    assert silenced_by([a, b, c], CO_A2, T0 + M) == [c]
    assert silenced_by([a, b, c], CO_A2, T0 + 5 * H) == []
    assert active_silences([a, b, c], T0 + M) == [a, c]


def test_ending_early() -> None:
    s = silence("factory=plant-a-1")
    ended = end_early(s, at=T0 + 10 * M, by="lee")
    assert (ended.expired_at, ended.ended_by, ended.ends) == (T0 + 10 * M, "lee", T0 + 10 * M)
    assert covers(ended, FIRE_A1, T0 + 9 * M)
    assert not covers(ended, FIRE_A1, T0 + 10 * M)
    assert s.ends == T0 + H  # the original is unchanged
    with pytest.raises(ValueError, match="already ended"):
        end_early(ended, at=T0 + 11 * M, by="lee")
    with pytest.raises(ValueError, match="already ended"):
        end_early(s, at=T0 + H, by="lee")


def test_ended_between() -> None:
    a = silence("factory=plant-a-1", id="a")  # ends at T0+1h
    b = end_early(silence("factory=plant-a-2", id="b"), at=T0 + 10 * M, by="lee")
    c = silence("factory=plant-a-3", id="c", end=T0 + 2 * H)
    never = end_early(
        silence("factory=x", id="n", start=T0 + H, end=T0 + 2 * H), at=T0 + 5 * M, by="lee"
    )
    every = [a, b, c, never]
    assert ended_between(every, T0, T0 + H) == [a, b]
    assert ended_between(every, T0 + 10 * M, T0 + H) == [a]  # (after, until]
    assert ended_between(every, T0 + H, T0 + 3 * H) == [c]


@pytest.mark.parametrize(
    "fields",
    [
        {"matchers": ()},
        {"created_by": "  "},
        {"starts_at": datetime(2026, 11, 30, 3, 0)},  # naive: no zone
        {"id": ""},
        {"colour": "red"},
    ],
)
def test_a_silence_is_well_formed(fields: dict[str, Any]) -> None:
    base = silence("factory=plant-a-1").model_dump()
    with pytest.raises(ValidationError):
        Silence.model_validate({**base, **fields})


# -- the guard ---------------------------------------------------------------------------------


def refused(s: Silence, *, now: datetime = T0, **kw: Any) -> list[str]:
    try:
        check_new_silence(s, now=now, **kw)
    except SilenceRefused as err:
        return err.problems
    return []


@pytest.mark.parametrize(
    ("matchers", "expected"),
    [
        (("factory=plant-a-1",), True),
        (("severity=CRITICAL", "factory=plant-a-1"), True),
        (("severity=WARNING",), False),
        (("severity!=CRITICAL",), False),
        (("severity!=WARNING",), True),
        (("severity=~WARN.*",), False),
        (("severity=~.*",), True),
        (("severity!~CRIT.*",), False),
        (("severity=~CRITICAL|WARNING",), True),
        (("severity=WARNING", "severity=CRITICAL"), False),  # covers nothing at all
    ],
)
def test_could_cover_critical(matchers: tuple[str, ...], expected: bool) -> None:
    assert could_cover_critical(silence(*matchers)) is expected


@pytest.mark.parametrize(
    ("matchers", "expected"),
    [
        (("factory=~.*",), True),
        (("factory=~.+",), True),
        (("severity=CRITICAL",), True),
        (("source=STATE",), True),
        (("factory!=plant-a-1",), True),  # every factory but one
        (("reason!~FIRE_.*",), True),  # every reason but some
        (("reason!=FIRE_DETECTED",), True),
        (("factory!=cloud-infra",), True),  # every factory
        (("reason=~.*", "factory=~.*"), True),
        (("factory=plant-a-1",), False),
        (("factory=~plant-a-.*",), False),
        (("reason=CO_HIGH",), False),
        (("factory=~.*", "reason=CO_HIGH"), False),
        (("factory!=plant-a-1", "reason=CO_HIGH"), False),
    ],
)
def test_matches_everything(matchers: tuple[str, ...], expected: bool) -> None:
    assert matches_everything(silence(*matchers)) is expected


def test_a_reasonable_silence_passes() -> None:
    assert refused(silence("factory=plant-a-1")) == []
    # starting a moment ago (clock skew) or later is fine
    assert refused(silence("factory=plant-a-1", start=T0 - 4 * M, end=T0 + H)) == []
    assert refused(silence("factory=plant-a-1", start=T0 + 24 * H, end=T0 + 31 * H)) == []
    # WARNING only: no reason needed, any length, even all of them
    quiet = silence("severity=WARNING", reason="", end=T0 + 24 * 7 * H)
    assert refused(quiet) == []


@pytest.mark.parametrize(
    ("s", "fragments"),
    [
        (
            silence("factory=plant-a-1", reason=""),
            [
                "could cover CRITICAL incidents (add severity=WARNING to keep them out): give a reason"
            ],
        ),
        (silence("factory=plant-a-1", reason="   "), ["give a reason"]),
        (silence("factory=plant-a-1", end=T0 + 8 * H + M), ["at most 8 h 0 min, not 8 h 1 min"]),
        (silence("factory=~.*"), ["name the factories or reasons it is for"]),
        (silence("severity=CRITICAL"), ["name the factories or reasons"]),
        (silence("factory!=plant-a-1", "severity!=WARNING"), ["name the factories or reasons"]),
        (silence("factory=plant-a-1", end=T0), ["ends_at must be after starts_at"]),
        (silence("factory=plant-a-1", end=T0 - H), ["ends_at must be after starts_at"]),
        (
            silence("factory=plant-a-1", start=T0 - 3 * H, end=T0 - H),
            ["ends_at is already past", "starts_at is 3 h 0 min ago"],
        ),
        (
            silence("factory=plant-a-1", start=T0 - 6 * M, end=T0 + H),
            ["starts_at is 6 min ago: a silence starts now or later"],
        ),
        # every problem at once
        (
            silence("factory=~.*", reason="", end=T0 + 9 * H),
            ["give a reason", "at most 8 h", "name the factories"],
        ),
    ],
)
def test_the_guard_refuses(s: Silence, fragments: list[str]) -> None:
    problems = refused(s)
    assert len(problems) == len(fragments)
    for problem, fragment in zip(problems, fragments, strict=True):
        assert fragment in problem


def test_the_guard_limits() -> None:
    s = silence("factory=plant-a-1", end=T0 + 2 * H)
    assert refused(s, max_critical=H) == [
        "it could cover CRITICAL incidents (add severity=WARNING to keep them out): "
        "at most 1 h 0 min, not 2 h 0 min"
    ]
    quiet = silence("severity=WARNING", end=T0 + 48 * H)
    assert refused(quiet, max_any=24 * H) == ["it lasts 48 h 0 min, more than 24 h 0 min"]
    assert refused(quiet, max_any=48 * H) == []


def test_the_refusal_says_every_problem() -> None:
    with pytest.raises(SilenceRefused) as err:
        check_new_silence(silence("factory=~.*", reason=""), now=T0)
    assert str(err.value) == "; ".join(err.value.problems) and len(err.value.problems) == 2


def test_the_guard_refuses_no_matchers() -> None:
    bare = Silence.model_construct(**{**silence("factory=x").model_dump(), "matchers": ()})
    assert refused(bare) == ["a silence needs at least one matcher"]


_LABELS = {
    Label.FACTORY: ["plant-a-1", "plant-b-2", "cloud-infra", ""],
    Label.REASON: ["FIRE_DETECTED", "CO_HIGH", "STALE_DATA", ""],
    Label.SEVERITY: ["WARNING", "CRITICAL"],
    Label.SOURCE: ["STATE", "FAST", ""],
}


@st.composite
def matchers(draw: st.DrawFn) -> Matcher:
    field = draw(st.sampled_from(list(Label)))
    op = draw(st.sampled_from(list(Op)))
    if op in (Op.RE, Op.NRE):
        value = draw(
            st.sampled_from([".*", ".+", "plant-a-.*", "CRIT.*", "WARNING", "C.*|F.*", ""])
        )
    else:
        value = draw(
            st.sampled_from(
                _LABELS[field] if field is not Label.SEVERITY else ["WARNING", "CRITICAL"]
            )
        )
    return Matcher(field=field, op=op, value=value)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(matchers(), min_size=1, max_size=4),
    st.sampled_from(["", "fire drill"]),
    st.integers(1, 24 * 60),
    st.fixed_dictionaries({k: st.sampled_from(v) for k, v in _LABELS.items()}),
)
def test_what_the_guard_lets_through_never_hides_critical_unexplained(
    found: list[Matcher], reason: str, minutes: int, labels: dict[str, str]
) -> None:
    """A silence the guard accepts covers a CRITICAL incident only with a reason, for at most 8
    hours, and never every factory and reason alike."""
    s = silence(*(str(m) for m in found), reason=reason, end=T0 + minutes * M)
    if refused(s):
        return
    critical = {**labels, Label.SEVERITY: "CRITICAL"}
    if covers(s, critical, T0):
        assert reason.strip() and minutes <= 8 * 60
        assert not matches_everything(s)


# -- when a silence ends -----------------------------------------------------------------------


def owed(
    silences: list[Silence], at: datetime, since: datetime | None, paid: datetime | None
) -> bool:
    return notification_owed(
        FIRE_A1, silences, at=at, silenced_since=since, notified_after_silence_at=paid
    )


@pytest.mark.parametrize(
    ("at", "since", "paid", "expected"),
    [
        (T0 + 2 * H, None, None, False),  # never held back: nothing owed
        (T0 + 30 * M, T0 + 5 * M, None, False),  # still silenced
        (T0 + H, T0 + 5 * M, None, True),  # the silence ended
        (T0 + 2 * H, T0 + 5 * M, T0 + H, False),  # and the notification went out
        (T0 + 5 * H, T0 + 4 * H, T0 + H, True),  # held back again later: owed again
    ],
)
def test_notification_owed(
    at: datetime, since: datetime | None, paid: datetime | None, expected: bool
) -> None:
    assert owed([silence("factory=plant-a-1")], at, since, paid) is expected


def test_a_periodic_sweep_notifies_once() -> None:
    s = silence("factory=plant-a-1")
    since: datetime | None = T0 + 5 * M
    paid: datetime | None = None
    sent: list[datetime] = []
    for minute in range(0, 180, 7):
        now = T0 + minute * M
        if owed([s], now, since, paid):
            sent.append(now)
            paid = now
    assert sent == [T0 + 63 * M]


def test_ended_early_the_notification_is_owed_at_once() -> None:
    s = silence("factory=plant-a-1")
    ended = end_early(s, at=T0 + 20 * M, by="lee")
    assert not owed([s], T0 + 21 * M, T0 + 5 * M, None)
    assert owed([ended], T0 + 21 * M, T0 + 5 * M, None)
    # another silence still covering it: nothing yet
    other = silence("reason=FIRE_DETECTED", id="s2", end=T0 + 2 * H)
    assert not owed([ended, other], T0 + 21 * M, T0 + 5 * M, None)
