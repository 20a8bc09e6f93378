"""The platform's view of itself: cloud-infrastructure checks and snapshots.

A collector runs checks; each yields a status (NORMAL = ok, WARNING, CRITICAL), a stable reason
code and the value it measured. A :class:`CloudSnapshot` is one collector run: the body of
``processed/cloud_infra/{tier}/…/{updated_at}.json``, the ``fast``/``slow`` field of CLOUD#infra
LATEST and the ``snapshot`` of its HISTORY items. Its ``reasons`` are the checks that are not ok,
in the same shape as a factory's risk reasons, so the alert dispatcher treats both alike.

A check's ``status`` is what the collector reports, after its alerting rule: a failure is reported
(WARNING/CRITICAL) only once it lasted the rule's ``for`` duration, and stays reported until the
check passed for the rule's clear duration. ``alerting`` says where the check stands (starting,
pending, firing, clearing) and carries what the next run needs to go on counting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from aegis_contracts.state import Level, Reason
from aegis_contracts.times import Timestamp

CloudTier = Literal["fast", "slow"]
OK = "OK"

# a check's name: ``{component}`` or ``{component}:{subject}``, e.g. ``service:processor``
CHECK_NAME = r"^[a-z][a-z0-9_]{0,31}(:[A-Za-z0-9_.@/=-]{1,96})?$"


class CheckState(StrEnum):
    """Where a check stands in its alerting rule.

    ``ok``: passing. ``starting``: what it checks has not started yet, or is being replaced by a
    new replica (informational, never a reason). ``pending``: failing for less than its ``for``
    duration (not a reason yet). ``firing``: failing for at least ``for``: reported.
    ``clearing``: passing again after firing, for less than the clear duration: still reported."""

    OK = "ok"
    STARTING = "starting"
    PENDING = "pending"
    FIRING = "firing"
    CLEARING = "clearing"


class CheckAlerting(BaseModel):
    """A check's alerting rule state: what this run measured and since when it has been failing
    or passing, so the next run (this collector after a restart, or another replica) goes on
    counting from the previous snapshot."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    state: CheckState
    # what the check itself found this run, before the rule (NORMAL while clearing)
    observed: Level = Level.NORMAL
    # the first run of the current unbroken failure (pending, firing, clearing)
    failing_since: Timestamp | None = None
    # the first passing run after firing (clearing)
    passing_since: Timestamp | None = None
    for_s: float = Field(default=0, ge=0)
    clear_s: float = Field(default=0, ge=0)
    # how often a firing check passed and failed again before it cleared
    flaps: int = Field(default=0, ge=0)


class CloudCheck(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=CHECK_NAME)
    # the reported status: WARNING/CRITICAL only while the check's rule fires (see ``alerting``)
    status: Level
    # OK when nothing is wrong; what is wrong while firing (CONSUMER_STALLED, SERVICE_DOWN, …);
    # with a NORMAL status, another code is information, not a reason: what is pending
    # (SERVICE_DOWN, not yet for long enough) or starting (SERVICE_STARTING)
    reason: str = Field(pattern=r"^[A-Z][A-Z0-9_]{0,63}$")
    value: float | None = None
    unit: str | None = Field(default=None, max_length=16)
    threshold: float | None = None
    detail: str = Field(default="", max_length=512)
    # other figures measured with ``value``: what an operator reads beside it (a consumer's
    # num_ack_pending, num_waiting) and what the next run compares against (its ack floor, the
    # dead-letter total), since a collector's only memory is its previous snapshot
    measures: dict[str, float] = Field(default_factory=dict)
    # the alerting rule's state; None in a check not (yet) through the rule
    alerting: CheckAlerting | None = None

    @classmethod
    def ok(
        cls,
        name: str,
        value: float | None = None,
        unit: str | None = None,
        detail: str = "",
        measures: Mapping[str, float] | None = None,
    ) -> CloudCheck:
        return cls(
            name=name,
            status=Level.NORMAL,
            reason=OK,
            value=value,
            unit=unit,
            detail=detail,
            measures=dict(measures or {}),
        )

    def as_reason(self) -> Reason | None:
        if self.status is Level.NORMAL:
            return None
        return Reason(
            code=self.reason,
            severity="CRITICAL" if self.status is Level.CRITICAL else "WARNING",
            detail=self.detail or self.name,
            value=self.value,
            threshold=self.threshold,
            source=self.name[:64],
        )


class CloudSnapshot(BaseModel):
    """One collector run: every check, the worst status and the reasons for it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tier: CloudTier
    updated_at: Timestamp
    status: Level
    checks: list[CloudCheck] = Field(default_factory=list)
    reasons: list[Reason] = Field(default_factory=list)
    collector: str = Field(default="", max_length=128)
    duration_ms: float | None = Field(default=None, ge=0)

    @classmethod
    def of(
        cls,
        tier: CloudTier,
        updated_at: datetime,
        checks: Iterable[CloudCheck],
        *,
        collector: str = "",
        duration_ms: float | None = None,
    ) -> CloudSnapshot:
        ordered = sorted(checks, key=lambda c: c.name)
        reasons = [r for c in ordered if (r := c.as_reason()) is not None]
        return cls(
            tier=tier,
            updated_at=updated_at,
            status=Level.worst(*(c.status for c in ordered)),
            checks=ordered,
            reasons=reasons,
            collector=collector,
            duration_ms=duration_ms,
        )

    def check(self, name: str) -> CloudCheck | None:
        return next((c for c in self.checks if c.name == name), None)
