"""Count, mean, spread and range of rows of values, mergeable exactly across episodes and processes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Moments:
    """Count, mean, sum of squared deviations, min and max per dimension; mergeable exactly."""

    count: int = 0
    mean: np.ndarray = field(default_factory=lambda: np.zeros(0))
    m2: np.ndarray = field(default_factory=lambda: np.zeros(0))
    low: np.ndarray = field(default_factory=lambda: np.zeros(0))
    high: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @classmethod
    def of(cls, values: np.ndarray) -> Moments:
        """The moments of rows `values` `[N, D]` (float64 inside)."""
        rows = np.asarray(values, np.float64).reshape(len(values), -1)
        if not len(rows):
            return cls()
        mean = rows.mean(axis=0)
        return cls(len(rows), mean, ((rows - mean) ** 2).sum(axis=0), rows.min(axis=0), rows.max(axis=0))

    @classmethod
    def of_levels(cls, levels: np.ndarray, counts: np.ndarray) -> Moments:
        """The moments of dimensions whose values take only `levels` `[K]`, with `counts` `[D, K]` of each
        (pixels: 256 levels): exact, and a histogram's cost instead of a float copy of every value."""
        counts = np.asarray(counts, np.float64)
        total = counts.sum(axis=1)
        if not total.any():
            return cls()
        levels = np.asarray(levels, np.float64)
        mean = counts @ levels / total
        m2 = (counts * (levels[None, :] - mean[:, None]) ** 2).sum(axis=1)
        seen = counts > 0
        low = np.array([levels[row].min() for row in seen])
        high = np.array([levels[row].max() for row in seen])
        return cls(int(total[0]), mean, m2, low, high)

    def merge(self, other: Moments) -> Moments:
        """The moments of both sets of rows together (Chan, Golub and LeVeque's pairwise update)."""
        if not other.count:
            return self
        if not self.count:
            return other
        count = self.count + other.count
        delta = other.mean - self.mean
        mean = self.mean + delta * other.count / count
        m2 = self.m2 + other.m2 + delta**2 * self.count * other.count / count
        return Moments(count, mean, m2, np.minimum(self.low, other.low), np.maximum(self.high, other.high))

    @property
    def std(self) -> np.ndarray:
        """Population standard deviation (what normalizing by the data's spread uses)."""
        return np.sqrt(self.m2 / self.count) if self.count else self.m2

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            **{k: getattr(self, k).tolist() for k in ("mean", "m2", "low", "high")},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Moments:
        """Moments saved by `to_json`; ValueError when they are not that."""
        try:
            arrays = [np.asarray(data[k], np.float64) for k in ("mean", "m2", "low", "high")]
            count = int(data["count"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"saved moments are damaged: {exc!r}") from exc
        if count < 0 or len({a.shape for a in arrays}) != 1 or arrays[0].ndim != 1:
            raise ValueError("saved moments are damaged: inconsistent shapes")
        return cls(count, *arrays)


def mixture_figures(
    shares: Sequence[float] | np.ndarray,
    means: Sequence[np.ndarray],
    stds: Sequence[np.ndarray],
    lows: Sequence[np.ndarray],
    highs: Sequence[np.ndarray],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean, population std, min and max of a mixture whose parts (each with its mean, std, min and
    max per dimension) weigh `shares` (summing to one); parts of share 0 are left out of the range."""
    mean = sum(w * m for w, m in zip(shares, means))
    second = sum(w * (s**2 + m**2) for w, m, s in zip(shares, means, stds))
    low = np.min([x for w, x in zip(shares, lows) if w > 0], axis=0)
    high = np.max([x for w, x in zip(shares, highs) if w > 0], axis=0)
    return mean, np.sqrt(np.maximum(second - mean**2, 0.0)), low, high
