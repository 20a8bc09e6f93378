"""Aggregator settings: the shared AEGIS ones plus the window timing and catch-up knobs."""

from __future__ import annotations

from pydantic import Field

from aegis_folds.folds import FoldParams
from aegis_runtime.settings import AegisSettings


class AggregatorSettings(AegisSettings):
    """``AEGIS_*`` variables."""

    service: str = "aggregator"
    claim_lease_s: float = Field(
        default=120.0,
        gt=0,
        description="Seconds after which an unfinished window claim (its replica died) is taken "
        "over by another replica.",
    )
    fresh_for_s: float = Field(
        default=60.0,
        gt=0,
        description="Seconds a factory_state record counts as data after its event time (the "
        "windows' `coverage`).",
    )
    catchup_hours: float = Field(
        default=24.0,
        gt=0,
        le=168,
        description="How far back a tick looks for windows not yet written (after downtime), "
        "hours; never before the first aggregator ran on the table. Windows older than the "
        "HISTORY#STATE items are read from the state_snapshot objects.",
    )
    factory_concurrency: int = Field(
        default=8, ge=1, le=256, description="Factories one tick folds at once."
    )
    aggregate_read_concurrency: int = Field(
        default=32,
        ge=1,
        le=256,
        description="processed/ objects read at once for the window folds (which the daily "
        "report merges).",
    )
    # the report's fold parameters: the reporter's variables, so that it can use the windows
    report_gap_s: float = Field(
        default=60.0,
        gt=0,
        description="Seconds of silence between factory_state records that make a stale gap. "
        "The aggregator's windows fold with it too: set it the same for both, or the reporter "
        "reads the objects instead of the windows.",
    )
    report_sketch_alpha: float = Field(
        default=0.005,
        gt=0,
        lt=0.1,
        description="Relative accuracy of the p95 sketches. The aggregator's windows fold with it "
        "too: set it the same for both, or the reporter reads the objects instead of the "
        "windows.",
    )

    def fold_params(self) -> FoldParams:
        return FoldParams(gap_s=self.report_gap_s, alpha=self.report_sketch_alpha)
