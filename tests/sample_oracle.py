"""A test oracle: the samples of a spec over a manifest enumerated one by one, each its own row, by plain loops
(the sample index numbers them without a row per sample; the tests hold it to this)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

import mmdata
from mmdata.planning.packing.cost import token_costs

_EPS = 1e-6


@dataclass
class EnumeratedSamples:
    """One entry per sample: manifest row, time span [start, end), chunk number and each stream's length."""

    episode: np.ndarray
    start: np.ndarray
    end: np.ndarray
    chunk: np.ndarray
    lengths: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.episode)

    def costs(self, tokens_per) -> np.ndarray:
        per = {name: 1.0 for name in self.lengths} | dict(tokens_per or {})
        return token_costs(self.lengths, per)


def enumerate_samples(table: pa.Table, spec, episodes: np.ndarray) -> EnumeratedSamples:
    """The samples of `spec` in the manifest rows `episodes`, in manifest and time order."""
    durations = table.column("duration").to_numpy()[episodes]
    rows, starts, ends, chunks = [], [], [], []
    for row, duration in zip(np.asarray(episodes).tolist(), durations.tolist()):
        if isinstance(spec, mmdata.Windows):
            spans = [
                (k / spec.anchor_fps, k / spec.anchor_fps)
                for k in range(max(1, math.ceil(duration * spec.anchor_fps - _EPS)))
            ]
        else:
            step = spec.max_seconds or duration
            spans = []
            for t0 in np.arange(0.0, duration - _EPS, step) if duration > 0 else [0.0]:
                t1 = min(t0 + step, duration)
                if t1 - t0 + _EPS >= spec.min_seconds and t1 > t0:
                    spans.append((float(t0), float(t1)))
        for chunk, (t0, t1) in enumerate(spans):
            rows.append(row)
            starts.append(t0)
            ends.append(t1)
            chunks.append(chunk)
    if not rows:
        raise mmdata.errors.SpecError("the spec yields no sample from the selected episodes")
    start, end = np.asarray(starts, np.float64), np.asarray(ends, np.float64)
    lengths = {name: _lengths(spec, name, start, end) for name in spec.streams}
    return EnumeratedSamples(np.asarray(rows, np.int64), start, end, np.asarray(chunks, np.int64), lengths)


def _lengths(spec, name: str, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    stream = spec.streams[name]
    if isinstance(spec, mmdata.Windows):
        width = stream.window[1] - stream.window[0] if isinstance(stream, mmdata.Audio) else len(stream.offsets)
        return np.full(len(start), float(width))
    if isinstance(stream, mmdata.Audio):
        return end - start
    rate = spec.rate_of(name)
    return np.array([max(1, math.ceil((b - a) * rate - 1e-6)) for a, b in zip(start, end)], dtype=np.float64)
