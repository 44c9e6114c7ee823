"""The stream of one rank's batches, from a starting step on, across epochs: how the stages of
`mmdata.loading.chain` are spread over the worker processes and the main one.

Worker processes read every `num_workers`-th step of the stream; when an epoch's steps run out
they plan the next epoch themselves (the plan is a pure function) and carry on, so workers are
started once and the first batches of an epoch are ready before the previous epoch ends. With
workers, a receiving thread takes batches from them (and, with main-process decoding, decodes
and collates them on the device) a bounded number of batches ahead of the training loop.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import os
import queue
import resource
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from typing import Any, overload

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from mmdata.errors import MmdataError
from mmdata.lifetime import exit_with_parent
from mmdata.loading.chain import BatchReader
from mmdata.loading.host_memory import (
    ARENA_BYTES_PER_WORKER,
    MAX_ARENA_BYTES,
    MAX_ARENA_BYTES_PER_WORKER,
    SHARED_TENSOR_BYTES,
    ArenaSpan,
    FrameArena,
    keep_freed_memory_mapped,
    use_arena,
)
from mmdata.loading.micro_batch import source_counts
from mmdata.loading.settling import FALLBACK_SAMPLES
from mmdata.loading.step_record import DecodeCounters, StepRecord
from mmdata.loading.timing import Stage, add_time
from mmdata.planning.planner import Planner, RankSteps
from mmdata.planning.samples import SampleRef
from mmdata.store.filesystem import read_retries

Item = tuple[int, int, Any, StepRecord]  # (epoch, step, batch or pending micro-batch, what reading it measured)
_OPEN_FEEDS: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_open_feeds() -> None:
    """Stop receiving threads before the interpreter tears down: a thread still inside a native
    decoder (DALI) when the process exits aborts it."""
    for feed in list(_OPEN_FEEDS):
        feed.close()


class StepsAhead(Sequence[Sequence[SampleRef]]):
    """The samples of the steps a worker reads next, each made when it is asked for: the reader looks at a step once,
    as it enters its horizon, so a horizon of 128 steps costs one step's samples per read, not 128."""

    def __init__(self, steps: RankSteps, positions: range):
        self.steps, self.positions = steps, positions

    def __len__(self) -> int:
        return len(self.positions)

    @overload
    def __getitem__(self, index: int) -> Sequence[SampleRef]: ...
    @overload
    def __getitem__(self, index: slice) -> StepsAhead: ...
    def __getitem__(self, index: int | slice) -> Sequence[SampleRef] | StepsAhead:
        if isinstance(index, slice):
            return StepsAhead(self.steps, self.positions[index])
        return self.steps[self.positions[index]][1]


class StepSource(IterableDataset):
    """One rank's steps from `first_steps` of `first_epoch` on, then every following epoch."""

    def __init__(
        self,
        reader: BatchReader,
        planner: Planner,
        seed: int,
        rank: int,
        world_size: int,
        first_epoch: int,
        first_steps: RankSteps,
    ):
        self.reader, self.planner = reader, planner
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.first_epoch, self.first_steps = first_epoch, first_steps
        self.arena: FrameArena | None = None  # set by the Feed that starts workers on it
        self._planning_seconds = 0.0  # next epochs planned here, not yet reported with a batch
        self._cpu_mark: float | None = None  # in a worker: its process's CPU time when its last item was made

    def epochs(self) -> Iterator[tuple[int, RankSteps]]:
        yield self.first_epoch, self.first_steps
        epoch = self.first_epoch + 1
        while True:
            started = time.perf_counter()
            plan = self.planner.epoch_plan(self.seed, epoch, [], self.world_size)
            steps = self.planner.rank_steps(plan, self.rank)
            self._planning_seconds += time.perf_counter() - started
            if not steps:
                raise MmdataError(f"epoch {epoch} has no steps for rank {self.rank} of {self.world_size}")
            yield epoch, steps
            epoch += 1

    def __iter__(self) -> Iterator[Item]:
        worker = get_worker_info()
        number, count = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        if worker is not None:
            use_arena(self.arena, number)
            self._cpu_mark = time.process_time()
        position = 0
        epochs = self.epochs()
        epoch, steps = next(epochs)
        upcoming: tuple[int, RankSteps] | BaseException | None = None  # the next epoch, once a step needs it
        while True:
            for index in range(len(steps)):
                if position % count == number:
                    making, planned = time.perf_counter(), self._planning_seconds  # (a step's samples are made now)
                    step, samples = steps[index]
                    # the samples planned after this step, to borrow from if all of its own fail
                    fallback = steps.samples_after(index, FALLBACK_SAMPLES)
                    if len(fallback) < FALLBACK_SAMPLES:
                        upcoming = upcoming or _next_or_error(epochs)
                        if not isinstance(upcoming, BaseException):
                            fallback += islice(_samples_of(upcoming[1]), FALLBACK_SAMPLES - len(fallback))
                    self._planning_seconds = planned + time.perf_counter() - making  # (the next epoch's plan in it)
                    later = range(index + count, min(len(steps), index + count * (self.reader.horizon + 1)), count)
                    yield self._read(epoch, step, samples, number, fallback, StepsAhead(steps, later))
                position += 1
            if isinstance(upcoming, BaseException):
                raise upcoming
            epoch, steps = upcoming or next(epochs)
            upcoming = None

    def _read(
        self,
        epoch: int,
        step: int,
        samples,
        worker: int,
        fallback: list[SampleRef],
        horizon: Sequence[Sequence[SampleRef]],
    ) -> Item:
        reader = self.reader
        started = time.perf_counter()
        decoding = DecodeCounters.of(reader.video_decoder.stats, reader.frame_cache.stats)
        bytes_read, retries = reader.bytes_read, read_retries()
        batch = reader.read(step, samples, fallback, horizon)
        planning, self._planning_seconds = self._planning_seconds, 0.0
        if planning:
            add_time(batch.seconds, Stage.PLAN, planning)
        output: Any = batch
        if not reader.defer_video:
            output = reader.finish(batch)
            if get_worker_info() is not None:
                if self.arena is not None:  # first: frames on the ring cross as spans, however small
                    output = self.arena.spans_of(output)
                output = small_tensors_as_arrays(output)
        record = StepRecord(
            worker=worker,
            pid=os.getpid(),
            samples=len(batch.samples),
            tokens=sum(sample.cost for sample in batch.samples),
            failed=dict(batch.failed),
            sources=source_counts(batch),
            borrowed=len(batch.borrowed),
            seconds=batch.seconds,
            stage_cpu=batch.cpu_seconds,
            busy=time.perf_counter() - started + planning,
            bytes_read=reader.bytes_read - bytes_read,
            read_retries=read_retries() - retries,
            frame_cache_bytes=reader.frame_cache.bytes,
            peak_rss=peak_rss_bytes(),
            cpu=self._worker_cpu(),
        )
        record.add_decoding(decoding, DecodeCounters.of(reader.video_decoder.stats, reader.frame_cache.stats))
        return epoch, step, output, record

    def _worker_cpu(self) -> float | None:
        """In a worker: the CPU its process (all its threads) spent since its previous item; None in the main
        process, whose own CPU time covers the reading."""
        if self._cpu_mark is None:
            return None
        now = time.process_time()
        spent, self._cpu_mark = now - self._cpu_mark, now
        return spent


class Feed:
    """Items of a `StepSource` as the training loop asks for them, kept alive between epochs.

    `finish` completes an item in the main process (pending video, collate, device copy). With
    workers, or when `background` is set, a thread receives and finishes items up to `ahead`
    batches in advance; an error raised there is raised from `next()`. The feed holds `finish`
    weakly, so a loader that is dropped is collected and closes its feed. `frame_bytes`, about what a
    batch's decoded frames take (None: unknown), sizes the workers' frame rings.
    """

    def __init__(
        self,
        source: StepSource,
        finish: Callable[[Item], Item],
        num_workers: int,
        prefetch_factor: int,
        pin_memory: bool,
        background: bool,
        ahead: int = 2,
        frame_bytes: int | None = None,
        timeout: float = 0.0,
    ):
        self._finish = weakref.WeakMethod(finish)
        self._timeout = timeout or None
        self._pin_memory = pin_memory
        self._arena: FrameArena | None = None
        if num_workers > 0:
            self._arena = source.arena = frame_arena(num_workers, ring_bytes(frame_bytes, prefetch_factor, ahead))
            loader = torch.utils.data.DataLoader(
                source,
                batch_size=None,
                num_workers=num_workers,
                collate_fn=_unchanged,
                prefetch_factor=prefetch_factor,
                pin_memory=pin_memory,
                worker_init_fn=functools.partial(start_worker, os.getpid()),
            )
            with _frozen_for_fork():
                self._items: Iterator[Item] = iter(loader)  # starts the workers
        else:
            self._items = iter(source)
        self.failed = False
        self._ready: queue.Queue | None = None
        self._stop = threading.Event()
        if background or num_workers > 0:
            self._ready = queue.Queue(maxsize=ahead)
            self._thread = threading.Thread(target=self._receive, name="mmdata-feed", daemon=True)
            self._thread.start()
        _OPEN_FEEDS.add(self)

    def queue_depth(self) -> int | None:
        """Batches finished and waiting for the training loop (None without a receiving thread)."""
        return self._ready.qsize() if self._ready is not None else None

    def next(self) -> Item:
        try:
            if self._ready is None:
                return self._finished(next(self._items))
            try:
                item = self._ready.get(timeout=self._timeout)
            except queue.Empty:
                raise TimeoutError(
                    f"no batch came from the loader's workers within timeout={self._timeout} s; raise timeout= (0:"
                    " no bound), or see loader.stats() for the stage that is slow"
                ) from None
            if isinstance(item, _Failure):
                raise item.error
            return item
        except BaseException:
            self.failed = True
            raise

    def close(self) -> None:
        self._stop.set()
        if self._ready is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        self._items = iter(())
        _OPEN_FEEDS.discard(self)

    def _receive(self) -> None:
        try:
            for item in self._items:
                if self._stop.is_set() or not self._offer(self._finished(item)):
                    return
            self._offer(_Failure(MmdataError("the loader's step stream ended unexpectedly")))
        except BaseException as exc:  # raised in the training loop by next()
            self._offer(_Failure(exc))

    def _finished(self, item: Item) -> Item:
        finish = self._finish()
        if finish is None:
            raise MmdataError("the loader this feed belonged to is gone")
        epoch, step, output, record = item
        if isinstance(output, dict):
            output = arrays_as_tensors(output)
            if self._arena is not None:
                output = {
                    name: self._arena.take(value, self._pin_memory) if isinstance(value, ArenaSpan) else value
                    for name, value in output.items()
                }
        return finish((epoch, step, output, record))

    def _offer(self, item: Any) -> bool:
        ready = self._ready
        assert ready is not None, "only a feed with a receiving thread offers items"
        while not self._stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False


def start_worker(parent: int, worker_id: int) -> None:
    """A loader worker's first step: end with the main process, and reuse the memory frames are freed from."""
    exit_with_parent(parent)
    keep_freed_memory_mapped()


def frame_arena(workers: int, bytes_per_worker: int) -> FrameArena | None:
    """The workers' frame rings, in all at most MAX_ARENA_BYTES and a quarter of the machine's memory; None
    where the system refuses the mapping (frames then cross through torch's shared memory, as before)."""
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        physical = MAX_ARENA_BYTES * 4
    total = min(MAX_ARENA_BYTES, physical // 4)
    try:
        return FrameArena(workers, min(bytes_per_worker, max(total // workers, 1 << 20)))
    except (OSError, ValueError, OverflowError):
        return None


def ring_bytes(frame_bytes: int | None, prefetch_factor: int, ahead: int) -> int:
    """A worker's frame ring: room for the batches it may have in flight (its prefetched ones, the feed's
    finished ones and the training loop's current one, with one to spare), within the module's bounds."""
    if frame_bytes is None:
        return ARENA_BYTES_PER_WORKER
    return min(max(ARENA_BYTES_PER_WORKER, (prefetch_factor + ahead + 2) * frame_bytes), MAX_ARENA_BYTES_PER_WORKER)


def small_tensors_as_arrays(batch: dict[str, Any]) -> dict[str, Any]:
    """A worker's batch with its small tensors as numpy arrays, which cross to the main process inside
    the pickled message. Torch sends each tensor through shared memory instead, passing a file
    descriptor over a fresh authenticated connection per tensor: a millisecond or so each, which for
    the twenty-odd small tensors of a batch cost the main process more than the frames did."""
    return {
        name: value.numpy()
        if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.nbytes < SHARED_TENSOR_BYTES
        else value
        for name, value in batch.items()
    }


def arrays_as_tensors(batch: dict[str, Any]) -> dict[str, Any]:
    """The inverse of `small_tensors_as_arrays`, in the main process (no copy)."""
    return {name: torch.from_numpy(value) if isinstance(value, np.ndarray) else value for name, value in batch.items()}


@contextlib.contextmanager
def _frozen_for_fork() -> Iterator[None]:
    """Workers forked inside this block never collect the objects they inherit, garbage included: a
    native one (a decoder with threads) must be destroyed only in the process that made it, or the child
    waits forever on threads that exist only in the parent. Objects stay frozen in the children from
    their first instruction (the collector can run before any worker code does); the parent thaws them
    once the workers are up, unless it had frozen objects of its own. Untouched pages also stay shared."""
    thaw = gc.get_freeze_count() == 0
    gc.freeze()
    try:
        yield
    finally:
        if thaw:
            gc.unfreeze()


def _unchanged(item: Any) -> Any:
    """Items cross from workers as they are (torch's default would turn numpy arrays into tensors)."""
    return item


def _samples_of(steps: RankSteps) -> Iterator[SampleRef]:
    return (sample for _, samples in steps for sample in samples)


def _next_or_error(epochs: Iterator[tuple[int, RankSteps]]) -> tuple[int, RankSteps] | BaseException:
    """The next epoch's steps, or the error planning it raised (raised again when that epoch is due)."""
    try:
        return next(epochs)
    except MmdataError as exc:
        return exc


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


def peak_rss_bytes() -> int:
    """This process's peak resident memory (VmHWM), in bytes. Not `getrusage`'s `ru_maxrss`, ten times cheaper:
    a worker started by spawn would carry the peak of the process it was forked from over its exec."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes there, KiB on Linux
