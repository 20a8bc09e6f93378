"""Aggregator settings: the shared AEGIS ones plus the window timing and catch-up knobs."""

from __future__ import annotations

from pydantic import Field

from aegis_folds.folds import FoldParams
from aegis_runtime.settings import AegisSettings


class AggregatorSettings(AegisSettings):
    """``AEGIS_*`` variables."""

    service: str = "aggregator"
    # an unfinished claim (its replica died) is taken over after this long
    claim_lease_s: float = Field(default=120.0, gt=0)
    # a factory_state record counts as "data" for this long after its event time (coverage)
    fresh_for_s: float = Field(default=60.0, gt=0)
    # how far back a tick looks for windows without a finished claim (after downtime); windows
    # older than HISTORY#STATE holds are read from the state_snapshot objects
    catchup_hours: float = Field(default=24.0, gt=0, le=168)
    factory_concurrency: int = Field(default=8, ge=1, le=256)
    # processed/ objects read at once (the window folds the daily report merges)
    aggregate_read_concurrency: int = Field(default=32, ge=1, le=256)
    # the report's fold parameters: the same variables the reporter reads, so that it can use
    # the windows (with others it reads the objects instead)
    report_gap_s: float = Field(default=60.0, gt=0)
    report_sketch_alpha: float = Field(default=0.005, gt=0, lt=0.1)

    def fold_params(self) -> FoldParams:
        return FoldParams(gap_s=self.report_gap_s, alpha=self.report_sketch_alpha)
