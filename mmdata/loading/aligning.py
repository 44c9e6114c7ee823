"""Stage 3 of the loading chain, align (runs where the micro-batch is read: a worker, or the main
process with `num_workers=0`): every stream of a planned sample at the spec's times.

A camera's times map to stored frames and the segments holding them (a `FrameRequests`, not yet read:
the fetch stage fetches the pieces it names and the decode stage decodes them); a low-dim stream's
values are interpolated at its times; audio is cut to its window. Each sample is read from its
source's store under that source's names; a stream its source lacks is padding of the shape every
source agrees on (`fillers`), flagged in `is_pad`.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence

import numpy as np

from mmdata.codecs.audio import as_float
from mmdata.codecs.geometry import frame_geometry
from mmdata.errors import MmdataError
from mmdata.planning.mixture import Filler, OpenSource
from mmdata.planning.samples import SampleRef, audio_samples, grid_times
from mmdata.planning.specs import Audio, Frames, Sequences, Spec, Values, Windows
from mmdata.store.handle import FrameRequests, StreamData


class Aligner:
    """Reads a spec's streams of planned samples from their sources' stores."""

    def __init__(self, sources: Sequence[OpenSource], spec: Spec, fillers: dict[str, Filler]):
        self.sources = list(sources)
        self.spec = spec
        self.fillers = fillers

    def stored_names(self, sample: SampleRef, only: type | None = None) -> list[str]:
        """The stored names of the spec's streams (of type `only`, e.g. `Frames`: the cameras) that the sample's
        source has."""
        streams = self.sources[sample.source].streams
        wanted = self.spec.streams.items()
        return [streams[name] for name, spec in wanted if name in streams and (only is None or isinstance(spec, only))]

    def frames(self, sample: SampleRef, name: str, stream: Frames) -> FrameRequests:
        """Which frames of which segments camera `name` of `sample` needs, at the size it is delivered at;
        the segments are not read."""
        source = self.sources[sample.source]
        times = self.times(sample, name, stream)
        stored = source.streams.get(name)
        if stored is None:
            return FrameRequests([], np.zeros(len(times), np.int64), times, np.ones(len(times), bool))
        plan = source.store.align_frames(sample.episode, stored, times, stream.tolerance)
        if stream.resize is None:
            return plan
        camera = source.store.schema.video(stored)
        resize = stream.resize
        rng = np.random.default_rng([*sample.draw, zlib.crc32(name.encode())]) if resize.crop else None
        geometry = frame_geometry(
            camera.width,
            camera.height,
            resize.size,
            resize.mode,
            resize.interpolation,
            resize.crop,
            resize.scale,
            resize.ratio,
            rng,
        )
        plan.requests = [dataclasses.replace(r, geometry=geometry) for r in plan.requests]
        return plan

    def values(self, sample: SampleRef, name: str, stream: Values) -> tuple[np.ndarray, np.ndarray]:
        """Low-dim `name` at the sample's times, normalized and widened to the shape all sources share."""
        source = self.sources[sample.source]
        stored = source.streams.get(name)
        filler = self.fillers[name]
        if stored is None:
            count = len(self.times(sample, name, stream))
            return np.zeros((count, *filler.shape), filler.dtype), np.ones(count, bool)
        data = source.store.values_at(sample.episode, stored, self.times(sample, name, stream), stream.interpolation)
        return self._shared_shape(source, name, data.values), _padding(data)

    def values_of(
        self, samples: Sequence[SampleRef], name: str, stream: Values
    ) -> list[tuple[np.ndarray, np.ndarray] | None]:
        """`values` of a micro-batch's samples, read once per episode for all of its samples' times (values
        at a time do not depend on the other times asked with it). None for a sample whose source lacks the
        stream or whose episode failed to read: `values` reads it alone, and names what went wrong."""
        found: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(samples)
        episodes: dict[tuple[int, int], list[int]] = {}
        for position, sample in enumerate(samples):
            episodes.setdefault((sample.source, sample.episode), []).append(position)
        for (number, episode), positions in episodes.items():
            source = self.sources[number]
            stored = source.streams.get(name)
            if stored is None:
                continue
            times = [self.times(samples[position], name, stream) for position in positions]
            try:
                data = source.store.values_at(episode, stored, np.concatenate(times), stream.interpolation)
            except (MmdataError, OSError):
                continue
            values, is_pad, start = self._shared_shape(source, name, data.values), _padding(data), 0
            for position, count in zip(positions, map(len, times)):
                found[position] = values[start : start + count], is_pad[start : start + count]
                start += count
        return found

    def _shared_shape(self, source: OpenSource, name: str, values: np.ndarray) -> np.ndarray:
        """A source's values of `name` normalized (where it asks) and widened to the dtype and shape all
        sources share."""
        filler = self.fillers[name]
        if name in source.normalizers:
            shift, scale = source.normalizers[name]
            flat = values.reshape(len(values), -1).astype(np.float32)
            values = ((flat - shift) / scale).reshape(values.shape)
        if values.dtype != filler.dtype:
            values = values.astype(filler.dtype)
        if values.shape[1:] != filler.shape:
            padded = np.zeros((len(values), *filler.shape), filler.dtype)
            padded[:, : values.shape[1]] = values
            values = padded
        return values

    def dim_is_pad(self, sample: SampleRef, name: str, stream: Values) -> np.ndarray:
        """Which of the `pad_to` dimensions of `name` the sample's source does not have."""
        source = self.sources[sample.source]
        stored = source.streams.get(name)
        width = int(source.store.schema.lowdim(stored).shape[0]) if stored is not None else 0
        return np.arange(stream.pad_to or 0) >= width

    def audio(self, sample: SampleRef, name: str, stream: Audio) -> tuple[np.ndarray, np.ndarray]:
        """Audio `name` over the sample's window (a window's offsets, or a sequence's span), as float32."""
        if isinstance(self.spec, Windows):
            t0, t1 = sample.start + stream.window[0], sample.start + stream.window[1]
        else:
            t0, t1 = sample.start, sample.end
        source = self.sources[sample.source]
        stored = source.streams.get(name)
        filler = self.fillers[name]
        if stored is None:
            assert filler.rate is not None, "an audio stream's filler has the sources' rate"
            count = audio_samples(t1 - t0, int(filler.rate))
            return np.zeros((count, *filler.shape), np.float32), np.ones(count, bool)
        data = source.store.audio_between(sample.episode, stored, t0, t1, stream.sample_rate, stream.mono)
        data.values = as_float(data.values)
        if not isinstance(self.spec, Windows):
            return data.values, _padding(data)
        rate = stream.sample_rate or source.store.schema.audio(stored).sample_rate
        wanted = audio_samples(t1 - t0, rate)
        values, is_pad = data.values[:wanted], _padding(data)[:wanted]
        if len(values) < wanted:
            missing = wanted - len(values)
            values = np.concatenate([values, np.zeros((missing, *values.shape[1:]), values.dtype)])
            is_pad = np.concatenate([is_pad, np.ones(missing, bool)])
        return values, is_pad

    def times(self, sample: SampleRef, name: str, stream: Frames | Values) -> np.ndarray:
        return sample_times(self.spec, name, stream, sample.start, sample.end)


def sample_times(spec: Spec, name: str, stream: Frames | Values, start: float, end: float) -> np.ndarray:
    """Where a sample spanning [start, end) reads stream `name`: its window's offsets from the anchor, or a
    sequence's grid at the stream's rate."""
    if isinstance(spec, Sequences):
        return grid_times(start, end, spec.rate_of(name))
    return start + np.asarray(stream.offsets)


def _padding(data: StreamData) -> np.ndarray:
    """The `is_pad` of values read at times asked for (the store sets it for every such read)."""
    assert data.is_pad is not None, "values at times asked for say which lay outside the episode"
    return data.is_pad
