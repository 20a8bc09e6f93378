"""Aggregator settings: the shared AEGIS ones plus the window timing and catch-up knobs."""

from __future__ import annotations

from pydantic import Field

from aegis_folds.folds import FoldParams
from aegis_runtime.settings import AegisSettings


class AggregatorSettings(AegisSettings):
    """``AEGIS_*`` variables."""

    service: str = "aggregator"
    # a window is aggregated this long after it ends (late commits land first)
    aggregate_delay_s: float = Field(default=15.0, ge=0, le=240)
    # an unfinished claim (its replica died) is taken over after this long
    claim_lease_s: float = Field(default=120.0, gt=0)
    # a factory_state record counts as "data" for this long after its event time (coverage)
    fresh_for_s: float = Field(default=60.0, gt=0)
    # windows looked back over after downtime; None: as far as HISTORY#STATE holds (its TTL)
    catchup_windows: int | None = Field(default=None, ge=0, le=2016)
    factory_concurrency: int = Field(default=8, ge=1, le=256)
    # processed/ objects read at once (the window folds the daily report merges)
    aggregate_read_concurrency: int = Field(default=32, ge=1, le=256)
    # the report's fold parameters: the same variables the reporter reads, so that it can use
    # the windows (with others it reads the objects instead)
    report_gap_s: float = Field(default=60.0, gt=0)
    report_sketch_alpha: float = Field(default=0.005, gt=0, lt=0.1)

    def fold_params(self) -> FoldParams:
        return FoldParams(gap_s=self.report_gap_s, alpha=self.report_sketch_alpha)
