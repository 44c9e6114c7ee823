"""A planned sample (`SampleRef`: what the chain reads for one sample of a step) and the time grids a sample's
streams are read on."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def grid_times(start: float, end: float, rate: float) -> np.ndarray:
    """The times start + k / rate inside [start, end): where a sequence reads a stream."""
    count = max(1, math.ceil((end - start) * rate - 1e-6))
    return start + np.arange(count) / rate


def audio_samples(window_seconds: float, sample_rate: int) -> int:
    """Samples in an audio window of `window_seconds` at `sample_rate` (windows are padded or cut to it)."""
    return max(1, round(window_seconds * sample_rate))


@dataclass(frozen=True)
class SampleRef:
    """A planned sample: its number in the loader's sample table, episode (row, key, shard), time span,
    cost, source, and `draw` (seed, epoch, slot): what its random choices (crops) are drawn from."""

    index: int
    episode: int
    key: str
    shard: str
    start: float
    end: float
    chunk: int
    cost: int
    source: int = 0
    draw: tuple[int, int, int] = (0, 0, 0)
