"""Escalation policies: who hears of an incident, and when (the file is read once, the rest pure).

The escalation file is TOML, validated into frozen pydantic models at start-up; an invalid file
fails start-up with an :class:`EscalationError` naming the file and the offending key.
``load_escalation(None)`` reads the packaged ``escalation.toml`` (the dispatcher passes the path
of ``AEGIS_ESCALATION_FILE`` when it is set). It holds:

- ``[receivers.NAME]``: where notifications go; each a table with a ``type`` string, the rest
  kept as written for the receivers' own validation (``validate_receiver``);
- ``[policies.NAME]``: ordered ``[[policies.NAME.levels]]`` (``after``: the time since the
  incident was triggered, the first level ``0s``, then strictly increasing; ``receivers``;
  optional ``repeat``: re-notify this level every so often while unacknowledged), an optional
  ``fallback`` (receivers used at once when a level's receiver keeps failing), ``resolve_notify``
  and ``ack_notify`` (both default true);
- ``[defaults]``: the policy for CRITICAL and for WARNING incidents;
- ``[[routes]]``: ``factories`` (fnmatch patterns over the scope: a factory id or
  ``cloud-infra``) and the ``critical``/``warning`` policy for them.

Rules of the timeline (:func:`next_step`):

- at most one step is due at a time; nothing after an acknowledgement or a resolution;
- a level's time is ``after`` since the escalation base (the trigger time, or the base
  :func:`rebase` gives after a policy change); its receivers are notified once when it is reached;
- while a level is the highest reached, its ``repeat`` re-notifies its receivers every ``repeat``
  since the last notification; after the last level, without ``repeat``, nothing more;
- a dispatcher that wakes late (an outage) finds several levels due: it does not fire them one
  after another. It gets ONE step for the highest due level, whose receivers are those of every
  level it jumps over as well (each receiver once), so nobody in the chain is skipped and nobody
  gets a burst; a late re-notification is likewise one message, never one per missed period.
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from aegis_alert_dispatcher.decide import Severity
from aegis_contracts.times import MAX_DURATION, format_duration, parse_duration

ESCALATION_FILE_ENV = "AEGIS_ESCALATION_FILE"
NAME = r"^[a-z][a-z0-9_-]{0,63}$"
MIN_REPEAT = timedelta(minutes=1)

ReceiverCheck = Callable[[str, dict[str, Any]], None]


class EscalationError(ValueError):
    """The escalation file is missing, not TOML, or breaks the schema."""


def _duration(value: object) -> timedelta:
    """A duration of the file (text), or one built in Python (a timedelta, within the same bounds)."""
    if isinstance(value, timedelta):
        if not timedelta(0) <= value <= MAX_DURATION:
            raise ValueError(f"a duration is between 0s and {format_duration(MAX_DURATION)}")
        return value
    return parse_duration(value)


Duration = Annotated[timedelta, BeforeValidator(_duration)]


def _distinct(names: tuple[str, ...]) -> tuple[str, ...]:
    if len(set(names)) != len(names):
        raise ValueError(f"a receiver is named twice in {list(names)}")
    return names


Receivers = Annotated[tuple[str, ...], AfterValidator(_distinct)]


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Level(_Config):
    after: Duration
    receivers: Annotated[Receivers, Field(min_length=1)]
    repeat: Duration | None = None

    @field_validator("repeat")
    @classmethod
    def _sane_repeat(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value < MIN_REPEAT:
            raise ValueError(f"repeat must be at least {format_duration(MIN_REPEAT)}")
        return value


class Policy(_Config):
    """An escalation policy; ``name`` is its table's (``[policies.NAME]``), set by the loader."""

    name: str = Field(default="", max_length=64)
    levels: tuple[Level, ...] = Field(min_length=1)
    fallback: Receivers = ()
    resolve_notify: bool = True
    ack_notify: bool = True

    @field_validator("fallback", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return (value,) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _timeline(self) -> Self:
        if self.levels[0].after != timedelta(0):
            raise ValueError(
                "levels[0].after must be '0s': the first notification is never delayed"
            )
        for i in range(1, len(self.levels)):
            if self.levels[i].after <= self.levels[i - 1].after:
                raise ValueError(
                    f"levels[{i}].after ({format_duration(self.levels[i].after)}) must be later "
                    f"than levels[{i - 1}].after ({format_duration(self.levels[i - 1].after)})"
                )
        return self

    @property
    def receivers(self) -> list[str]:
        """Every receiver of the policy, each once: the levels' in order, then the fallback."""
        return _union([*(level.receivers for level in self.levels), self.fallback])


class Defaults(_Config):
    critical: str
    warning: str


class Route(_Config):
    factories: Annotated[tuple[Annotated[str, Field(min_length=1)], ...], Field(min_length=1)]
    critical: str | None = None
    warning: str | None = None

    @model_validator(mode="after")
    def _says_something(self) -> Self:
        if self.critical is None and self.warning is None:
            raise ValueError("a route sets critical, warning or both")
        return self

    def matches(self, scope: str) -> bool:
        return any(fnmatch.fnmatchcase(scope, pattern) for pattern in self.factories)

    def policy_name(self, severity: Severity) -> str | None:
        return self.critical if severity == "CRITICAL" else self.warning


class EscalationConfig(_Config):
    receivers: dict[str, dict[str, Any]] = Field(min_length=1)
    policies: dict[str, Policy] = Field(min_length=1)
    defaults: Defaults
    routes: tuple[Route, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _name_policies(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and isinstance(data.get("policies"), Mapping):
            named = {}
            for key, table in data["policies"].items():
                if isinstance(table, Mapping) and "name" in table:
                    raise ValueError(
                        f"policies.{key}: 'name' is not a key: the name is the table's"
                    )
                named[key] = {**table, "name": key} if isinstance(table, Mapping) else table
            data = {**data, "policies": named}
        return data

    @field_validator("receivers")
    @classmethod
    def _receivers(cls, value: dict[str, dict[str, Any]], info: ValidationInfo) -> Any:
        check: ReceiverCheck | None = (info.context or {}).get("validate_receiver")
        problems = []
        for name, table in value.items():
            where = f"receivers.{name}"
            if re.fullmatch(NAME, name) is None:
                problems.append(f"{where}: invalid name (lowercase letters, digits, - and _)")
                continue
            kind = table.get("type")
            if not isinstance(kind, str) or re.fullmatch(NAME, kind) is None:
                problems.append(f"{where}.type: required, a word like 'slack_webhook'")
                continue
            if check is not None:
                try:
                    check(name, dict(table))
                except ValidationError as err:
                    problems.append(f"{where}: {_errors(err)}")
                except ValueError as err:
                    problems.append(f"{where}: {err}")
        if problems:
            raise ValueError("; ".join(problems))
        return value

    @model_validator(mode="after")
    def _references(self) -> Self:
        problems = []
        known = sorted(self.receivers)
        for name, policy in self.policies.items():
            if re.fullmatch(NAME, name) is None:
                problems.append(f"policies.{name}: invalid name (lowercase letters, digits, - _)")
            lists = [(f"levels[{i}].receivers", lv.receivers) for i, lv in enumerate(policy.levels)]
            for where, names in [*lists, ("fallback", policy.fallback)]:
                problems.extend(
                    f"policies.{name}.{where}: unknown receiver {r!r} (defined: {', '.join(known)})"
                    for r in names
                    if r not in self.receivers
                )
        places = [(f"defaults.{s}", getattr(self.defaults, s)) for s in ("critical", "warning")]
        for i, route in enumerate(self.routes):
            places += [(f"routes[{i}].{s}", getattr(route, s)) for s in ("critical", "warning")]
        problems.extend(
            f"{where}: unknown policy {policy!r} (defined: {', '.join(sorted(self.policies))})"
            for where, policy in places
            if policy is not None and policy not in self.policies
        )
        if problems:
            raise ValueError("; ".join(problems))
        return self


# -- loading -----------------------------------------------------------------------------------


def _errors(err: ValidationError) -> str:
    """``where: what`` for each error, ``levels[1]`` for list positions."""
    problems = []
    for e in err.errors():
        where = ""
        for part in e["loc"]:
            where += f"[{part}]" if isinstance(part, int) else f".{part}" if where else str(part)
        message = e["msg"].removeprefix("Value error, ")
        problems.append(f"{where}: {message}" if where else message)
    return "; ".join(problems)


def parse_escalation(
    text: str, *, source: str = "<escalation>", validate_receiver: ReceiverCheck | None = None
) -> EscalationConfig:
    """The escalation config in ``text``; ``validate_receiver(name, table)`` raises ValueError
    (a pydantic ValidationError is one) for a receiver its type does not accept."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise EscalationError(f"{source}: not TOML: {err}") from None
    try:
        return EscalationConfig.model_validate(
            data, context={"validate_receiver": validate_receiver}
        )
    except ValidationError as err:
        raise EscalationError(f"{source}: {_errors(err)}") from None


def default_escalation_text() -> str:
    return (
        resources.files("aegis_alert_dispatcher")
        .joinpath("escalation.toml")
        .read_text(encoding="utf-8")
    )


def load_escalation(
    path: Path | str | None = None, *, validate_receiver: ReceiverCheck | None = None
) -> EscalationConfig:
    """The config from ``path``, or the packaged ``escalation.toml`` when ``path`` is None."""
    if path is None:
        return parse_escalation(
            default_escalation_text(),
            source="escalation.toml (packaged)",
            validate_receiver=validate_receiver,
        )
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise EscalationError(f"{path}: cannot read escalation file: {err.strerror}") from None
    return parse_escalation(text, source=str(path), validate_receiver=validate_receiver)


# -- routing -----------------------------------------------------------------------------------


def policy_for(config: EscalationConfig, scope: str, severity: Severity) -> Policy:
    """The policy of an incident of ``scope`` (a factory id or ``cloud-infra``) at ``severity``.

    The first route that matches the scope AND names a policy for that severity wins; a route
    that matches but names only the other severity's policy is passed over. No such route: the
    default for the severity. A pattern ``*`` matches ``cloud-infra`` too.
    """
    for route in config.routes:
        name = route.policy_name(severity)
        if name is not None and route.matches(scope):
            return config.policies[name]
    return config.policies[
        config.defaults.critical if severity == "CRITICAL" else config.defaults.warning
    ]


# -- the timeline ------------------------------------------------------------------------------


class StepKind(StrEnum):
    NOTIFY = "notify"  # the first notification of an incident (level 0, or higher if late)
    ESCALATE = "escalate"  # a higher level is reached (or the policy changed: see rebase)
    RENOTIFY = "renotify"  # the reached level's repeat


@dataclass(frozen=True, slots=True)
class Step:
    """What to send next, and when: due now when ``due_at <= now``, else the time to wake up.

    ``level`` is the level reached once it is sent; ``receivers`` each get one notification;
    ``skipped`` are the levels jumped over (their receivers are in ``receivers``)."""

    due_at: datetime
    level: int
    kind: StepKind
    receivers: tuple[str, ...]
    skipped: tuple[int, ...] = ()
    why: str = ""


def _union(groups: Iterable[Iterable[str]]) -> list[str]:
    seen: dict[str, None] = {}
    for group in groups:
        seen.update(dict.fromkeys(group))
    return list(seen)


def due_levels(
    policy: Policy, *, triggered_at: datetime, level_reached: int | None, now: datetime
) -> tuple[int, ...]:
    """The levels above ``level_reached`` (None: none sent yet) whose time has come at ``now``.

    More than one means the dispatcher woke late. It must not send them one by one: the next
    step (:func:`next_step`) is the highest of them, once, with all their receivers."""
    start = 0 if level_reached is None else min(level_reached, len(policy.levels) - 1) + 1
    return tuple(
        i for i in range(start, len(policy.levels)) if triggered_at + policy.levels[i].after <= now
    )


def next_step(
    policy: Policy,
    *,
    triggered_at: datetime,
    level_reached: int | None,
    last_notified_at: datetime | None,
    acknowledged: bool,
    resolved: bool,
    now: datetime,
) -> Step | None:
    """The next notification of an incident, or None when nothing more will be sent.

    ``triggered_at`` is the escalation base: when the incident was triggered, or the base
    :func:`rebase` returned after a policy change. ``level_reached``: the highest level sent
    (None: not even level 0). ``last_notified_at``: the last notification sent for the incident.
    An escalation and a re-notification due at the same time are one step: the escalation. A
    level beyond the policy's last (the policy changed without :func:`rebase`) counts as the last.
    """
    if acknowledged or resolved:
        return None
    levels = policy.levels
    reached = -1 if level_reached is None else min(level_reached, len(levels) - 1)
    escalation: Step | None = None
    if reached + 1 < len(levels):
        due = due_levels(policy, triggered_at=triggered_at, level_reached=level_reached, now=now)
        target = due[-1] if due else reached + 1
        jumped = tuple(range(reached + 1, target))
        escalation = Step(
            triggered_at + levels[target].after,
            target,
            StepKind.NOTIFY if reached < 0 else StepKind.ESCALATE,
            tuple(_union(levels[i].receivers for i in (*jumped, target))),
            skipped=jumped,
            why=f"level {target} is due {format_duration(levels[target].after)} after the "
            f"trigger" + (f", levels {list(jumped)} with it (woke late)" if jumped else ""),
        )
    if reached < 0:
        return escalation
    repeat = levels[reached].repeat
    renotify: Step | None = None
    if repeat is not None:
        since = last_notified_at or triggered_at + levels[reached].after
        renotify = Step(
            since + repeat,
            reached,
            StepKind.RENOTIFY,
            levels[reached].receivers,
            why=f"level {reached} repeats every {format_duration(repeat)} until acknowledged",
        )
    if escalation is None or renotify is None:
        return escalation or renotify
    if max(escalation.due_at, now) <= max(renotify.due_at, now):
        return escalation
    return renotify


@dataclass(frozen=True, slots=True)
class Rebased:
    """An incident under a new policy: ``triggered_at`` is its new escalation base (for
    :func:`next_step`), ``level`` the level it keeps, ``step`` the notification due at once."""

    triggered_at: datetime
    level: int
    step: Step


def rebase(policy: Policy, *, level_reached: int | None, at: datetime) -> Rebased:
    """The incident moves to ``policy`` at ``at`` (a WARNING that became CRITICAL).

    The level is kept (clamped to the new policy's last; None counts as 0): nobody already
    engaged is dropped. At once, the receivers of the new policy's levels up to it are notified
    (as if the incident had been under this policy all along; kind ESCALATE). The timers start
    again from ``at``: the base is set so that the kept level is reached at ``at``, so the next
    level follows after the same gap the new policy has between the two, and a repeat counts
    from ``at`` (the caller records ``at`` as ``last_notified_at``).
    """
    level = min(level_reached or 0, len(policy.levels) - 1)
    receivers = _union(lv.receivers for lv in policy.levels[: level + 1])
    step = Step(
        at,
        level,
        StepKind.ESCALATE,
        tuple(receivers),
        skipped=tuple(range(level)),
        why=f"now under policy {policy.name or '?'} at level {level}",
    )
    return Rebased(at - policy.levels[level].after, level, step)


# -- receivers on acknowledgement, resolution, failure -----------------------------------------


class Update(StrEnum):
    ACKNOWLEDGED = "acknowledged"
    RESOLVED = "resolved"


def update_receivers(policy: Policy, *, level_reached: int | None, update: Update) -> list[str]:
    """Who hears that an incident was acknowledged or resolved: the receivers of every level
    reached (each once), or nobody when the policy's ``ack_notify``/``resolve_notify`` is off or
    nothing was sent yet."""
    wanted = policy.ack_notify if update is Update.ACKNOWLEDGED else policy.resolve_notify
    if not wanted or level_reached is None:
        return []
    return _union(lv.receivers for lv in policy.levels[: level_reached + 1])


def fallback_for(policy: Policy) -> list[str]:
    """The receivers to use at once when a level's receiver keeps failing (may be empty)."""
    return list(policy.fallback)


def failover(policy: Policy, *, failed: Collection[str]) -> list[str]:
    """The receivers to try now, given the ones that have failed for a notification.

    First the fallback receivers that have not failed; when every one of them has, the policy's
    other receivers (every level's, in order) that have not. Empty: every receiver of the policy
    has failed, and only then is the notification dead-lettered (:func:`dead_lettered`).
    """
    fallback = [r for r in policy.fallback if r not in failed]
    return fallback or [r for r in policy.receivers if r not in failed]


def dead_lettered(policy: Policy, *, failed: Collection[str]) -> bool:
    """True only when every receiver of the policy (levels' and fallback) has failed."""
    return not failover(policy, failed=failed)
