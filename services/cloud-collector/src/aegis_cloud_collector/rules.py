"""Alerting rules of the cloud checks, as pure functions: what a check measured, the previous
snapshot and ``now`` in, the check as reported out. Part of the functional core, like
:mod:`aegis_cloud_collector.domain`: no I/O, time only from ``now``.

Every check has a rule, as a Prometheus alerting rule has:

- ``for``: a failing check is *pending* (status NORMAL, its code and ``alerting.state``
  ``pending`` in the snapshot, never a reason) until it has failed in every run for ``for``
  seconds; then it *fires* (its WARNING/CRITICAL reason is reported). A pass in between starts
  the count again.
- clear: a firing check that passes is *clearing*, still reported as it fired, until it has
  passed in every run for the clear duration; a failure in between makes it fire again without
  ever having stopped (``flaps`` counts it). So a flapping check is alerted and resolved once.
- starting: a check that the domain found *starting* (a service not seen since the collector
  started, a replica just started, the replacement of one that stopped cleanly; the broker's
  ``$SYS`` before its first message) is informational (status NORMAL, ``SERVICE_STARTING``, …),
  unless the check was already pending, firing or clearing: then it goes on failing as before,
  so a collector that restarts while something is down neither resolves nor delays its alert.

What the rule must remember (since when the check has been failing or passing) is in each
check's ``alerting``, in the snapshot the collector files: the tier's snapshot in CLOUD#infra
LATEST is what the next run reads, whichever replica runs it, and after a restart. A previous
snapshot older than ``max_gap`` (the collector was stopped: a new ``make run``, an outage) says
nothing about the runs between, so nothing is carried over: every check starts afresh, and a
failure must last its ``for`` again. A check the previous snapshot had firing that is no longer
measured at all (its probe failed, its subject went away) is kept clearing for its clear
duration, then dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from aegis_cloud_collector.domain import STARTING_CODES, clip_detail
from aegis_contracts.cloud import OK, CheckAlerting, CheckState, CloudCheck, CloudSnapshot
from aegis_contracts.state import Level

# runs start at their window's start, a little later when the claim or the probes were slow:
# a duration this much short of the rule's still counts as reached
RUN_JITTER = timedelta(seconds=1)
ACTIVE = frozenset({CheckState.PENDING, CheckState.FIRING, CheckState.CLEARING})
REPORTED = frozenset({CheckState.FIRING, CheckState.CLEARING})


@dataclass(frozen=True, slots=True)
class Timing:
    """The rules' durations, seconds: ``for_s`` and ``clear_s`` for every reason not in
    ``for_by_reason``/``clear_by_reason``; ``max_gap_s``: the oldest previous snapshot whose
    state is carried over (a few of the tier's intervals)."""

    for_s: float
    clear_s: float
    max_gap_s: float
    for_by_reason: Mapping[str, float] = field(default_factory=dict)
    clear_by_reason: Mapping[str, float] = field(default_factory=dict)

    def for_of(self, reason: str) -> float:
        return self.for_by_reason.get(reason, self.for_s)

    def clear_of(self, reason: str) -> float:
        return self.clear_by_reason.get(reason, self.clear_s)


def _reached(since: datetime, now: datetime, seconds: float) -> bool:
    return now - since + RUN_JITTER >= timedelta(seconds=seconds)


def memory(check: CloudCheck) -> CheckAlerting:
    """What a previous check says about its rule. A check filed before the rules existed is
    firing when it was not NORMAL (so an upgrade neither resolves nor re-sends its alert)."""
    if check.alerting is not None:
        return check.alerting
    if check.status is Level.NORMAL:
        return CheckAlerting(state=CheckState.OK)
    return CheckAlerting(state=CheckState.FIRING, observed=check.status)


def carried(previous: CloudSnapshot | None, now: datetime, timing: Timing) -> dict[str, CloudCheck]:
    """The previous snapshot's checks by name, when that snapshot is recent enough to continue
    from (none otherwise)."""
    if previous is None or now - previous.updated_at > timedelta(seconds=timing.max_gap_s):
        return {}
    return {c.name: c for c in previous.checks}


def evaluate(
    observed: Iterable[CloudCheck],
    previous: CloudSnapshot | None,
    now: datetime,
    timing: Timing,
) -> list[CloudCheck]:
    """The checks as reported: each measured check through its rule, plus the previously firing
    checks no longer measured (clearing until their clear duration is over)."""
    before = carried(previous, now, timing)
    out = []
    seen = set()
    for check in observed:
        seen.add(check.name)
        out.append(rule(check, before.get(check.name), now, timing))
    for name, old in sorted(before.items()):
        if name not in seen and (gone := vanished(old, now, timing)) is not None:
            out.append(gone)
    return out


def rule(
    check: CloudCheck, previous: CloudCheck | None, now: datetime, timing: Timing
) -> CloudCheck:
    """One check through its rule, given the same check in the previous (recent) snapshot."""
    mem = memory(previous) if previous is not None else CheckAlerting(state=CheckState.OK)
    starting = check.status is Level.NORMAL and check.reason in STARTING_CODES
    if starting and mem.state in ACTIVE and previous is not None:
        # what it was failing with goes on failing: a restart or a replacement does not reset it
        level = mem.observed if mem.observed is not Level.NORMAL else previous.status
        check = check.model_copy(
            update={
                "status": level if level is not Level.NORMAL else Level.WARNING,
                "reason": previous.reason,
                "detail": clip_detail(f"{check.detail} (was {previous.reason})"),
            }
        )
    if check.status is Level.NORMAL:
        return _passing(check, previous, mem, now, timing, starting=starting)
    return _failing(check, previous, mem, now, timing)


def _failing(
    check: CloudCheck,
    previous: CloudCheck | None,
    mem: CheckAlerting,
    now: datetime,
    timing: Timing,
) -> CloudCheck:
    for_s = timing.for_of(check.reason)
    clear_s = timing.clear_of(check.reason)
    since = mem.failing_since if mem.state in ACTIVE and mem.failing_since else now
    firing = mem.state in REPORTED or _reached(since, now, for_s)
    alerting = CheckAlerting(
        state=CheckState.FIRING if firing else CheckState.PENDING,
        observed=check.status,
        failing_since=since,
        for_s=for_s,
        clear_s=clear_s,
        # a firing check that passed (clearing) and fails again has flapped
        flaps=mem.flaps + (mem.state is CheckState.CLEARING) if mem.state in REPORTED else 0,
    )
    if firing:
        return check.model_copy(update={"alerting": alerting})
    failing_for = (now - since).total_seconds()
    return check.model_copy(
        update={
            "status": Level.NORMAL,
            "detail": clip_detail(
                f"pending {check.status.value} for {failing_for:.0f} s of {for_s:g} s: "
                f"{check.detail}"
            ),
            "alerting": alerting,
        }
    )


def _passing(
    check: CloudCheck,
    previous: CloudCheck | None,
    mem: CheckAlerting,
    now: datetime,
    timing: Timing,
    *,
    starting: bool,
) -> CloudCheck:
    if mem.state in REPORTED and previous is not None:
        since = mem.passing_since if mem.state is CheckState.CLEARING and mem.passing_since else now
        clear_s = timing.clear_of(previous.reason)
        if not _reached(since, now, clear_s):
            return _clearing(check, previous, mem, since=since, clear_s=clear_s, now=now)
    state = CheckState.STARTING if starting else CheckState.OK
    return check.model_copy(update={"alerting": CheckAlerting(state=state)})


def _clearing(
    check: CloudCheck,
    previous: CloudCheck,
    mem: CheckAlerting,
    *,
    since: datetime,
    clear_s: float,
    now: datetime,
) -> CloudCheck:
    """Passing after firing, not yet for ``clear_s``: reported as it fired, with today's value."""
    passing_for = (now - since).total_seconds()
    alerting = CheckAlerting(
        state=CheckState.CLEARING,
        observed=Level.NORMAL,
        failing_since=mem.failing_since,
        passing_since=since,
        for_s=mem.for_s,
        clear_s=clear_s,
        flaps=mem.flaps,
    )
    now_detail = check.detail or ("passing" if check.reason == OK else check.reason)
    return check.model_copy(
        update={
            "status": previous.status,
            "reason": previous.reason,
            "threshold": previous.threshold,
            "detail": clip_detail(
                f"clearing: passing for {passing_for:.0f} s of {clear_s:g} s ({now_detail})"
            ),
            "alerting": alerting,
        }
    )


def vanished(previous: CloudCheck, now: datetime, timing: Timing) -> CloudCheck | None:
    """A check the previous snapshot had that this run did not measure: kept clearing when it
    was firing or clearing (until its clear duration is over), else dropped."""
    mem = memory(previous)
    if mem.state not in REPORTED:
        return None
    since = mem.passing_since if mem.state is CheckState.CLEARING and mem.passing_since else now
    clear_s = timing.clear_of(previous.reason)
    if _reached(since, now, clear_s):
        return None
    gone = CloudCheck.ok(previous.name, detail="no longer measured")
    return _clearing(gone, previous, mem, since=since, clear_s=clear_s, now=now)


def pending(checks: Iterable[CloudCheck]) -> list[str]:
    """The names of the checks in ``state`` pending (for the run's log line)."""
    return [c.name for c in checks if c.alerting and c.alerting.state is CheckState.PENDING]


def starting(checks: Iterable[CloudCheck]) -> list[str]:
    return [c.name for c in checks if c.alerting and c.alerting.state is CheckState.STARTING]
