"""The samples of a spec over a store, enumerated from the manifest: where each one lies in time,
how long each of its streams is, and so what it costs in tokens. Nothing is read from shards."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mmdata.errors import SpecError
from mmdata.planning.packing.cost import TokensPer, token_costs
from mmdata.planning.specs import Audio, Sequences, Spec, Windows

# Times closer than a microsecond compare equal: stores written from float32 times (1.500000031 s for
# 45 frames at 30 fps) then give 45 anchors, not 46.
_EPS = 1e-6


@dataclass
class SampleTable:
    """One entry per sample: manifest row, time span [start, end), chunk number, shard number, and
    the source of a mixture it comes from (0 for a single store).

    For `Windows` a sample's span is the single anchor time (start == end); `lengths[stream]`
    is in the stream's unit (frames, values, or seconds of audio). Shard numbers are distinct
    across sources.
    """

    episode: np.ndarray
    start: np.ndarray
    end: np.ndarray
    chunk: np.ndarray
    shard: np.ndarray
    lengths: dict[str, np.ndarray]
    source: np.ndarray | None = None

    def __post_init__(self):
        if self.source is None:
            self.source = np.zeros(len(self.episode), np.int64)

    def __len__(self) -> int:
        return len(self.episode)

    def locate(self, numbers: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The samples `numbers`: source, episode (manifest row), start and end (as `SampleIndex.locate`)."""
        numbers = np.asarray(numbers, dtype=np.int64)
        assert self.source is not None
        return self.source[numbers], self.episode[numbers], self.start[numbers], self.end[numbers]

    def costs(self, tokens_per: TokensPer | None) -> np.ndarray:
        """Tokens per sample; streams missing from `tokens_per` count one token per unit."""
        per = {name: 1.0 for name in self.lengths}
        per.update(tokens_per or {})
        unknown = [name for name in per if name not in self.lengths]
        if unknown:
            raise SpecError(f"tokens_per names streams the spec does not read: {', '.join(unknown)}")
        return token_costs(self.lengths, per)


def enumerate_samples(table: pa.Table, spec: Spec, episodes: np.ndarray) -> SampleTable:
    """The samples of `spec` in the manifest rows `episodes`, in manifest and time order."""
    durations = table.column("duration").to_numpy()[episodes]
    shard_names = pc.fill_null(table.column("shard"), "").to_pylist()
    _, shard_codes = np.unique(np.asarray(shard_names, dtype=object), return_inverse=True)
    shards = shard_codes[episodes]
    if isinstance(spec, Windows):
        counts = np.array([max(1, math.ceil(d * spec.anchor_fps - _EPS)) for d in durations], dtype=np.int64)
        owner = np.repeat(np.arange(len(episodes)), counts)
        local = np.arange(len(owner)) - np.repeat(np.cumsum(counts) - counts, counts)
        start = local / spec.anchor_fps
        end = start.copy()
        lengths = {name: _window_length(stream, len(owner)) for name, stream in spec.streams.items()}
    elif isinstance(spec, Sequences):
        owner_list, starts, ends = [], [], []
        for position, duration in enumerate(durations):
            step = spec.max_seconds or duration
            for t0 in np.arange(0.0, duration - _EPS, step) if duration > 0 else [0.0]:
                t1 = min(t0 + step, duration)
                if t1 - t0 + _EPS >= spec.min_seconds and t1 > t0:
                    owner_list.append(position)
                    starts.append(t0)
                    ends.append(t1)
        owner = np.asarray(owner_list, dtype=np.int64)
        start, end = np.asarray(starts, dtype=np.float64), np.asarray(ends, dtype=np.float64)
        local = np.concatenate([np.arange(c) for c in np.bincount(owner, minlength=len(episodes))]).astype(np.int64)
        lengths = {name: _sequence_length(spec, name, start, end) for name in spec.streams}
    else:
        raise SpecError(f"spec must be mmdata.Windows or mmdata.Sequences, not {type(spec).__name__}")
    if len(owner) == 0:
        raise SpecError("the spec yields no sample from the selected episodes (are they shorter than min_seconds?)")
    return SampleTable(episodes[owner].astype(np.int64), start, end, local.astype(np.int64), shards[owner], lengths)


def concatenate_samples(tables: list[SampleTable]) -> SampleTable:
    """The samples of several sources as one table, source by source, with shard numbers made distinct."""
    if len(tables) == 1:
        return tables[0]
    offsets = np.cumsum([0] + [int(t.shard.max()) + 1 if len(t) else 0 for t in tables[:-1]])
    return SampleTable(
        np.concatenate([t.episode for t in tables]),
        np.concatenate([t.start for t in tables]),
        np.concatenate([t.end for t in tables]),
        np.concatenate([t.chunk for t in tables]),
        np.concatenate([t.shard + offset for t, offset in zip(tables, offsets)]),
        {name: np.concatenate([t.lengths[name] for t in tables]) for name in tables[0].lengths},
        np.concatenate([np.full(len(t), number, np.int64) for number, t in enumerate(tables)]),
    )


def grid_times(start: float, end: float, rate: float) -> np.ndarray:
    """The times start + k / rate inside [start, end): where a sequence reads a stream."""
    count = max(1, math.ceil((end - start) * rate - 1e-6))
    return start + np.arange(count) / rate


def audio_samples(window_seconds: float, sample_rate: int) -> int:
    """Samples in an audio window of `window_seconds` at `sample_rate` (windows are padded or cut to it)."""
    return max(1, round(window_seconds * sample_rate))


def _window_length(stream, count: int) -> np.ndarray:
    if isinstance(stream, Audio):
        return np.full(count, stream.window[1] - stream.window[0])
    return np.full(count, len(stream.offsets), dtype=np.float64)


def _sequence_length(spec: Sequences, name: str, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    if isinstance(spec.streams[name], Audio):
        return end - start
    rate = spec.rate_of(name)
    return np.array([len(grid_times(a, b, rate)) for a, b in zip(start, end)], dtype=np.float64)


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
