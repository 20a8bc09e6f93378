"""The risk rules: a TOML file validated into frozen pydantic models at start-up.

``load_rules(None)`` reads the packaged ``rules.toml``; an invalid file fails start-up with a
:class:`RulesError` that names the offending field. No network, no clock: the domain reads these.
"""

from __future__ import annotations

import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

Severity = Literal["WARNING", "CRITICAL"]
CODE = r"^[A-Z][A-Z0-9_]{0,63}$"
NAME = r"^[a-z][a-z0-9_]{0,63}$"


class RulesError(ValueError):
    """The rules file is missing, not TOML, or breaks the schema."""


class _Rules(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Threshold(_Rules):
    """A numeric reading's WARNING/CRITICAL thresholds (inclusive); either may be left out."""

    code: str = Field(pattern=CODE)
    warning: float | None = None
    critical: float | None = None
    direction: Literal["above", "below"] = "above"
    unit: str = Field(default="", max_length=16)

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.warning is None and self.critical is None:
            raise ValueError("set warning, critical or both")
        if self.warning is not None and self.critical is not None:
            if self.direction == "above" and self.warning > self.critical:
                raise ValueError("warning must not exceed critical for direction 'above'")
            if self.direction == "below" and self.warning < self.critical:
                raise ValueError("warning must not be below critical for direction 'below'")
        return self

    def severity_of(self, value: float) -> tuple[Severity, float] | None:
        """The severity a reading reaches and the threshold it crossed, or None."""
        above = self.direction == "above"
        levels: tuple[tuple[Severity, float | None], ...] = (
            ("CRITICAL", self.critical),
            ("WARNING", self.warning),
        )
        for severity, threshold in levels:
            if threshold is not None and (value >= threshold if above else value <= threshold):
                return severity, threshold
        return None


class AiRule(_Rules):
    code: str = Field(pattern=CODE)
    severity: Severity
    min_confidence: float = Field(ge=0, le=1)


class Flag(_Rules):
    """A yes/no condition (camera offline, stage down) and the severity it carries."""

    code: str = Field(pattern=CODE)
    severity: Severity


class InfraRules(_Rules):
    host: dict[str, Threshold] = Field(default_factory=dict)
    network: dict[str, Threshold] = Field(default_factory=dict)
    camera_offline: Flag = Flag(code="CAMERA_OFFLINE", severity="WARNING")
    stage_down: Flag = Flag(code="PIPELINE_STAGE_DOWN", severity="CRITICAL")
    stage_degraded: Flag = Flag(code="PIPELINE_STAGE_DEGRADED", severity="WARNING")

    @model_validator(mode="after")
    def _known_fields(self) -> Self:
        host = {"cpu_pct", "mem_pct", "disk_pct", "temperature_c", "uptime_s"}
        if unknown := set(self.host) - host:
            raise ValueError(f"infra.host has no field(s) {sorted(unknown)}")
        if unknown := set(self.network) - {"rtt_ms", "loss_pct"}:
            raise ValueError(f"infra.network has no field(s) {sorted(unknown)}")
        return self


class StalenessRules(_Rules):
    stale_after_s: float = Field(default=60, gt=0)
    stale_code: str = Field(default="STALE_DATA", pattern=CODE)
    stale_severity: Severity = "WARNING"
    offline_after_s: float = Field(default=300, gt=0)
    offline_code: str = Field(default="FACTORY_OFFLINE", pattern=CODE)
    offline_severity: Severity = "CRITICAL"

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.offline_after_s <= self.stale_after_s:
            raise ValueError("offline_after_s must be greater than stale_after_s")
        return self

    @property
    def codes(self) -> frozenset[str]:
        return frozenset({self.stale_code, self.offline_code})


class ScoreRules(_Rules):
    """Score bands per level; see :func:`aegis_processor.domain.score_for`."""

    warning_base: float = Field(default=40, gt=0, lt=100)
    warning_cap: float = Field(default=69, gt=0, le=100)
    critical_base: float = Field(default=70, gt=0, le=100)
    critical_cap: float = Field(default=100, gt=0, le=100)

    @model_validator(mode="after")
    def _bands(self) -> Self:
        if not (self.warning_base <= self.warning_cap < self.critical_base <= self.critical_cap):
            raise ValueError(
                "need warning_base <= warning_cap < critical_base <= critical_cap <= 100"
            )
        return self


class RiskRules(_Rules):
    version: str = Field(min_length=1, max_length=64)
    sensors: dict[str, Threshold] = Field(default_factory=dict)
    ai: dict[str, AiRule] = Field(default_factory=dict)
    infra: InfraRules = InfraRules()
    staleness: StalenessRules = StalenessRules()
    score: ScoreRules = ScoreRules()

    @model_validator(mode="after")
    def _names(self) -> Self:
        for group, names in (("sensors", self.sensors), ("ai", self.ai)):
            bad = [n for n in names if re.fullmatch(NAME, n) is None]
            if bad:
                raise ValueError(f"{group}: invalid name(s) {bad}")
        return self

    def with_staleness(self, stale_after_s: float | None, offline_after_s: float | None) -> Self:
        """These rules with the staleness thresholds overridden (settings win over the file)."""
        if stale_after_s is None and offline_after_s is None:
            return self
        staleness = StalenessRules.model_validate(
            {
                **self.staleness.model_dump(),
                **({"stale_after_s": stale_after_s} if stale_after_s is not None else {}),
                **({"offline_after_s": offline_after_s} if offline_after_s is not None else {}),
            }
        )
        return self.model_copy(update={"staleness": staleness})


def parse_rules(text: str, *, source: str = "<rules>") -> RiskRules:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise RulesError(f"{source}: not TOML: {err}") from None
    try:
        return RiskRules.model_validate(data)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in err.errors()
        )
        raise RulesError(f"{source}: {problems}") from None


def default_rules_text() -> str:
    return resources.files("aegis_processor").joinpath("rules.toml").read_text(encoding="utf-8")


def load_rules(path: Path | str | None = None) -> RiskRules:
    """The rules from ``path``, or the packaged ``rules.toml`` when ``path`` is None."""
    if path is None:
        return parse_rules(default_rules_text(), source="rules.toml (packaged)")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise RulesError(f"{path}: cannot read rules file: {err.strerror}") from None
    return parse_rules(text, source=str(path))
