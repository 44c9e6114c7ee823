"""The stream of one rank's batches, from a starting step on, across epochs: how the stages of
`mmdata.loading.chain` are spread over the worker processes and the main one.

Worker processes of the loader's own (`loading/worker_pool.py`) read the steps of the lanes they own; when an
epoch's steps run out they plan the next epoch themselves (the plan is a pure function) and carry on, so workers
are started once and the first batches of an epoch are ready before the previous epoch ends. With
`num_workers="auto"` a tuner (`loading/autotune.py`) sets their number from the steps the training loop takes. With
workers, a receiving thread takes batches from them (and, with main-process decoding, decodes
and collates them on the device) a bounded number of batches ahead of the training loop.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
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

from mmdata.errors import MmdataError
from mmdata.loading.autotune import IdleCores, StepTiming, WorkerTuner
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
from mmdata.loading.loader_options import WorkerCount
from mmdata.loading.micro_batch import source_counts
from mmdata.loading.settling import FALLBACK_SAMPLES
from mmdata.loading.step_record import DecodeCounters, StepRecord
from mmdata.loading.timing import Stage, add_time
from mmdata.loading.worker_pool import WorkerPool, current_worker
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


# A reader's first read plans the frame cache's horizon only this many steps ahead, the next one the whole horizon:
# the first batch does not wait for a horizon's samples to be aligned (32 steps or more), and only the first read's
# segments may be decoded twice (a ramp over several reads cost 1.2-1.7x decode waste on short epochs).
FIRST_HORIZON = 2


class StepsAhead(Sequence[Sequence[SampleRef]]):
    """The samples of the steps a worker reads next, each made when it is asked for: the reader looks at a step once,
    as it enters its horizon, so a horizon of 128 steps costs one step's samples per read, not 128."""

    def __init__(self, steps: RankSteps, positions: Sequence[int]):
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


class StepSource:
    """One rank's steps from `first_steps` of `first_epoch` on, then every following epoch: read in turn in this
    process (`in_order`), or step by step in the workers of a `WorkerPool` (`read_step`), which plan the epochs
    after the first themselves (the plan is a pure function)."""

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
        self._planning_seconds = 0.0  # epochs planned here, not yet reported with a batch
        self._cpu_mark: float | None = None  # in a worker: its process's CPU time when its last item was made
        self._epochs: dict[int, RankSteps | MmdataError] = {first_epoch: first_steps}
        self._planning_ahead: dict[int, threading.Thread] = {}
        self._planned_before = False  # whether this reader read since it began (or replanned): the first plans less

    @property
    def horizon(self) -> int:
        """The reads a reader plans ahead (its frame cache's horizon)."""
        return self.reader.horizon

    def steps_of(self, epoch: int) -> RankSteps:
        """The rank's steps of `epoch` (planned once here, or found planned ahead; the two latest kept); raises what
        planning it raised."""
        planning = self._planning_ahead.pop(epoch, None)
        if planning is not None:
            planning.join()  # (a thread of the process this was forked from ends at once here: planned below)
        steps = self._epochs.get(epoch)
        if steps is None:
            steps = self._plan(epoch)
        if isinstance(steps, MmdataError):
            raise steps
        return steps

    def before_fork(self) -> None:
        """Wait for the epochs being planned ahead (a process forked while a thread holds a lock may never get it)."""
        for thread in list(self._planning_ahead.values()):
            thread.join()

    def plan_ahead(self, epoch: int) -> None:
        """Plan `epoch` on a thread of its own, so that the step that first needs it (the fallback of the epoch's
        last steps, the next epoch's first) does not wait for it."""
        if epoch not in self._epochs and epoch not in self._planning_ahead:
            thread = threading.Thread(target=self._plan, args=(epoch,), name="mmdata-plan-ahead", daemon=True)
            self._planning_ahead[epoch] = thread
            thread.start()

    def _plan(self, epoch: int) -> RankSteps | MmdataError:
        started = time.perf_counter()
        steps: RankSteps | MmdataError
        try:
            plan = self.planner.epoch_plan(self.seed, epoch, [], self.world_size)
            steps = self.planner.rank_steps(plan, self.rank)
            if not steps:
                raise MmdataError(f"epoch {epoch} has no steps for rank {self.rank} of {self.world_size}")
        except MmdataError as exc:
            steps = exc
        self._planning_seconds += time.perf_counter() - started
        self._epochs[epoch] = steps
        for older in [e for e in list(self._epochs) if e < epoch - 1]:
            self._epochs.pop(older, None)
        return steps

    def epoch_lengths(self) -> Iterator[tuple[int, int, int]]:
        """(epoch, its first step, its steps from there), from the first epoch on."""
        epoch = self.first_epoch
        while True:
            steps = self.steps_of(epoch)
            yield epoch, steps.first, len(steps)
            epoch += 1

    def in_order(self) -> Iterator[Item]:
        """Every step's item in turn, read in this process."""
        for epoch, _, length in self.epoch_lengths():
            for position in range(length):
                if position == length // 2:
                    self.plan_ahead(epoch + 1)
                later = range(position + 1, min(length, position + 1 + self.reader.horizon))
                yield self.read_step(epoch, position, later, 0, False)

    def start_in_worker(self, slot: int) -> None:
        """A pool worker's start: end with the main process, reuse freed memory, write frames into its ring."""
        keep_freed_memory_mapped()
        use_arena(self.arena, slot)
        self._cpu_mark = time.process_time()

    def read_step(self, epoch: int, position: int, later: Sequence[int], worker: int, restart: bool) -> Item:
        """The item of step `position` of `epoch`'s steps; `later` are the positions this reader reads next (its
        frame cache's horizon) and `restart` says its earlier plan of them no longer holds."""
        making, planned = time.perf_counter(), self._planning_seconds
        steps = self.steps_of(epoch)
        if position >= len(steps) // 2:
            self.plan_ahead(epoch + 1)
        if restart:
            self.reader.replan()
            self._planned_before = False
        if not self._planned_before:
            later = later[:FIRST_HORIZON]
        self._planned_before = True
        step, samples = steps[position]
        fallback = steps.samples_after(position, FALLBACK_SAMPLES)  # to borrow from if all of its own fail
        if len(fallback) < FALLBACK_SAMPLES:
            with contextlib.suppress(MmdataError):  # (the next epoch's error is raised when that epoch is due)
                fallback += islice(_samples_of(self.steps_of(epoch + 1)), FALLBACK_SAMPLES - len(fallback))
        self._planning_seconds = planned + time.perf_counter() - making
        return self._read(epoch, step, samples, worker, fallback, StepsAhead(steps, later))

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
            if current_worker() is not None:
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
        workers: WorkerCount,
        prefetch_factor: int,
        pin_memory: bool,
        background: bool,
        ahead: int = 2,
        frame_bytes: int | None = None,
        timeout: float = 0.0,
        lanes: int = 1,
    ):
        self._finish = weakref.WeakMethod(finish)
        self._timeout = timeout or None
        self._pin_memory = pin_memory
        self._arena: FrameArena | None = None
        self._stop = threading.Event()
        self.pool: WorkerPool | None = None
        self.tuner: WorkerTuner | None = None
        if workers.first > 0:
            deepest = MOST_READ_AHEAD if workers.auto else prefetch_factor
            self._arena = source.arena = frame_arena(workers.most, ring_bytes(frame_bytes, deepest, ahead))
            self.pool = WorkerPool(source, workers.first, workers.most, lanes, prefetch_factor)
            self._items: Iterator[Item] = self.pool.items(self._stop.is_set)
            if workers.auto:
                in_flight = functools.partial(_in_flight, ahead=ahead)
                self.tuner = WorkerTuner(
                    workers.first,
                    workers.most,
                    in_flight,
                    IdleCores(),
                    depth=prefetch_factor,
                    most_depth=deepest,
                    least=workers.first,
                )
        else:
            self._items = source.in_order()
        self.failed = False
        self._ready: queue.Queue | None = None
        if background or workers.first > 0:
            self._ready = queue.Queue(maxsize=ahead)
            self._thread = threading.Thread(target=self._receive, name="mmdata-feed", daemon=True)
            self._thread.start()
        _OPEN_FEEDS.add(self)

    @property
    def workers(self) -> int:
        """The workers reading now (0: the main process reads)."""
        return self.pool.workers if self.pool is not None else 0

    def taken(self, record: StepRecord, wait: float, loop: float) -> None:
        """The training loop took a step (after waiting `wait` s for it) and spent `loop` s on it: with
        `num_workers="auto"`, the tuner may change the worker count from the next step dispatched on."""
        if self.tuner is None or self.pool is None:
            return
        timing = StepTiming(wait, loop, record.busy, record.cpu or 0.0)
        workers = self.tuner.observe(timing, time.monotonic())
        self.pool.prefetch_factor = self.tuner.depth
        if workers != self.pool.target:
            self.pool.resize(workers)

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
        if self.pool is not None:
            self.pool.close()
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


def _in_flight(workers: int, prefetch_factor: int, ahead: int) -> int:
    """The steps on their way to the training loop when `workers` workers read `prefetch_factor` steps ahead each:
    dispatched, and finished."""
    return workers * prefetch_factor + ahead + 1


MOST_READ_AHEAD = 8  # the deepest read-ahead (steps in flight per worker) `num_workers="auto"` may choose


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


def _samples_of(steps: RankSteps) -> Iterator[SampleRef]:
    return (sample for _, samples in steps for sample in samples)


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
