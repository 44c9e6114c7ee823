"""Read one micro-batch: every sample's streams at the spec's times, video decoded in one batch.

Runs in DataLoader workers. Each sample is read from its source's store (one store, or the
sources of a mixture) under that source's names for the streams; a stream its source lacks is
padding of the shape every source agrees on, flagged in `is_pad`. Cameras are planned per
sample (which segments, which frames, at which crop and size), and the frames of all samples of
a stream go to the decoder in one call. With `defer_video` the worker does only the decoder's
host-side preparation (for DALI: joining segments into streams) and the prepared work travels
to the main process, where a GPU decoder takes the whole micro-batch at once (`finish_video`).
A sample that fails is named (source, shard, episode, stream) and either stops the run or is
replaced: by another sample of its micro-batch, or, when every sample of the micro-batch
failed, by one borrowed from the samples planned after it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from mmdata.codecs.audio import as_float
from mmdata.codecs.decoders import ClipRequest, VideoDecoder
from mmdata.codecs.geometry import frame_geometry
from mmdata.errors import DecodeError, MmdataError, SampleError
from mmdata.loading.timing import timed
from mmdata.planning.mixture import Filler, OpenSource
from mmdata.planning.samples import SampleRef, audio_samples, grid_times
from mmdata.planning.specs import Audio, Frames, Sequences, Spec, Values, Windows
from mmdata.store.handle import FramePlan, assemble_frames_at
from mmdata.store.manifest import Piece

OnError = Literal["raise", "skip"]
# Samples planned after a micro-batch that a worker carries with it, to borrow from when all of its own fail.
FALLBACK_SAMPLES = 32


@dataclass
class MicroBatch:
    """One rank's micro-batch, read: per stream, each sample's values and `is_pad` mask.

    `pending` holds cameras still to decode (deferred video); `failed` maps a sample's
    position to what went wrong; `replaced` lists (position, substitute position) pairs;
    `fallback` is the samples planned after this micro-batch (in plan order), of which
    `borrowed` maps a position to the one read in its place when every sample failed.
    `dim_is_pad` holds, per `Values(pad_to=...)` stream, each sample's mask of padded dimensions.
    """

    step: int
    samples: list[SampleRef]
    tasks: list[str]
    values: dict[str, list[Any]] = field(default_factory=dict)
    is_pad: dict[str, list[np.ndarray]] = field(default_factory=dict)
    pending: dict[str, PendingVideo] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    replaced: list[tuple[int, int]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    fallback: list[SampleRef] = field(default_factory=list)
    borrowed: dict[int, SampleRef] = field(default_factory=dict)
    dim_is_pad: dict[str, list[np.ndarray]] = field(default_factory=dict)
    failed_sources: dict[int, int] = field(default_factory=dict)


@dataclass
class PendingVideo:
    """One camera of a micro-batch between planning and decoding.

    `plans` per sample (None where it failed), the segment requests merged across samples
    (`merged`, and per plan request its (merged index, frame positions) in `sources`), the
    decoder's host-side preparation of them when it has one, and the shape of one delivered frame.
    """

    plans: list[FramePlan | None]
    merged: list[ClipRequest]
    sources: list[tuple[int, np.ndarray]]
    prepared: Any = None
    frame_shape: tuple[int, ...] = ()
    channels_first: bool = False


class SampleReader:
    """Reads micro-batches of a spec from its sources' stores (one reader per worker process).

    `sources` are the open stores (one, or a mixture's) with the stored name of each spec stream
    they have and their normalizers; `fillers` give each stream's shape for the padding of a
    source that lacks it. `video_decoder` decodes the cameras; with `defer_video` it only
    prepares them here (see `prepare_video`), for the main process to finish.
    """

    def __init__(
        self,
        sources: Sequence[OpenSource],
        spec: Spec,
        fillers: dict[str, Filler],
        video_decoder: VideoDecoder,
        on_error: OnError = "raise",
        defer_video: bool = False,
    ):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error is 'raise' or 'skip', not '{on_error}'")
        self.sources = list(sources)
        self.spec = spec
        self.fillers = fillers
        self.on_error = on_error
        self.defer_video = defer_video
        self.video_decoder = video_decoder

    @property
    def bytes_read(self) -> int:
        return sum(source.store.pieces.bytes_read for source in self.sources)

    def read(
        self,
        step: int,
        samples: Sequence[SampleRef],
        fallback: Sequence[SampleRef] = (),
        upcoming: Sequence[SampleRef] = (),
    ) -> MicroBatch:
        """Read a micro-batch; failed samples are replaced (see `settle`) unless video is still pending.
        `upcoming` are the samples this reader reads next: from object storage, their pieces are fetched
        in the background while this micro-batch decodes."""
        batch = MicroBatch(step, list(samples), [self._task(sample) for sample in samples], fallback=list(fallback))
        self._read_streams(batch, upcoming)
        if not batch.pending:
            self.settle(batch)
        return batch

    def _task(self, sample: SampleRef) -> str:
        return self.sources[sample.source].store.manifest.row(sample.episode)["task"]

    def settle(self, batch: MicroBatch) -> None:
        """Put a substitute in place of every failed sample (see `replace_failed`); when all of them
        failed, first borrow one sample from those planned after the micro-batch (`borrow`)."""
        batch.failed_sources = {p: batch.samples[p].source for p in batch.failed}
        if batch.failed and len(batch.failed) == len(batch.samples):
            self.borrow(batch)
        replace_failed(batch)

    def borrow(self, batch: MicroBatch) -> None:
        """Read, in place of the costliest failed sample, the first of `batch.fallback` that fits its
        cost and reads without error. The fallback is the rank's following samples in plan order,
        so the choice depends only on the plan and on which samples fail: a resumed run borrows the same."""
        target = max(batch.failed, key=lambda p: (batch.samples[p].cost, -p))
        reader = copy.copy(self)  # the same dataset, spec, decoder and normalizers; errors recorded, video decoded
        reader.on_error, reader.defer_video = "skip", False
        for candidate in batch.fallback:
            if candidate.cost > batch.samples[target].cost:
                continue
            alone = MicroBatch(batch.step, [candidate], [self._task(candidate)])
            reader._read_streams(alone)
            if alone.failed:
                continue
            batch.borrowed[target] = candidate
            batch.samples[target], batch.tasks[target] = candidate, alone.tasks[0]
            for name in alone.values:
                batch.values[name][target] = alone.values[name][0]
                batch.is_pad[name][target] = alone.is_pad[name][0]
            for name in alone.dim_is_pad:
                batch.dim_is_pad[name][target] = alone.dim_is_pad[name][0]
            return
        first = next(iter(batch.failed.values()))
        raise SampleError(
            f"every sample of step {batch.step}'s micro-batch failed, and none of the {len(batch.fallback)} samples"
            f" planned after it could be read in their place; the first failure: {first}"
        )

    def _read_streams(self, batch: MicroBatch, upcoming: Sequence[SampleRef] = ()) -> None:
        try:
            self._prefetch_segments(batch)
            self._fetch_ahead(upcoming)
            self._read_each_stream(batch)
        finally:
            for source in self.sources:
                source.store.pieces.forget()

    def _prefetch_segments(self, batch: MicroBatch) -> None:
        """Hand each store the pieces the micro-batch will read, so that from object storage they arrive in
        a few coalesced requests instead of one round trip each: first every piece the manifest rows point
        to (timestamps, low-dim and audio data, and the segments likely holding the frames), then the
        segments the stored timestamps show were missed."""
        if not any(source.store.pieces.fetches_ahead for source in self.sources):
            return
        with timed(batch.seconds, "read"):
            self._prefetch(batch, self._pieces_ahead)
            self._prefetch(batch, self._frame_pieces)

    def _fetch_ahead(self, upcoming: Sequence[SampleRef]) -> None:
        wanted: dict[int, list[Piece]] = {}
        for sample in upcoming:
            source = self.sources[sample.source]
            if source.store.pieces.fetches_ahead:
                with contextlib.suppress(MmdataError, OSError):  # the sample's own read reports it
                    wanted.setdefault(sample.source, []).extend(self._pieces_ahead(sample, source))
        for number, pieces in wanted.items():
            self.sources[number].store.pieces.prefetch_ahead(pieces)

    def _prefetch(self, batch: MicroBatch, pieces_of: Callable[[SampleRef, OpenSource], list[Piece]]) -> None:
        wanted: dict[int, list[Piece]] = {}
        for sample in batch.samples:
            source = self.sources[sample.source]
            if not source.store.pieces.fetches_ahead:
                continue
            try:
                wanted.setdefault(sample.source, []).extend(pieces_of(sample, source))
            except (MmdataError, OSError):
                continue  # reported by the read itself
        for number, pieces in wanted.items():
            self.sources[number].store.pieces.prefetch(pieces)

    def _pieces_ahead(self, sample: SampleRef, source: OpenSource) -> list[Piece]:
        streams: dict[str, np.ndarray | None] = {}
        for name, stream in self.spec.streams.items():
            stored = source.streams.get(name)
            if stored is not None:
                streams[stored] = self._times(sample, name, stream) if isinstance(stream, Frames) else None
        return source.store.pieces_ahead(sample.episode, streams)

    def _frame_pieces(self, sample: SampleRef, source: OpenSource) -> list[Piece]:
        pieces = []
        for name, stream in self.spec.streams.items():
            stored = source.streams.get(name)
            if isinstance(stream, Frames) and stored is not None:
                times = self._times(sample, name, stream)
                pieces += source.store.frame_pieces(sample.episode, stored, times, stream.tolerance)
        return pieces

    def _read_each_stream(self, batch: MicroBatch) -> None:
        samples = batch.samples
        for name, stream in self.spec.streams.items():
            if isinstance(stream, Frames):
                with timed(batch.seconds, "read"):
                    plans = [
                        self._attempt(batch, position, name, self._plan_frames, sample, name, stream)
                        for position, sample in enumerate(samples)
                    ]
                origins = [sample.source for sample in samples]
                prepare_video(
                    self.video_decoder, batch, name, plans, origins, self.fillers[name], stream.channels_first
                )
                if not self.defer_video:
                    finish_video(self.video_decoder, batch, self.on_error)
                continue
            read = self._values if isinstance(stream, Values) else self._audio
            with timed(batch.seconds, "audio" if isinstance(stream, Audio) else "lowdim"):
                for position, sample in enumerate(samples):
                    data = self._attempt(batch, position, name, read, sample, name, stream)
                    values, is_pad = data if data is not None else (None, None)
                    batch.values.setdefault(name, []).append(values)
                    batch.is_pad.setdefault(name, []).append(is_pad)
                    if isinstance(stream, Values) and stream.pad_to is not None:
                        batch.dim_is_pad.setdefault(name, []).append(self._dim_is_pad(sample, name, stream))

    def _attempt(self, batch: MicroBatch, position: int, stream: str, read: Callable[..., Any], *args: Any) -> Any:
        """`read(*args)`, or None when the sample already failed or fails now (recorded, or raised)."""
        if position in batch.failed:
            return None
        try:
            return read(*args)
        except (MmdataError, OSError) as exc:
            sample = batch.samples[position]
            source = self.sources[sample.source]
            where = (
                sample_place(sample, stream)
                if len(self.sources) == 1
                else f"source '{source.name}', " + sample_place(sample, stream)
            )
            message = (
                f"{where}: {exc}; run `mmdata verify {source.store.url}` to list every"
                " damaged episode, or pass on_error='skip'"
            )
            if self.on_error == "raise":
                raise SampleError(message) from exc
            batch.failed[position] = message
            return None

    def _plan_frames(self, sample: SampleRef, name: str, stream: Frames) -> FramePlan:
        source = self.sources[sample.source]
        times = self._times(sample, name, stream)
        stored = source.streams.get(name)
        if stored is None:
            return FramePlan([], np.zeros(len(times), np.int64), times, np.ones(len(times), bool))
        plan = source.store.plan_frames(sample.episode, stored, times, stream.tolerance)
        if stream.resize is None:
            return plan
        camera = source.store.schema.stream(stored)
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

    def _values(self, sample: SampleRef, name: str, stream: Values) -> tuple[np.ndarray, np.ndarray]:
        source = self.sources[sample.source]
        stored = source.streams.get(name)
        filler = self.fillers[name]
        if stored is None:
            count = len(self._times(sample, name, stream))
            return np.zeros((count, *filler.shape), filler.dtype), np.ones(count, bool)
        data = source.store.values_at(sample.episode, stored, self._times(sample, name, stream), stream.interpolation)
        values = data.values
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
        return values, data.is_pad

    def _dim_is_pad(self, sample: SampleRef, name: str, stream: Values) -> np.ndarray:
        source = self.sources[sample.source]
        stored = source.streams.get(name)
        width = int(source.store.schema.stream(stored).shape[0]) if stored is not None else 0
        return np.arange(stream.pad_to) >= width

    def _audio(self, sample: SampleRef, name: str, stream: Audio) -> tuple[np.ndarray, np.ndarray]:
        if isinstance(self.spec, Windows):
            t0, t1 = sample.start + stream.window[0], sample.start + stream.window[1]
        else:
            t0, t1 = sample.start, sample.end
        source = self.sources[sample.source]
        stored = source.streams.get(name)
        filler = self.fillers[name]
        if stored is None:
            count = audio_samples(t1 - t0, int(filler.rate))
            return np.zeros((count, *filler.shape), np.float32), np.ones(count, bool)
        data = source.store.audio_between(sample.episode, stored, t0, t1, stream.sample_rate, stream.mono)
        data.values = as_float(data.values)
        if not isinstance(self.spec, Windows):
            return data.values, data.is_pad
        rate = stream.sample_rate or source.store.schema.stream(stored).sample_rate
        wanted = audio_samples(t1 - t0, rate)
        values, is_pad = data.values[:wanted], data.is_pad[:wanted]
        if len(values) < wanted:
            missing = wanted - len(values)
            values = np.concatenate([values, np.zeros((missing, *values.shape[1:]), values.dtype)])
            is_pad = np.concatenate([is_pad, np.ones(missing, bool)])
        return values, is_pad

    def _times(self, sample: SampleRef, name: str, stream: Frames | Values) -> np.ndarray:
        if isinstance(self.spec, Sequences):
            return grid_times(sample.start, sample.end, self.spec.rate_of(name))
        return sample.start + np.asarray(stream.offsets)


def prepare_video(
    decoder: VideoDecoder,
    batch: MicroBatch,
    name: str,
    plans: list[FramePlan | None],
    sources: Sequence[int],
    frame: Filler,
    channels_first: bool = False,
) -> None:
    """Merge a camera's requests across the micro-batch (segments of the same source and geometry
    decode once) and do the decoder's host-side preparation."""
    with timed(batch.seconds, "video_prepare"):
        live = [p for p, plan in enumerate(plans) if plan is not None and p not in batch.failed]
        merged, located = merge_requests(
            [request for p in live for request in plans[p].requests],
            [sources[p] for p in live for _ in plans[p].requests],
        )
        prepare = getattr(decoder, "prepare", None)
        prepared = prepare(merged) if prepare is not None else None
        kept = [plans[p] if p in live else None for p in range(len(plans))]
        batch.pending[name] = PendingVideo(kept, merged, located, prepared, frame.shape, channels_first)


def finish_video(decoder: VideoDecoder, batch: MicroBatch, on_error: OnError) -> None:
    """Decode every pending camera of the micro-batch (one decoder call each) and fill in its values;
    the caller then settles the failed samples (`SampleReader.settle`)."""
    for name, pending in list(batch.pending.items()):
        with timed(batch.seconds, "video"):
            _finish_camera(decoder, batch, name, pending, on_error)
        del batch.pending[name]


def _finish_camera(decoder: VideoDecoder, batch: MicroBatch, name: str, pending: PendingVideo, on_error: OnError):
    try:
        if pending.prepared is not None:
            outputs = decoder.decode_prepared(pending.merged, *pending.prepared, on_error)
        else:
            outputs = decoder.decode(pending.merged, on_error)
    except DecodeError as exc:
        key = exc.where.episode if exc.where is not None else None
        culprit = next((s for s in batch.samples if s.key == key), batch.samples[0])
        raise SampleError(f"shard '{culprit.shard}', {exc}") from exc
    values: list[Any] = [None] * len(pending.plans)
    masks: list[Any] = [None] * len(pending.plans)
    like = next((out for out in outputs if out is not None), None)
    cursor = 0
    for p, plan in enumerate(pending.plans):
        if plan is None:
            continue
        sources = pending.sources[cursor : cursor + len(plan.requests)]
        cursor += len(plan.requests)
        if not plan.requests:  # the sample's source has no such camera
            values[p], masks[p] = _blank_frames(len(plan.positions), pending.frame_shape, like), plan.is_pad
            continue
        if any(outputs[m] is None for m, _ in sources):
            where = ", ".join(str(r.where) for r, (m, _) in zip(plan.requests, sources) if outputs[m] is None)
            batch.failed[p] = f"shard '{batch.samples[p].shard}', {where}: video does not decode"
            continue
        values[p] = gather_frames(outputs, sources, plan.positions, pending.channels_first)
        masks[p] = plan.is_pad
    batch.values[name], batch.is_pad[name] = values, masks


def _blank_frames(count: int, shape: tuple[int, ...], like: Any) -> Any:
    """Black frames standing in for a camera a source lacks, where the decoded frames live."""
    if like is None or isinstance(like, np.ndarray):
        return np.zeros((count, *shape), np.uint8)
    return like.new_zeros((count, *shape))


def gather_frames(
    outputs: list[Any], sources: list[tuple[int, np.ndarray]], positions: np.ndarray, channels_first: bool = False
) -> Any:
    """One sample's frames, in the order it asked for them, from the micro-batch's merged decoder
    outputs: its requests' frames are `outputs[m][picks]` for each (m, picks) of `sources`,
    concatenated, then taken at `positions`. Host frames are copied once, straight into place
    (transposed to `[T, 3, H, W]` on the way with `channels_first`)."""
    first = outputs[sources[0][0]]
    if not isinstance(first, np.ndarray):
        frames = assemble_frames_at(positions, [outputs[m][picks] for m, picks in sources])
        return frames.permute(0, 3, 1, 2).contiguous() if channels_first else frames
    ends = np.cumsum([len(picks) for _, picks in sources])
    height, width, channels = first.shape[1:]
    shape = (channels, height, width) if channels_first else (height, width, channels)
    frames = np.empty((len(positions), *shape), first.dtype)
    for row, position in enumerate(positions.tolist()):
        part = int(np.searchsorted(ends, position, side="right"))
        m, picks = sources[part]
        frame = outputs[m][picks[position - (ends[part] - len(picks))]]
        frames[row] = frame.transpose(2, 0, 1) if channels_first else frame
    return frames


def merge_requests(
    requests: Sequence[ClipRequest], scopes: Sequence[int] | None = None
) -> tuple[list[ClipRequest], list[tuple[int, np.ndarray]]]:
    """One request per segment (of one source, `scopes`, and one delivered geometry), for the union of
    the frames the samples ask of it.

    Windows of a shuffled micro-batch often share a segment (a 32-frame segment holds 3.2 s of
    10 Hz anchors); decoding it once serves them all. Returns the merged requests and, per
    original request, (merged index, positions of its frames in that request's output).
    """
    scopes = scopes if scopes is not None else [0] * len(requests)

    def key_of(request: ClipRequest, scope: int) -> Any:
        return (scope, request.where, request.geometry) if request.where is not None else id(request)

    index_of: dict[Any, int] = {}
    members: list[list[ClipRequest]] = []
    for request, scope in zip(requests, scopes):
        key = key_of(request, scope)
        if key not in index_of:
            index_of[key] = len(members)
            members.append([])
        members[index_of[key]].append(request)
    merged = []
    unions = []
    for group in members:
        union = np.unique(np.concatenate([np.asarray(r.frames, dtype=np.int64) for r in group]))
        first = group[0]
        merged.append(dataclasses.replace(first, frames=tuple(union.tolist())))
        unions.append(union)
    located = []
    for request, scope in zip(requests, scopes):
        m = index_of[key_of(request, scope)]
        located.append((m, np.searchsorted(unions[m], np.asarray(request.frames, dtype=np.int64))))
    return merged, located


def replace_failed(batch: MicroBatch) -> None:
    """Put in place of each failed sample a copy of another sample of the same micro-batch.

    The substitute is the sample of the largest cost not above the failed one's (so the
    micro-batch stays within its token budget; with equal costs, the next one after it), chosen
    only from samples that were read, so the choice is the same on every run. A failed sample
    with no such substitute is removed. Ranks keep their step count either way.
    """
    broken = sorted(p for p in batch.failed if p not in batch.borrowed)
    if not broken:
        return
    good = [p for p in range(len(batch.samples)) if p not in broken]
    if not good:
        first = next(iter(batch.failed.values()))
        raise SampleError(f"every sample of step {batch.step}'s micro-batch failed; the first: {first}")
    removed = []
    for position in broken:
        cost = batch.samples[position].cost
        fitting = [p for p in good if batch.samples[p].cost <= cost]
        if not fitting:
            removed.append(position)
            continue
        best = max(batch.samples[p].cost for p in fitting)
        candidates = [p for p in fitting if batch.samples[p].cost == best]
        substitute = min(candidates, key=lambda p: (p - position) % len(batch.samples))
        batch.replaced.append((position, substitute))
        batch.samples[position] = batch.samples[substitute]
        batch.tasks[position] = batch.tasks[substitute]
        for name in batch.values:
            batch.values[name][position] = batch.values[name][substitute]
            batch.is_pad[name][position] = batch.is_pad[name][substitute]
        for name in batch.dim_is_pad:
            batch.dim_is_pad[name][position] = batch.dim_is_pad[name][substitute]
    for position in reversed(removed):
        del batch.samples[position], batch.tasks[position]
        for name in batch.values:
            del batch.values[name][position], batch.is_pad[name][position]
        for name in batch.dim_is_pad:
            del batch.dim_is_pad[name][position]


def sample_place(sample: SampleRef, stream: str) -> str:
    """Where a sample lives, for error messages: shard, episode, stream, time."""
    return (
        f"shard '{sample.shard}', episode '{sample.key}', stream '{stream}'"
        f" (sample {sample.index} at t={sample.start:.3f} s)"
    )
