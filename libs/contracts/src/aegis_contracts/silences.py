"""Silences: hold back the notifications of matching incidents for a while (pure, no I/O).

Like Alertmanager's. An incident has four labels: ``factory`` (its scope: a factory id or
``cloud-infra``), ``reason`` (the reason code), ``severity`` (``WARNING``/``CRITICAL``) and
``source`` (the stream: ``STATE``, ``FAST``, ``SLOW``); a label an incident lacks is the empty
string. A silence has matchers, all of which must match (``=`` equal, ``!=`` not equal, ``=~``
the regular expression matches the WHOLE value, ``!~`` it does not), and a window
``[starts_at, ends_at)``, cut short by ``expired_at`` when someone ends it early.

The guard (:func:`check_new_silence`) refuses a new silence that could hide a CRITICAL incident
without a reason, for longer than 8 hours, or over everything. When a silence ends, incidents it
held back and still firing are owed a notification (:func:`notification_owed`).
"""

from __future__ import annotations

import re
import secrets
import warnings
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Self

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from aegis_contracts.times import CLOCK_SKEW_TOLERANCE

MAX_VALUE = 256
MAX_CRITICAL = timedelta(hours=8)
SEVERITIES = ("WARNING", "CRITICAL")


class Label(StrEnum):
    FACTORY = "factory"
    REASON = "reason"
    SEVERITY = "severity"
    SOURCE = "source"


class Op(StrEnum):
    EQ = "="
    NE = "!="
    RE = "=~"
    NRE = "!~"


# the two-character operators first: "a=~b" is a regex, not "=" with the value "~b" (quote it)
_MATCHER = re.compile(r"\s*([A-Za-z_]+)\s*(=~|!~|!=|=)\s*(.*?)\s*", re.DOTALL)


def labels_of(*, scope: str, reason: str, severity: str, source: str) -> dict[str, str]:
    """An incident's labels, as the matchers see them."""
    return {
        Label.FACTORY: scope,
        Label.REASON: reason,
        Label.SEVERITY: severity,
        Label.SOURCE: source,
    }


class MatcherError(ValueError):
    """A matcher's text that does not parse, or names no label, or holds a bad regex."""


class Matcher(BaseModel):
    """``field op value``; regular expressions (Python's) are compiled once, at most
    256 characters, and match the whole label value (``plant-a`` does not match ``plant-a-1``).
    Built from a dict, or from text with :meth:`parse` (a string is parsed too)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    field: Label
    op: Op
    value: str = Field(max_length=MAX_VALUE)
    _regex: re.Pattern[str] | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _text(cls, data: Any) -> Any:
        return _split(data) if isinstance(data, str) else data

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.op in (Op.RE, Op.NRE):
            try:
                with warnings.catch_warnings():
                    # "[[", "--" in a set...: Python warns their meaning will change; refuse them
                    warnings.simplefilter("error")
                    self._regex = re.compile(self.value)
            except (re.error, Warning) as err:
                raise ValueError(f"{self}: invalid regular expression: {err}") from None
        elif self.field is Label.SEVERITY and self.value not in SEVERITIES:
            raise ValueError(f"{self}: severity is WARNING or CRITICAL (upper case)")
        return self

    @classmethod
    def parse(cls, text: str) -> Matcher:
        """``factory=~plant-a-.*``, ``severity!=CRITICAL``, ``reason="CO_HIGH"``: a value may be
        double-quoted (spaces around it are dropped otherwise). :class:`MatcherError` says what
        is wrong."""
        try:
            return cls.model_validate(text)
        except ValidationError as err:
            problems = [
                f"{'.'.join(str(p) for p in e['loc']) + ': ' if e['loc'] else ''}"
                f"{e['msg'].removeprefix('Value error, ')}"
                for e in err.errors()
            ]
            raise MatcherError("; ".join(problems)) from None

    def matches(self, value: str) -> bool:
        if self._regex is not None:
            return (self._regex.fullmatch(value) is not None) == (self.op is Op.RE)
        return (value == self.value) == (self.op is Op.EQ)

    def __str__(self) -> str:
        """The text :meth:`parse` reads back (the value quoted when it would not survive)."""
        value = self.value
        if (
            value != value.strip()
            or (len(value) >= 2 and value[0] == value[-1] == '"')
            or (self.op is Op.EQ and value.startswith("~"))
        ):
            value = f'"{value}"'
        return f"{self.field.value}{self.op.value}{value}"


def _split(text: str) -> dict[str, str]:
    found = _MATCHER.fullmatch(text)
    if found is None:
        raise ValueError(
            f"{text!r} is not a matcher like 'factory=~plant-a-.*' (operators =, !=, =~, !~)"
        )
    name, op, value = found.groups()
    if name not in {label.value for label in Label}:
        raise ValueError(
            f"{text!r}: no label {name!r} (one of {', '.join(label.value for label in Label)})"
        )
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    return {"field": name, "op": op, "value": value}


class Silence(BaseModel):
    """A silence as stored. ``reason`` is required (non-blank) only by the guard, for a silence
    that could cover a CRITICAL incident; ``expired_at``/``ended_by``: ended early."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=128)
    matchers: tuple[Matcher, ...] = Field(min_length=1)
    starts_at: AwareDatetime
    ends_at: AwareDatetime
    created_by: str = Field(min_length=1, max_length=256)
    reason: str = Field(default="", max_length=1024)
    created_at: AwareDatetime
    expired_at: AwareDatetime | None = None
    ended_by: str | None = Field(default=None, max_length=256)

    @field_validator("created_by")
    @classmethod
    def _someone(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("created_by is blank")
        return value

    @property
    def ends(self) -> datetime:
        """When it stops covering: ``ends_at``, or ``expired_at`` when ended earlier."""
        if self.expired_at is not None and self.expired_at < self.ends_at:
            return self.expired_at
        return self.ends_at

    def active(self, at: datetime) -> bool:
        return self.starts_at <= at < self.ends

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(m.matches(labels.get(m.field, "")) for m in self.matchers)


def covers(silence: Silence, labels: Mapping[str, str], at: datetime) -> bool:
    """It is active at ``at`` and every matcher matches (a missing label is the empty string)."""
    return silence.active(at) and silence.matches(labels)


def active_silences(silences: Iterable[Silence], at: datetime) -> list[Silence]:
    return [s for s in silences if s.active(at)]


def silenced_by(
    silences: Iterable[Silence], labels: Mapping[str, str], at: datetime
) -> list[Silence]:
    """The silences covering an incident with ``labels`` at ``at`` (empty: not silenced)."""
    return [s for s in silences if covers(s, labels, at)]


def end_early(silence: Silence, *, at: datetime, by: str) -> Silence:
    """The silence ended at ``at`` by ``by`` (it covers nothing from ``at`` on)."""
    if at >= silence.ends:
        raise ValueError(f"silence {silence.id} has already ended ({silence.ends.isoformat()})")
    return silence.model_copy(update={"expired_at": at, "ended_by": by})


def ended_between(silences: Iterable[Silence], after: datetime, until: datetime) -> list[Silence]:
    """The silences that stopped covering in ``(after, until]``: a sweep's since its last one."""
    return [s for s in silences if after < s.ends <= until and s.starts_at < s.ends]


# -- the guard ---------------------------------------------------------------------------------


class SilenceRefused(ValueError):
    """A new silence the guard refuses; ``problems`` lists every reason."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


# values no silence is written for: a matcher that accepts every one of them restricts nothing in
# practice (``factory!=plant-a-1`` leaves every other factory, ``reason=~.+`` every reason)
_PROBES: dict[Label, tuple[str, ...]] = {
    Label.FACTORY: ("zz-probe-1", "q9", "unlisted-factory-3f9c"),
    Label.REASON: ("ZZ_PROBE_REASON", "Q9", "UNLISTED_REASON_3F9C"),
}


def could_cover_critical(silence: Silence) -> bool:
    """True unless a severity matcher refuses ``CRITICAL``.

    The matchers all have to match, so a single severity matcher that does not match the value
    ``CRITICAL`` (``severity=WARNING``, ``severity!=CRITICAL``, ``severity!~CRIT.*``) means the
    silence can never cover a CRITICAL incident. Any other silence could, whatever its other
    matchers say: they are not examined, so the answer errs on the side of the guard."""
    return all(m.matches("CRITICAL") for m in silence.matchers if m.field is Label.SEVERITY)


def _restricts(matcher: Matcher) -> bool:
    return not all(matcher.matches(p) for p in _PROBES[matcher.field])


def matches_everything(silence: Silence) -> bool:
    """It narrows neither the factories nor the reasons: each of its factory and reason matchers
    (if any) accepts every one of a few made-up values no silence is written for. So a matcher
    that only excludes (``factory!=plant-a-1``, ``reason!~FIRE_.*``) or accepts anything
    (``factory=~.*``) narrows nothing; ``factory=~plant-a-.*`` does. Severity and source do not
    count: ``severity=CRITICAL`` alone would silence every CRITICAL of the fleet."""
    return not any(
        _restricts(m) for m in silence.matchers if m.field in (Label.FACTORY, Label.REASON)
    )


def check_new_silence(
    silence: Silence,
    *,
    now: datetime,
    max_critical: timedelta = MAX_CRITICAL,
    max_any: timedelta | None = None,
) -> None:
    """Refuse (:class:`SilenceRefused`, every problem at once) a silence that:

    - has no matchers, or ends before it starts or already at ``now``;
    - starts more than the clock-skew tolerance (5 minutes) before ``now``: a silence is not
      back-dated;
    - lasts longer than ``max_any`` (when given);
    - could cover a CRITICAL incident (:func:`could_cover_critical`) and has a blank reason, lasts
      longer than ``max_critical``, or matches everything (:func:`matches_everything`).
    """
    problems = []
    if not silence.matchers:
        problems.append("a silence needs at least one matcher")
    length = silence.ends_at - silence.starts_at
    if length <= timedelta(0):
        problems.append("ends_at must be after starts_at")
    elif silence.ends_at <= now:
        problems.append("ends_at is already past")
    if silence.starts_at < now - CLOCK_SKEW_TOLERANCE:
        problems.append(
            f"starts_at is {_minutes(now - silence.starts_at)} ago: a silence starts now or later"
        )
    if max_any is not None and length > max_any:
        problems.append(f"it lasts {_minutes(length)}, more than {_minutes(max_any)}")
    if silence.matchers and could_cover_critical(silence):
        why = "it could cover CRITICAL incidents (add severity=WARNING to keep them out)"
        if not silence.reason.strip():
            problems.append(f"{why}: give a reason")
        if length > max_critical:
            problems.append(f"{why}: at most {_minutes(max_critical)}, not {_minutes(length)}")
        if matches_everything(silence):
            problems.append(f"{why}: name the factories or reasons it is for, not all of them")
    if problems:
        raise SilenceRefused(problems)


def _minutes(value: timedelta) -> str:
    minutes = int(value.total_seconds() // 60)
    hours, rest = divmod(minutes, 60)
    return f"{hours} h {rest} min" if hours else f"{rest} min"


# -- when a silence ends -----------------------------------------------------------------------


def notification_owed(
    labels: Mapping[str, str],
    silences: Iterable[Silence],
    *,
    at: datetime,
    silenced_since: datetime | None,
    notified_after_silence_at: datetime | None,
) -> bool:
    """An incident still firing is owed a notification at ``at`` because a silence held one back.

    ``silenced_since``: when a silence last held back a notification of the incident (the caller
    sets it each time it skips one because of a silence; None: never). True when that happened,
    no silence covers the incident any more, and no notification has gone out since
    (``notified_after_silence_at``: the caller records it when it sends this one, or any other
    notification of the incident; a ``last_notified_at`` that every notification sets will do).
    A sweep that asks again after that gets False; silenced again later (``silenced_since`` moves
    past it), a notification is owed again. Ask only of incidents still firing, neither
    acknowledged nor resolved; the owed notification is the one the silence held back (the
    incident's current level).
    """
    if silenced_since is None:
        return False
    if notified_after_silence_at is not None and notified_after_silence_at >= silenced_since:
        return False
    return not silenced_by(silences, labels, at)


def new_silence_id() -> str:
    """``s-`` and 12 random hex digits: what a new silence is called."""
    return f"s-{secrets.token_hex(6)}"


def new_silence(
    *,
    matchers: Iterable[str],
    by: str,
    now: datetime,
    reason: str = "",
    starts_at: datetime | None = None,
    ends_at: datetime | None = None,
    duration: timedelta | None = None,
    max_critical: timedelta = MAX_CRITICAL,
) -> Silence:
    """A new silence from what a person typed (matchers as text, an end or a duration), checked
    by the guard: :class:`SilenceRefused` lists every problem at once."""
    problems: list[str] = []
    parsed: list[Matcher] = []
    for text in matchers:
        try:
            parsed.append(Matcher.parse(text))
        except MatcherError as err:
            problems.append(str(err))
    if not parsed and not problems:
        problems.append("a silence needs at least one matcher")
    if (ends_at is None) == (duration is None):
        problems.append("give an end time or a duration (one of them)")
    if problems:
        raise SilenceRefused(problems)
    start = starts_at or now
    end = ends_at if ends_at is not None else start + (duration or timedelta(0))
    try:
        silence = Silence(
            id=new_silence_id(),
            matchers=tuple(parsed),
            starts_at=start,
            ends_at=end,
            created_by=by,
            reason=reason.strip(),
            created_at=now,
        )
    except ValueError as err:
        raise SilenceRefused([str(err)]) from None
    check_new_silence(silence, now=now, max_critical=max_critical)
    return silence


def silenced_factory(matchers: list[Matcher]) -> str | None:
    """The one factory a silence can hold back: the value of a ``factory=ID`` matcher (matchers
    all have to match, so one such matcher pins it); None when it can reach more than one (no
    such matcher: every factory, or a pattern's). Who may create, see or end it follows."""
    for matcher in matchers:
        if matcher.field is Label.FACTORY and matcher.op is Op.EQ:
            return matcher.value
    return None
