"""5-minute window statistics: the body of GRAPH#5M items and processed_agg/ objects.

The aggregator computes them from the HISTORY#STATE snapshots of one window; the dashboard's
6/12/24 h charts and the reporter read them. Definitions (``aegis_aggregator.stats`` computes them):

- ``samples``: HISTORY#STATE snapshots with ``start <= updated_at < end`` (live ones).
- sensor, AI and infra statistics are over the distinct device records those snapshots carry (one
  factory_state message appears in every snapshot until the next one arrives: it counts once).
- ``coverage``: the share of the window in which the factory had fresh data: the union of
  ``[event_time, event_time + fresh_for)`` over its factory_state records, clipped to the window.
- risk: each snapshot's risk holds from its ``updated_at`` to the next snapshot's (or the window
  end); ``seconds_at_level`` and the time-weighted ``mean_score`` are over that time only (before
  the window's first snapshot nothing is known).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from aegis_contracts.state import Level
from aegis_contracts.times import Timestamp


class _Stats(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SeriesStats(_Stats):
    """min/max/avg/last of one numeric series; ``last`` is the value of the latest record."""

    count: int = Field(ge=1)
    min: float
    max: float
    avg: float
    last: float


class LabelStats(_Stats):
    count: int = Field(ge=1)
    max_confidence: float = Field(ge=0, le=1)


class RiskStats(_Stats):
    max_score: float
    mean_score: float | None  # None when no time in the window is covered by a snapshot
    worst_level: Level
    seconds_at_level: dict[Level, float]
    reasons: list[str] = Field(default_factory=list)  # reason codes seen, sorted


class WindowStats(_Stats):
    window_start: Timestamp
    window_end: Timestamp
    samples: int = Field(ge=0)
    first_sample_at: Timestamp | None = None
    last_sample_at: Timestamp | None = None
    factory_records: int = Field(ge=0)
    infra_records: int = Field(ge=0)
    coverage: float = Field(ge=0, le=1)
    sensors: dict[str, SeriesStats] = Field(default_factory=dict)
    detections: dict[str, LabelStats] = Field(default_factory=dict)
    risk: RiskStats | None = None
    infra: dict[str, SeriesStats] = Field(default_factory=dict)
    camera_online_ratio: float | None = Field(default=None, ge=0, le=1)
    cameras: dict[str, float] = Field(default_factory=dict)  # camera id -> online ratio
    pipeline_states: dict[str, int] = Field(default_factory=dict)  # status -> snapshots
