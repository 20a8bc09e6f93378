"""What to do with one snapshot's reasons, given the scope's alert state (pure, no I/O).

An alert is one ``(severity, reason code)`` of one stream of a scope (``STATE`` for a factory's
state snapshots, ``FAST``/``SLOW`` for the cloud collectors' runs). Rules:

- every WARNING/CRITICAL reason fires, at most once per cooldown (CRITICAL 5 min, WARNING 15 min,
  measured in snapshot time, so a backlog is judged as it happened);
- a reason that turns from WARNING to CRITICAL sends at once (escalation: its own cooldown);
- a reason that disappears at every severity while an alert for it fires sends one RESOLVED;
  one that only drops from CRITICAL to WARNING clears the CRITICAL alert silently (the WARNING
  alert speaks for it, within its own cooldown);
- a cloud WARNING fires only when seen in ``observations`` consecutive runs of its stream (a run
  without it resets the count); a cloud CRITICAL fires at once;
- a factory's WARNING fires only once it has been reported without a break for
  ``state_warning_for`` (snapshot time; a snapshot without it starts again): a detection that
  flickers for one frame pages nobody. A factory's CRITICAL fires at once;
- an alert whose message is being sent (``pending``: recorded, not yet confirmed by Slack) is not
  fired again: that message speaks for it. Cooldown counts confirmed sends only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Literal

from aegis_contracts.items import AlertObservation, AlertState
from aegis_contracts.state import Reason

Severity = Literal["WARNING", "CRITICAL"]
AlertKey = tuple[Severity, str]  # (severity, reason code)


class Stream(StrEnum):
    """The ``status`` word of an alert key: where its reasons come from."""

    STATE = "STATE"
    FAST = "FAST"
    SLOW = "SLOW"

    @property
    def cloud(self) -> bool:
        return self is not Stream.STATE


class Action(StrEnum):
    FIRE = "fire"
    ESCALATE = "escalate"
    RESOLVE = "resolve"
    COOLDOWN = "suppressed_cooldown"
    IN_FLIGHT = "in_flight"
    WAITING = "waiting_observations"
    DOWNGRADE = "downgraded"


SENDS = frozenset({Action.FIRE, Action.ESCALATE, Action.RESOLVE})


@dataclass(frozen=True, slots=True)
class Policy:
    cooldown_critical: timedelta = timedelta(minutes=5)
    cooldown_warning: timedelta = timedelta(minutes=15)
    cloud_warning_observations: int = 3
    # 0: a factory's WARNING fires with the first snapshot that reports it
    state_warning_for: timedelta = timedelta(0)

    def cooldown(self, severity: Severity) -> timedelta:
        return self.cooldown_critical if severity == "CRITICAL" else self.cooldown_warning


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    severity: Severity
    code: str
    # the snapshot's reasons behind it (empty for RESOLVE and DOWNGRADE)
    reasons: tuple[Reason, ...] = ()
    # the alert item as read (None: never fired); a send changes it only if unchanged since
    state: AlertState | None = None
    # RESOLVE clears every firing alert of the code; these are the others (lower severities)
    also_clears: tuple[AlertState, ...] = ()
    why: str = ""

    @property
    def sends(self) -> bool:
        return self.action in SENDS

    @property
    def touches_pending(self) -> bool:
        """It would change an alert whose message is still being sent (a RESOLVE or DOWNGRADE
        right behind its FIRE): it must wait until that message is confirmed or dead-lettered."""
        if self.action in (Action.RESOLVE, Action.DOWNGRADE):
            return any(s.pending is not None for s in (self.state, *self.also_clears) if s)
        return False


@dataclass(slots=True)
class Outcome:
    decisions: list[Decision] = field(default_factory=list)
    # observation counts to store (cloud WARNINGs seen in this run) and keys to reset
    observed: dict[AlertKey, int] = field(default_factory=dict)
    reset: list[AlertKey] = field(default_factory=list)


def group_reasons(reasons: Iterable[Reason]) -> dict[AlertKey, tuple[Reason, ...]]:
    grouped: dict[AlertKey, list[Reason]] = {}
    for reason in reasons:
        grouped.setdefault((reason.severity, reason.code), []).append(reason)
    return {key: tuple(found) for key, found in sorted(grouped.items())}


def decide(
    *,
    stream: Stream,
    snapshot_at: datetime,
    reasons: Iterable[Reason],
    states: Mapping[AlertKey, AlertState],
    observations: Mapping[AlertKey, AlertObservation],
    policy: Policy,
) -> Outcome:
    """The decisions for one snapshot of one stream (``states``/``observations``: that stream's)."""
    out = Outcome()
    active = group_reasons(reasons)
    active_codes: dict[str, set[Severity]] = {}
    for severity, code in active:
        active_codes.setdefault(code, set()).add(severity)

    for (severity, code), found in active.items():
        key: AlertKey = (severity, code)
        state = states.get(key)
        previous = observations.get(key)
        waiting = _waiting(
            stream,
            severity,
            state=state,
            previous=previous,
            snapshot_at=snapshot_at,
            policy=policy,
        )
        if waiting is not None:
            out.observed[key] = (previous.count if previous else 0) + 1
            if waiting:
                out.decisions.append(
                    Decision(Action.WAITING, severity, code, found, state, why=waiting)
                )
                continue
        if state is not None and state.pending is not None:
            out.decisions.append(
                Decision(
                    Action.IN_FLIGHT, severity, code, found, state, why="its message is sending"
                )
            )
            continue
        if state is not None and state.firing and state.last_sent_at is not None:
            since = snapshot_at - state.last_sent_at
            if since < policy.cooldown(severity):
                out.decisions.append(
                    Decision(
                        Action.COOLDOWN,
                        severity,
                        code,
                        found,
                        state,
                        why=f"sent {since.total_seconds():.0f} s ago, cooldown "
                        f"{policy.cooldown(severity).total_seconds():.0f} s",
                    )
                )
                continue
        lower = states.get(("WARNING", code))
        escalation = severity == "CRITICAL" and lower is not None and lower.firing
        out.decisions.append(
            Decision(
                Action.ESCALATE if escalation else Action.FIRE,
                severity,
                code,
                found,
                state,
                why="WARNING -> CRITICAL" if escalation else "firing",
            )
        )

    out.decisions.extend(_clearing(states, active, active_codes))
    out.reset = sorted(k for k in observations if k not in active)
    return out


def _waiting(
    stream: Stream,
    severity: Severity,
    *,
    state: AlertState | None,
    previous: AlertObservation | None,
    snapshot_at: datetime,
    policy: Policy,
) -> str | None:
    """For a reason that must be observed before it fires: why it still waits (``""``: it has
    waited enough); None for one that fires at once (no observation is counted)."""
    if severity != "WARNING":
        return None
    if stream.cloud:
        count = (previous.count if previous else 0) + 1
        if count < policy.cloud_warning_observations:
            return f"observed {count} of {policy.cloud_warning_observations} times"
        return ""
    if policy.state_warning_for <= timedelta(0) or (state is not None and state.firing):
        return None
    held = snapshot_at - (previous.first_observed_at if previous else snapshot_at)
    if held < policy.state_warning_for:
        return (
            f"reported for {held.total_seconds():.0f} s of "
            f"{policy.state_warning_for.total_seconds():.0f} s"
        )
    return ""


def _clearing(
    states: Mapping[AlertKey, AlertState],
    active: Mapping[AlertKey, tuple[Reason, ...]],
    active_codes: Mapping[str, set[Severity]],
) -> list[Decision]:
    """RESOLVE for reasons gone at every severity; DOWNGRADE for a CRITICAL now only WARNING."""
    decisions: list[Decision] = []
    firing_by_code: dict[str, list[AlertState]] = {}
    for (severity, code), state in sorted(states.items()):
        if state.firing and (severity, code) not in active:
            firing_by_code.setdefault(code, []).append(state)
    for code, firing in firing_by_code.items():
        if code in active_codes:
            # still present at another severity: a CRITICAL that became WARNING clears quietly;
            # a WARNING under a CRITICAL stays as it is (the reason has not gone)
            decisions.extend(
                Decision(Action.DOWNGRADE, s.severity, code, state=s, why="now WARNING")
                for s in firing
                if s.severity == "CRITICAL"
            )
            continue
        worst = max(firing, key=lambda s: s.severity == "CRITICAL")
        decisions.append(
            Decision(
                Action.RESOLVE,
                worst.severity,
                code,
                state=worst,
                also_clears=tuple(s for s in firing if s is not worst),
                why="no longer reported",
            )
        )
    return decisions
