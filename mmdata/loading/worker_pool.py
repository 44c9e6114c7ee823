"""Worker processes of the loader's own, whose number may change while an epoch runs.

Each step of a rank's epoch is read by the worker that owns it (`StepOwners`: the plan's lanes, each whole with
one worker, so a lane's segments meet one frame cache); the pool sends each worker its steps in order, at most
`prefetch_factor` ahead, and takes the batches back in step order from that worker's pipe. Every slot's worker is
forked when the pool starts, before any thread of the pool runs (a process forked while another thread holds a
lock may wait for it forever); growing gives steps to a resting worker, shrinking lets the last one rest once its
steps are back. Either way only who reads a step changes, never what it holds, so batches are the same whatever
the count and whenever it changes. Unlike
`torch.utils.data.DataLoader`'s, the pool has no index queues, no pin-memory thread and no per-batch bookkeeping
of its own beyond one message each way.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import pickle
import threading
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Protocol

import torch

from mmdata.errors import MmdataError
from mmdata.lifetime import exit_with_parent

_current_worker: int | None = None


def current_worker() -> int | None:
    """The slot of the loader worker this process is, or None in any other process."""
    return _current_worker


class StepReader(Protocol):
    """What the pool runs: a rank's steps from where the run stands, epoch after epoch; a reader plans `horizon`
    of its steps ahead."""

    @property
    def horizon(self) -> int: ...

    def epoch_lengths(self) -> Iterator[tuple[int, int, int]]:
        """(epoch, its first step, its steps from there), epoch after epoch."""
        ...

    def plan_ahead(self, epoch: int) -> None:
        """Plan `epoch` in the background (the pool asks half-way through the epoch before it)."""
        ...

    def before_fork(self) -> None:
        """Called before workers are forked from this process."""
        ...

    def start_in_worker(self, slot: int) -> None:
        """Called once in a new worker process before it reads."""
        ...

    def read_step(self, epoch: int, position: int, later: Sequence[int], worker: int, restart: bool) -> Any:
        """The item of step `position` of `epoch`, `later` being the positions this reader reads next."""
        ...


class StepOwners:
    """Which of `workers` workers reads each step: step `s` belongs to unit `s % units`, unit `u` to worker
    `u % workers`. The units are the plan's `lanes` (a lane's steps reach one worker's frame cache), each cut into
    as many turns as it takes for every worker to have one when there are more workers than lanes; an order of one
    lane is cut into one unit per worker."""

    def __init__(self, lanes: int, workers: int):
        if workers < 1:
            raise ValueError(f"a pool has at least one worker, not {workers}")
        self.workers = workers
        self.units = lanes * -(-workers // lanes) if lanes > 1 else workers
        self._residues = [[u for u in range(self.units) if u % workers == w] for w in range(workers)]

    def owner(self, step: int) -> int:
        return (step % self.units) % self.workers

    def after(self, step: int, end: int, count: int) -> list[int]:
        """The next `count` steps after `step` and before `end` of `step`'s owner, in order."""
        residues, found = self._residues[self.owner(step)], list[int]()
        base = step - step % self.units
        while len(found) < count:
            for residue in residues:
                later = base + residue
                if later <= step:
                    continue
                if later >= end or len(found) == count:
                    return found
                found.append(later)
            base += self.units
        return found


@dataclass
class _Worker:
    slot: int
    process: Any
    tasks: Connection
    results: Connection
    in_flight: int = 0
    restart: bool = True  # its next step starts its frame cache's plan afresh (its steps are not what it planned)


@dataclass
class _Task:
    epoch: int
    position: int
    slot: int


class WorkerFailure:
    """An exception raised in a worker, carried to the main process (its traceback as text beside it)."""

    def __init__(self, error: BaseException, slot: int):
        text = "".join(traceback.format_exception(error))
        try:
            pickle.loads(pickle.dumps(error))
            self.error: BaseException | None = error
        except Exception:  # (an exception that does not survive pickling is carried as text)
            self.error = None
        self.text, self.slot, self.kind = text, slot, type(error).__name__

    def raised(self) -> BaseException:
        error = self.error or MmdataError(f"{self.kind} in loader worker {self.slot}")
        with contextlib.suppress(AttributeError):
            error.add_note(f"raised in loader worker {self.slot}:\n{self.text}")
        return error


class WorkerPool:
    """`workers` processes forked from this one reading `reader`'s steps (`slots`: the most there may be at once,
    each with its own frame ring); `lanes` are the plan's. `items()` yields the steps' items in order."""

    def __init__(self, reader: StepReader, workers: int, slots: int, lanes: int, prefetch_factor: int):
        if not 1 <= workers <= slots:
            raise ValueError(f"a pool of {slots} slots cannot start {workers} workers")
        self.reader, self.slots, self.lanes, self.prefetch_factor = reader, slots, lanes, prefetch_factor
        self._context = multiprocessing.get_context("fork")
        self._workers: dict[int, _Worker] = {}
        self._order: list[int] = []  # the reading workers' slots, in the order the owners number them
        self._owners = StepOwners(lanes, workers)
        self._target = workers
        self._lock = threading.Lock()
        self._closed = False
        self._start(slots)
        self._order = list(range(workers))

    @property
    def workers(self) -> int:
        """The workers reading now."""
        return len(self._order)

    @property
    def target(self) -> int:
        return self._target

    def resize(self, workers: int) -> None:
        """Have `workers` workers from the next step dispatched on (thread-safe; applied by `items`)."""
        if not 1 <= workers <= self.slots:
            raise ValueError(f"a pool of {self.slots} slots cannot have {workers} workers")
        self._target = workers

    def pids(self) -> list[int]:
        return [worker.process.pid for worker in self._workers.values()]

    def items(self, stopped: Callable[[], bool] = lambda: False) -> Iterator[Any]:
        """Every step's item in order; the workers read up to `prefetch_factor` steps each ahead of the caller."""
        epochs = self.reader.epoch_lengths()
        pending: deque[_Task] = deque()
        current: tuple[int, int, int] | None = None
        position = 0
        ended: BaseException | None = None
        while not stopped():
            if self._target != len(self._order):
                self._apply_target()
            while ended is None:  # dispatch what the owners' pipes have room for, in step order
                if current is None or position >= current[2]:
                    try:
                        current, position = next(epochs), 0
                    except MmdataError as exc:  # (raised once the steps before it are delivered)
                        ended = exc
                        break
                epoch, first, length = current
                if position == length // 2:
                    self.reader.plan_ahead(epoch + 1)
                worker = self._workers[self._order[self._owners.owner(first + position)]]
                if worker.in_flight >= self.prefetch_factor:
                    break
                later = [s - first for s in self._owners.after(first + position, first + length, self.reader.horizon)]
                worker.tasks.send((epoch, position, later, worker.restart))
                worker.restart = False
                worker.in_flight += 1
                pending.append(_Task(epoch, position, worker.slot))
                position += 1
            if not pending:
                if ended is not None:
                    raise ended
                continue
            task = pending.popleft()
            worker = self._workers[task.slot]
            item = self._receive(worker, stopped)
            if item is None:
                return
            worker.in_flight -= 1
            yield item

    def close(self) -> None:
        """Stop every worker (within a few seconds; those that do not stop are killed)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        workers = list(self._workers.values())
        for worker in workers:
            with contextlib.suppress(OSError, ValueError):
                worker.tasks.send(None)
        for worker in workers:
            worker.process.join(timeout=5)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(timeout=5)
            for end in (worker.tasks, worker.results):
                end.close()
        self._workers.clear()

    def _start(self, count: int) -> None:
        self.reader.before_fork()
        with _frozen_for_fork():
            for slot in range(count):
                task_out, task_in = self._context.Pipe(duplex=False)
                result_out, result_in = self._context.Pipe(duplex=False)
                process = self._context.Process(
                    target=_work,
                    args=(self.reader, slot, task_out, result_in, os.getpid()),
                    name=f"mmdata-worker-{slot}",
                    daemon=True,
                )
                process.start()
                task_out.close()
                result_in.close()
                self._workers[slot] = _Worker(slot, process, task_in, result_out)

    def _apply_target(self) -> None:
        """Wake or rest workers to reach the target; every reading worker's later steps follow the new owners (a
        resting one still hands back the steps it was given)."""
        target = self._target
        resting = sorted(slot for slot in self._workers if slot not in self._order)
        self._order = (self._order + resting)[:target]
        self._owners = StepOwners(self.lanes, len(self._order))
        for slot in self._order:
            self._workers[slot].restart = True

    def _receive(self, worker: _Worker, stopped: Callable[[], bool]) -> Any:
        """The next item of `worker` (None when stopped); an error raised there is raised here."""
        while not worker.results.poll(0.05):
            if stopped():
                return None
            if not worker.process.is_alive():
                raise _ended(worker)
        try:
            item = worker.results.recv()
        except (EOFError, OSError):
            worker.process.join(timeout=5)
            raise _ended(worker) from None
        if isinstance(item, WorkerFailure):
            raise item.raised()
        return item


def _ended(worker: _Worker) -> MmdataError:
    """What to say of a worker that ended while it had steps to read."""
    code = worker.process.exitcode
    how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
    return MmdataError(
        f"loader worker {worker.slot} (pid {worker.process.pid}) {how} while reading; if it ran out of memory, use"
        " fewer workers or a smaller frame cache (Reading(frame_cache_bytes=...))"
    )


def _work(reader: StepReader, slot: int, tasks: Connection, results: Connection, parent: int) -> None:
    """A worker process: read each step it is sent until told to stop (None) or its parent is gone."""
    global _current_worker
    _current_worker = slot
    exit_with_parent(parent)
    torch.set_num_threads(1)
    try:
        reader.start_in_worker(slot)
        while True:
            task = tasks.recv()
            if task is None:
                return
            epoch, position, later, restart = task
            results.send(reader.read_step(epoch, position, later, slot, restart))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return
    except BaseException as exc:
        with contextlib.suppress(OSError):
            results.send(WorkerFailure(exc, slot))


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
