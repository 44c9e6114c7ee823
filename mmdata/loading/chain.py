"""The loading chain, stage by stage, in the order the data flows:

    plan     `mmdata.planning.planner`  manifest -> samples -> order -> packed steps per rank
                                         (main process; workers plan the epochs after the first)
    fetch    `loading.fetching`            pieces from object storage, coalesced, ahead of use (worker)
    align    `loading.aligning`            each stream at the samples' times: frame plans, values, audio (worker)
    decode   `loading.decoding`           each camera's frames of the micro-batch in one decoder call
                                         (worker; or prepared in the worker and decoded in the main process)
    settle   `loading.settling`           substitutes for failed samples (where decoding ran)
    collate  `loading.collate`          packed or padded tensors (where decoding ran)
    device   `loading.assembly`          pinned host tensors to the GPU (main process)

`BatchReader.read` runs the front half for one micro-batch, each stage once and timed under its own
`timing.Stage`: fetch the rows, align the cameras, fetch the segments (and the next steps' ahead), plan the
frame cache, the low-dim values and audio, fetch and prepare each camera for decoding. `BatchReader.finish`
is the one ending of the chain, decode -> settle -> collate, whichever process runs it: the worker when it
decodes, the main process when the worker left the video pending. A read's own options (`ReadScope`) are
passed down explicitly, so a lone sample read for `settle` is read by the same code with its own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mmdata.codecs.decoders import VideoDecoder
from mmdata.errors import MmdataError, OptionError, SampleError
from mmdata.loading.aligning import Aligner
from mmdata.loading.collate import collate
from mmdata.loading.decoding import finish_video, prepare_video, segment_key
from mmdata.loading.fetching import Fetcher
from mmdata.loading.frame_cache import HORIZON, CacheSchedule, FrameCache, FrameCacheStats, Needs
from mmdata.loading.micro_batch import MicroBatch, OnError, sample_place, source_counts
from mmdata.loading.settling import settle
from mmdata.loading.step_record import DecodeCounters, StepRecord
from mmdata.loading.timing import Stage, timed
from mmdata.planning.mixture import Filler, OpenSource
from mmdata.planning.samples import SampleRef
from mmdata.planning.specs import Audio, Frames, Spec, Values
from mmdata.store.handle import FrameRequests
from mmdata.store.manifest import Piece


@dataclass
class ReadScope:
    """What a read is done with: its error policy, whether the video is left pending for another process, the
    frame cache it decodes through and the frame plans aligned ahead for it. The stream of steps has one scope;
    a lone substitute sample (`settle`) is read with a scope of its own, which shares none of them."""

    on_error: OnError
    defer_video: bool
    frame_cache: FrameCache
    aligned_ahead: dict[Hashable, FrameRequests] = field(default_factory=dict)  # by `_aligned_key`


class BatchReader:
    """Reads micro-batches of a spec from its sources' stores (one per worker process, or the main one).

    `sources` are the open stores (one, or a mixture's) with the stored name of each spec stream
    they have and their normalizers; `fillers` give each stream's shape for the padding of a
    source that lacks it. `video_decoder` decodes the cameras; with `defer_video` the reader only
    prepares them, for the main process to decode (`finish`). `collate_options` are collate's.
    `frame_cache_bytes` bounds the decoded frames kept for the reader's next `horizon` steps, where they are
    decoded: here, or in the main process for a reader that defers its video (see `mmdata.loading.frame_cache`).
    """

    def __init__(
        self,
        sources: Sequence[OpenSource],
        spec: Spec,
        fillers: dict[str, Filler],
        video_decoder: VideoDecoder,
        on_error: OnError = "raise",
        defer_video: bool = False,
        collate_options: dict[str, Any] | None = None,
        frame_cache_bytes: int = 0,
        horizon: int = HORIZON,
    ):
        if on_error not in ("raise", "skip"):
            raise OptionError(f"on_error is 'raise' or 'skip', not '{on_error}'")
        self.sources = list(sources)
        self.spec = spec
        self.fillers = fillers
        self.horizon = horizon
        self.video_decoder = video_decoder
        self.collate_options = collate_options or {}
        self.align = Aligner(self.sources, spec, fillers)
        self.cameras = [(name, stream) for name, stream in spec.streams.items() if isinstance(stream, Frames)]
        self.fetch = Fetcher(self.sources, self.align.stored_names)
        cache = FrameCache(0 if video_decoder.prepares else frame_cache_bytes)
        self.scope = ReadScope(on_error, defer_video, cache)
        self.followed_stats = FrameCacheStats()
        self._followers: dict[int, FrameCache] = {}  # per planning worker, in the process that decodes

    @property
    def on_error(self) -> OnError:
        return self.scope.on_error

    @property
    def defer_video(self) -> bool:
        """Whether the stream's micro-batches leave their video pending, for the main process to decode."""
        return self.scope.defer_video

    @property
    def frame_cache(self) -> FrameCache:
        """The frame cache the stream's micro-batches decode through (in this process)."""
        return self.scope.frame_cache

    @property
    def followed_bytes(self) -> int:
        """The frames this process keeps for micro-batches other readers planned (main-process decoding)."""
        return sum(cache.bytes for cache in self._followers.values())

    @property
    def bytes_read(self) -> int:
        return sum(source.store.pieces.bytes_read for source in self.sources)

    def read(
        self,
        step: int,
        samples: Sequence[SampleRef],
        fallback: Sequence[SampleRef] = (),
        horizon: Sequence[Sequence[SampleRef]] = (),
    ) -> MicroBatch:
        """Fetch, align and read a micro-batch, its cameras prepared for decoding (pending).

        `horizon` holds the samples of the steps this reader reads next, in order: the frame cache keeps the
        decoded frames those steps need. From object storage the next micro-batch's segments and the one after's
        rows are fetched while this one decodes, and the cameras' timestamps of the horizon's last step, which
        enters the cache's plan at the next read (the cache plans the steps before it).
        """
        return self._read(self.scope, step, samples, fallback, horizon)

    def replan(self) -> None:
        """Forget the steps this reader expected to read next (a worker pool gave them to another worker): the
        frame cache's plan of them and their frame plans aligned ahead. The next read plans its horizon afresh."""
        self.frame_cache.forget_later()
        self.scope.aligned_ahead.clear()

    def finish(self, batch: MicroBatch, seconds: dict[str, float] | None = None) -> dict[str, Any]:
        """The end of the chain: decode what is pending, settle failed samples, collate."""
        if seconds is not None:
            batch.seconds = seconds
        finish_video(self.video_decoder, batch, self.on_error, self._cache_for(batch))
        with timed(batch.seconds, Stage.SETTLE, batch.cpu_seconds):
            settle(batch, self._read_alone)
        with timed(batch.seconds, Stage.COLLATE, batch.cpu_seconds):
            return collate(batch, **self.collate_options)

    def finish_counted(self, batch: MicroBatch, record: StepRecord, seconds: dict[str, float]) -> dict[str, Any]:
        """`finish` in the process that decodes a micro-batch another reader read (main-process decoding), its
        outcome counted into that reader's `record`: samples, failures, frames decoded and delivered, the frame
        cache's bytes and evictions."""
        before = DecodeCounters.of(self.video_decoder.stats, self.followed_stats)
        collated = self.finish(batch, seconds)
        record.failed = dict(batch.failed)
        record.borrowed = len(batch.borrowed)
        record.samples = len(batch.samples)
        record.sources = source_counts(batch)
        record.stage_cpu = batch.cpu_seconds  # the reader's stages and the ones that ran here
        record.add_decoding(before, DecodeCounters.of(self.video_decoder.stats, self.followed_stats))
        record.frame_cache_bytes = max(record.frame_cache_bytes, self.followed_bytes)
        return collated

    def _cache_for(self, batch: MicroBatch) -> FrameCache:
        """The frame cache that decodes `batch`: this reader's own, or for a micro-batch a reader elsewhere planned
        (its video decoded here), the one that follows that reader's cache schedule."""
        schedule = batch.cache_schedule
        if schedule is None:
            return self.frame_cache
        cache = self._followers.get(schedule.owner)
        if cache is None:
            cache = self._followers[schedule.owner] = FrameCache(self.frame_cache.max_bytes, self.followed_stats)
        cache.follow(schedule)
        return cache

    def _read_rows_ahead(
        self, samples: Sequence[SampleRef], fallback: Sequence[SampleRef], horizon: Sequence[Sequence[SampleRef]]
    ) -> None:
        """Have each source's manifest read the rows of the step's `samples`, its `fallback` and the `horizon`'s steps
        it does not keep yet, together (a large manifest's row groups at once rather than one by one as the samples
        are aligned); nothing when every manifest is held in memory (a small one)."""
        if all(source.store.manifest.in_memory for source in self.sources):
            return
        episodes: dict[int, list[int]] = {}
        for sample in (*samples, *fallback, *(sample for later in horizon for sample in later)):
            episodes.setdefault(sample.source, []).append(sample.episode)
        for source, rows in episodes.items():
            self.sources[source].store.manifest.read_ahead(rows)

    def _task(self, sample: SampleRef) -> str:
        return self.sources[sample.source].store.manifest.row(sample.episode)["task"]

    def _read(
        self,
        scope: ReadScope,
        step: int,
        samples: Sequence[SampleRef],
        fallback: Sequence[SampleRef] = (),
        horizon: Sequence[Sequence[SampleRef]] = (),
    ) -> MicroBatch:
        """The front half of the chain for one micro-batch, stage by stage (see the module's docstring)."""
        batch = MicroBatch(step, list(samples), [""] * len(samples), fallback=list(fallback))
        seconds, cpu = batch.seconds, batch.cpu_seconds
        with timed(seconds, Stage.FETCH, cpu):
            self._read_rows_ahead(samples, fallback, horizon)
        upcoming = horizon[0] if len(horizon) > 0 else ()
        fetching = self.fetch.fetches_ahead
        planned, entering_next = (horizon[:-1], horizon[-1]) if fetching and horizon else (horizon, ())
        try:
            if fetching:
                with timed(seconds, Stage.FETCH, cpu):
                    entering = self._entering(scope, planned)  # (all of it at the first read; then fetched ahead)
                    self.fetch.now(self.fetch.rows([*batch.samples, *upcoming]), self.fetch.rows(entering, Frames))
            with timed(seconds, Stage.ALIGN, cpu):
                batch.tasks = [
                    self._attempt(batch, scope, p, "task", self._task, sample) or "" for p, sample in enumerate(samples)
                ]
                plans = self._align_cameras(batch, scope)
            if fetching:
                window = horizon[: self.fetch.reads_ahead]
                with timed(seconds, Stage.ALIGN, cpu):  # (without a frame cache only the next read's are aligned)
                    segments_ahead = self._segments_ahead(scope, window if scope.frame_cache.enabled else window[:1])
                with timed(seconds, Stage.FETCH, cpu):
                    self.fetch.now(self._unread(self._live_plans(batch, plans), scope.frame_cache.serves))
                    by_read = [[self.fetch.rows(step)] for step in window]
                    for parts, segments in zip(by_read, segments_ahead):
                        parts.append(segments)
                    if by_read:
                        by_read[0].append(self.fetch.rows(entering_next, Frames))
                    self.fetch.ahead(by_read)
            if scope.frame_cache.enabled:
                with timed(seconds, Stage.ALIGN, cpu):
                    self._plan_cache(batch, scope, plans, planned)
            self._read_values(batch, scope)
            origins = [sample.source for sample in batch.samples]
            for name, stream in self.cameras:
                with timed(seconds, Stage.FETCH, cpu):
                    data = self._segment_bytes(batch, scope, name, plans[name])
                prepare_video(
                    self.video_decoder,
                    batch,
                    name,
                    plans[name],
                    origins,
                    self.fillers[name],
                    stream.channels_first,
                    data,
                    stream.dtype == "float32",
                )
        finally:
            self.fetch.forget()
        if not scope.defer_video:
            finish_video(self.video_decoder, batch, scope.on_error, scope.frame_cache)
        return batch

    def _plan_cache(
        self,
        batch: MicroBatch,
        scope: ReadScope,
        plans: dict[str, list[FrameRequests | None]],
        horizon: Sequence[Sequence[SampleRef]],
    ) -> None:
        """Tell the frame cache what this read and the next ones (`horizon`, in order) need. A read's needs are
        added once, when it first enters the horizon; its samples are aligned then and the plans kept until
        it is read."""
        cache = scope.frame_cache
        now = cache.start_read()
        expected: list[tuple[int, Needs]] = []
        if not cache.knows(now):
            live = ((sample.source, plan) for camera in plans.values() for sample, plan in zip(batch.samples, camera))
            expected.append((now, _needs(live)))
            cache.expect(*expected[-1])
        for offset in range(1, len(horizon) + 1):  # a later read's samples are looked at once, as it enters
            if not cache.knows(now + offset):
                ahead = self._plans_ahead(scope, horizon[offset - 1])
                expected.append((now + offset, _needs((sample.source, plan) for sample, plan in ahead)))
                cache.expect(*expected[-1])
        cache.release_unplanned()
        if scope.defer_video:
            batch.cache_schedule = CacheSchedule(now, os.getpid(), tuple(expected))

    def _entering(self, scope: ReadScope, horizon: Sequence[Sequence[SampleRef]]) -> list[SampleRef]:
        """The samples of the steps of `horizon` the frame cache has not planned yet: aligned at this read."""
        cache = scope.frame_cache
        if not cache.enabled:
            return []
        first = cache.next_read + 1
        return [sample for offset, step in enumerate(horizon) if not cache.knows(first + offset) for sample in step]

    def _plans_ahead(self, scope: ReadScope, samples: Sequence[SampleRef]) -> list[tuple[SampleRef, FrameRequests]]:
        """The cameras' frame plans of samples read later: those already aligned, else aligned now and kept. A
        sample that fails here is left out, and aligned again (and reported) when its micro-batch is read."""
        found = []
        for sample in samples:
            for name, stream in self.cameras:
                key = _aligned_key(sample, name)
                plan = scope.aligned_ahead.get(key)
                if plan is None:
                    try:
                        plan = scope.aligned_ahead[key] = self.align.frames(sample, name, stream)
                    except (MmdataError, OSError):
                        continue
                found.append((sample, plan))
        return found

    def _segments_ahead(self, scope: ReadScope, window: Sequence[Sequence[SampleRef]]) -> list[dict[int, list[Piece]]]:
        """Per later read of `window`, the segments (per source) it is the first of them to need: every one for the
        next read, and for the reads after it those whose frames the frame cache does not hold now (it may let go
        of frames when its horizon is planned afresh: the next read's are fetched whatever it holds)."""
        seen: set[Hashable] = set()
        return [
            self._unread(self._plans_ahead(scope, step), scope.frame_cache.holds if number else _none, seen)
            for number, step in enumerate(window)
        ]

    @staticmethod
    def _unread(
        plans: Iterable[tuple[SampleRef, FrameRequests]],
        held: Callable[[Hashable, tuple[int, ...]], bool],
        seen: set[Hashable] | None = None,
    ) -> dict[int, list[Piece]]:
        """Per source, the segments of `plans` whose frames are not `held`, and not in `seen` (which they join):
        the segments a read will read."""
        seen = set() if seen is None else seen
        wanted: dict[int, list[Piece]] = {}
        for sample, plan in plans:
            for request, piece in zip(plan.requests, plan.pieces):
                key = segment_key(sample.source, request)
                if key in seen or held(key, request.frames):
                    continue
                seen.add(key)
                wanted.setdefault(sample.source, []).append(piece)
        return wanted

    def _align_cameras(self, batch: MicroBatch, scope: ReadScope) -> dict[str, list[FrameRequests | None]]:
        """Each camera's frame plan per sample (None where the sample failed): the ones aligned ahead, else now."""
        carried = scope.aligned_ahead
        return {
            name: [
                carried.pop(_aligned_key(sample, name), None)
                or self._attempt(batch, scope, p, name, self.align.frames, sample, name, stream)
                for p, sample in enumerate(batch.samples)
            ]
            for name, stream in self.cameras
        }

    @staticmethod
    def _live_plans(
        batch: MicroBatch, plans: dict[str, list[FrameRequests | None]]
    ) -> list[tuple[SampleRef, FrameRequests]]:
        """Each camera's frame plan of each sample of `batch` that has not failed."""
        return [
            (batch.samples[p], plan)
            for camera in plans.values()
            for p, plan in enumerate(camera)
            if plan is not None and p not in batch.failed
        ]

    def _segment_bytes(
        self, batch: MicroBatch, scope: ReadScope, name: str, plans: list[FrameRequests | None]
    ) -> dict[Hashable, bytes]:
        """Per segment key, the bytes of each segment the camera's live plans name, read once however many samples
        share it; a segment the frame cache serves whole is not read. A segment that fails to read fails every
        sample that needs it (recorded, or raised)."""
        users: dict[Hashable, list[int]] = {}
        wanted: dict[Hashable, tuple[Piece, set[int]]] = {}
        for p, plan in enumerate(plans):
            if plan is None or p in batch.failed:
                continue
            for request, piece in zip(plan.requests, plan.pieces):
                key = segment_key(batch.samples[p].source, request)
                users.setdefault(key, []).append(p)
                wanted.setdefault(key, (piece, set()))[1].update(request.frames)
        data = {}
        for key, (piece, frames) in wanted.items():
            if scope.frame_cache.serves(key, frames):
                continue
            readers = [p for p in users[key] if p not in batch.failed]
            if not readers:
                continue
            first, *others = readers
            store = self.sources[batch.samples[first].source].store
            read = self._attempt(batch, scope, first, name, store.segment_bytes, piece)
            if read is None:
                batch.failed.update({p: batch.failed[first] for p in others})
            else:
                data[key] = read
        return data

    def _read_values(self, batch: MicroBatch, scope: ReadScope) -> None:
        """Every stream but the cameras at the samples' times: low-dim values (a batch's at once), audio."""
        for name, stream in self.spec.streams.items():
            if isinstance(stream, Frames):
                continue
            read = self.align.values if isinstance(stream, Values) else self.align.audio
            with timed(batch.seconds, Stage.AUDIO if isinstance(stream, Audio) else Stage.LOWDIM, batch.cpu_seconds):
                together = self.align.values_of(batch.samples, name, stream) if isinstance(stream, Values) else []
                for position, sample in enumerate(batch.samples):
                    data = together[position] if together and position not in batch.failed else None
                    if data is None:
                        data = self._attempt(batch, scope, position, name, read, sample, name, stream)
                    values, is_pad = data if data is not None else (None, None)
                    batch.values.setdefault(name, []).append(values)
                    batch.is_pad.setdefault(name, []).append(is_pad)
                    if isinstance(stream, Values) and stream.pad_to is not None:
                        batch.dim_is_pad.setdefault(name, []).append(self.align.dim_is_pad(sample, name, stream))

    def _read_alone(self, step: int, sample: SampleRef) -> MicroBatch:
        """One sample read and decoded here, its failure recorded (for `settle` to borrow it), in a scope of its own:
        the stream's frame cache and the plans aligned ahead for it are left as they are."""
        return self._read(ReadScope("skip", defer_video=False, frame_cache=FrameCache(0)), step, [sample])

    def _attempt(
        self, batch: MicroBatch, scope: ReadScope, position: int, stream: str, read: Callable[..., Any], *args: Any
    ) -> Any:
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
            if scope.on_error == "raise":
                raise SampleError(message) from exc
            batch.failed[position] = message
            return None


def _aligned_key(sample: SampleRef, camera: str) -> Hashable:
    """A planned sample's camera, as a key hashed and compared in C (a `SampleRef` itself costs two calls into
    Python per look-up): the fields that tell samples apart, its draw (seed, epoch, slot) among them."""
    return (sample.index, sample.source, sample.episode, sample.start, sample.end, sample.draw, camera)


def _none(key: Hashable, frames: tuple[int, ...]) -> bool:
    """Held by nobody: every segment is to be read."""
    return False


def _needs(plans: Iterable[tuple[int, FrameRequests | None]]) -> Needs:
    """The frames per segment key that the (source, frame plan) pairs read."""
    return [
        (segment_key(source, request), request.frames)
        for source, plan in plans
        if plan is not None
        for request in plan.requests
        if request.where is not None
    ]
