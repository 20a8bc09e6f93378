"""A mergeable quantile sketch of fixed relative accuracy (DDSketch's log-spaced bins, kept simple).

Every value ``x`` with ``|x| > MIN_MAGNITUDE`` falls in bin ``i = ceil(log_gamma |x|)`` (one store
for positive, one for negative values; the rest count as zero), with
``gamma = (1 + alpha) / (1 - alpha)``. A quantile is answered with the representative
``2 gamma^i / (gamma + 1)`` of the bin that holds the nearest-rank value, which is within a relative
error of ``alpha`` of that value (``alpha`` = 0.5 % by default). Merging adds bin counts, so hourly
sketches fold into a day without keeping a single sample; the number of bins is bounded by the
range of magnitudes (about 700 for 0.01 to 1,000,000 at 0.5 %), not by the number of values.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

DEFAULT_ALPHA = 0.005
MIN_MAGNITUDE = 1e-9


class QuantileSketch:
    __slots__ = ("_log_gamma", "alpha", "count", "neg", "pos", "zero")

    def __init__(self, alpha: float = DEFAULT_ALPHA) -> None:
        if not 0 < alpha < 1:
            raise ValueError("alpha must be in (0, 1)")
        self.alpha = alpha
        self._log_gamma = math.log((1 + alpha) / (1 - alpha))
        self.pos: dict[int, int] = {}
        self.neg: dict[int, int] = {}
        self.zero = 0
        self.count = 0

    @classmethod
    def of(cls, values: Iterable[float], alpha: float = DEFAULT_ALPHA) -> QuantileSketch:
        sketch = cls(alpha)
        for v in values:
            sketch.add(v)
        return sketch

    def _index(self, magnitude: float) -> int:
        return math.ceil(math.log(magnitude) / self._log_gamma)

    def _value(self, index: int) -> float:
        gamma = math.exp(self._log_gamma)
        return 2 * math.exp(index * self._log_gamma) / (gamma + 1)

    def add(self, value: float) -> None:
        if not math.isfinite(value):
            raise ValueError("a sketch takes finite values only")
        self.count += 1
        if abs(value) <= MIN_MAGNITUDE:
            self.zero += 1
            return
        store = self.pos if value > 0 else self.neg
        i = self._index(abs(value))
        store[i] = store.get(i, 0) + 1

    def merge(self, other: QuantileSketch) -> None:
        if other.alpha != self.alpha:
            raise ValueError("sketches of different accuracy do not merge")
        for mine, theirs in ((self.pos, other.pos), (self.neg, other.neg)):
            for i, c in theirs.items():
                mine[i] = mine.get(i, 0) + c
        self.zero += other.zero
        self.count += other.count

    def quantile(self, q: float) -> float | None:
        """The nearest-rank ``q`` quantile (rank ``ceil(q n)``), within ``alpha`` relative."""
        if not 0 <= q <= 1:
            raise ValueError("q must be in [0, 1]")
        if self.count == 0:
            return None
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for i in sorted(self.neg, reverse=True):  # most negative first
            seen += self.neg[i]
            if seen >= rank:
                return -self._value(i)
        seen += self.zero
        if seen >= rank:
            return 0.0
        for i in sorted(self.pos):
            seen += self.pos[i]
            if seen >= rank:
                return self._value(i)
        raise AssertionError("counts do not add up")  # pragma: no cover

    def to_json(self) -> dict[str, Any]:
        """A stable form: bins as sorted ``[index, count]`` pairs."""
        return {
            "alpha": self.alpha,
            "count": self.count,
            "zero": self.zero,
            "pos": [[i, self.pos[i]] for i in sorted(self.pos)],
            "neg": [[i, self.neg[i]] for i in sorted(self.neg)],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> QuantileSketch:
        sketch = cls(float(data["alpha"]))
        sketch.count = int(data["count"])
        sketch.zero = int(data["zero"])
        sketch.pos = {int(i): int(c) for i, c in data["pos"]}
        sketch.neg = {int(i): int(c) for i, c in data["neg"]}
        return sketch
