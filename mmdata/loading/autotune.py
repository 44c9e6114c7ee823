"""How many workers a loader runs, chosen while it runs from what it measures (`num_workers="auto"`).

tf.data's AUTOTUNE tunes parallelism from each stage's measured rate; this tuner has the one figure that decides
whether more workers are worth their cores: whether the training loop waited. It watches, step by step, the
loop's own time on a batch (from handing it over to the next ask), the loop's wait for the next one, and each
worker's wall and CPU time per step, and at the end of each window of steps:

- the loop waited for more than `stall_limit` of its time while the workers stood idle part of it (their reads
  come in bursts: a step that opens a segment decodes it for the steps after it): read further ahead, doubling
  each worker's steps in flight up to `most_depth` (memory the frame rings hold for it; no core);
- the loop waited while the workers were busy: add the workers the measured rates say are missing (at least
  one), as far as `most` allows and only into cores that stood idle over the window (never into the trainer's or
  another rank's); if the next window delivers no more steps per second and no less waiting, go back and do not
  try that count again for `cooldown` seconds (or until the loop's pace changes);
- the loop did not wait over `calm_windows` windows in a row at a steady pace and one worker fewer would still
  read `spare` times as fast as the loop takes, at the slowest reads of the recent windows: retire one; if the
  loop then waits, take it back and keep that count for `cooldown` seconds; never fewer than `least` (the loader
  gives the count it starts with, two where the budget allows: reads come in bursts, a step that opens segments
  decoding them all, and one worker alone made the loop wait on 1.6-3.1% of its steps at 50-100 ms a step where
  two made it wait on none, `benchmarks/results/autotune_cpu.json`). (A change costs: the workers' frame caches
  plan their new steps afresh and a new worker starts cold, so the tuner grows readily and shrinks slowly.)

Windows start after the steps already dispatched when the count last changed, so every decision is measured on
the count it judges. The tuner only counts workers; which worker reads a step never changes what the step holds.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass

from mmdata.checks import option_int
from mmdata.errors import OptionError

RECENT_WINDOWS = 8  # a worker fewer must keep up with the slowest of this many windows' reads


@dataclass(frozen=True)
class StepTiming:
    """One step as the training loop and the worker that read it saw it (seconds)."""

    wait: float  # the loop waited for the batch
    loop: float  # the loop's own time on the batch before it asked again
    busy: float  # the worker's wall time reading the step
    cpu: float  # the worker's CPU time reading it


@dataclass(frozen=True)
class Setting:
    """What the tuner chose, when (seconds since it started) and from which window's figures."""

    at: float
    workers: int
    read_ahead: int  # each worker's steps in flight
    stall: float  # the share of the loop's time spent waiting over the window
    steps_per_second: float
    worker_cores: float  # the CPU the workers used over the window, in cores
    idle_cores: float  # the cores that stood idle over the window
    reason: str

    def to_dict(self) -> dict[str, float | int | str]:
        return {key: round(value, 4) if isinstance(value, float) else value for key, value in asdict(self).items()}


class WorkerTuner:
    """The worker count and read-ahead for a loader that starts with `workers` reading `depth` steps ahead each and
    may have up to `most` workers, `most_depth` steps ahead; see the module. `in_flight(n, depth)` is how many steps
    are on their way when n workers read (they are not counted in the next window); `idle_cores()` measures the
    cores that stood idle since it was last called."""

    def __init__(
        self,
        workers: int,
        most: int,
        in_flight: Callable[[int, int], int],
        idle_cores: Callable[[], float],
        *,
        depth: int = 2,
        most_depth: int = 8,
        least: int = 1,
        busy_enough: float = 0.7,
        stall_limit: float = 0.01,
        spare: float = 2.0,
        calm_windows: int = 2,
        least_steps: int = 8,
        least_seconds: float = 1.0,
        cooldown: float = 30.0,
    ):
        option_int(most, "the most workers", 1, 1024)
        option_int(workers, "the first worker count", 1, most)
        option_int(most_depth, "the most read-ahead", 1, 1024)
        option_int(depth, "the first read-ahead", 1, most_depth)
        option_int(least, "the fewest workers", 1, workers)
        if not 0 < stall_limit < 1 or not spare >= 1 or not least_seconds >= 0 or not cooldown >= 0:
            raise OptionError("the tuner's stall_limit is in (0, 1), spare >= 1, least_seconds and cooldown >= 0")
        self.workers, self.most, self.least = workers, most, least
        self.depth, self.most_depth, self.busy_enough = depth, most_depth, busy_enough
        self.stall_limit, self.spare, self.cooldown = stall_limit, spare, cooldown
        self.calm_windows, self._calm = calm_windows, 0
        self._pace: float | None = None  # the loop's own seconds per step over the last window
        self._recent_busy: deque[float] = deque(maxlen=RECENT_WINDOWS)  # each window's wall time per step
        self.least_steps, self.least_seconds = least_steps, least_seconds
        self._in_flight, self._idle_cores = in_flight, idle_cores
        self.history: list[Setting] = []
        self._window: list[StepTiming] = []
        self._window_start: float | None = None
        self._skip = in_flight(workers, depth)
        self._started: float | None = None
        self._trial: tuple[int, float, float] | None = None  # (the count before a growth, its steps/s and stall)
        self._ceiling: tuple[int, float, float] | None = None  # (no more than, until, the loop's pace then)
        self._floor: tuple[int, float, float] | None = None  # (no fewer than, until, the loop's pace then)
        self._shrunk_from: int | None = None

    def observe(self, timing: StepTiming, now: float) -> int:
        """Count one step the loop took at `now` (a monotonic clock, seconds); the worker count to have now."""
        if self._started is None:
            self._started = now
        if self._skip > 0:
            self._skip -= 1
            if self._skip == 0:
                self._idle_cores()  # (the next window's idle time is measured from here)
            return self.workers
        if self._window_start is None:
            self._window_start = now
        self._window.append(timing)
        elapsed = now - self._window_start
        if len(self._window) >= self.least_steps and elapsed >= self.least_seconds:
            self._decide(now, elapsed)
        return self.workers

    def _decide(self, now: float, elapsed: float) -> None:
        window, self._window, self._window_start = self._window, [], None
        steps = len(window)
        waited, looped = sum(t.wait for t in window), sum(t.loop for t in window)
        busy, cpu = sum(t.busy for t in window) / steps, sum(t.cpu for t in window) / steps
        stall = waited / max(waited + looped, 1e-12)
        rate = steps / max(elapsed, 1e-12)
        loop = looped / steps  # the loop's own seconds per step: its pace
        worker_cores = cpu * steps / max(elapsed, 1e-12)
        per_worker = worker_cores / self.workers
        idle = self._idle_cores()
        n = self.workers
        self._recent_busy.append(busy)
        figures = (stall, rate, worker_cores, idle)
        self._expire(now, loop)

        if self._trial is not None:  # the window after a growth: did it deliver more, or wait less?
            before, before_rate, before_stall = self._trial
            self._trial = None
            if stall > self.stall_limit and rate < before_rate * 1.03 and stall > 0.7 * before_stall:
                self._ceiling = (before, now + self.cooldown, loop)
                self._change(before, now, figures, f"{n} workers were no faster than {before}: back to {before}")
                return
        if self._shrunk_from is not None:  # the window after a shrink: did the loop start waiting?
            previous, self._shrunk_from = self._shrunk_from, None
            if stall > self.stall_limit:
                self._floor = (previous, now + self.cooldown, loop)
                self._change(previous, now, figures, f"the loop waited {stall:.1%} with {n}: back to {previous}")
                return

        most = min(self.most, self._ceiling[0] if self._ceiling else self.most)
        steady_pace = self._pace is None or loop <= 0 or max(loop / self._pace, self._pace / loop) < 1.5
        self._pace = loop if loop > 0 else self._pace
        self._calm = 0 if stall > self.stall_limit or not steady_pace else self._calm + 1
        if stall > self.stall_limit:
            busy_share = busy * rate / n  # of the workers' time, reading
            if busy_share < self.busy_enough and self.depth < self.most_depth:
                deeper = min(self.most_depth, 2 * self.depth)
                reason = f"the loop waited {stall:.1%}, the workers read {busy_share:.0%} of the time: read-ahead"
                self.depth, before = deeper, self.depth
                self._change(n, now, figures, f"{reason} {before} -> {deeper}")
                return
            if n >= most:
                why = f"{n} is the most" if most == self.most else f"more than {n} were no faster"
                self._note(now, figures, f"the loop waits {stall:.1%}; {why}")
                return
            if idle < 0.5 * per_worker:
                self._note(now, figures, f"the loop waits {stall:.1%}; no idle core for another worker")
                return
            needed = math.ceil(n * (loop + waited / steps) / loop * 1.1) if loop > 0 else 2 * n
            room = max(1, math.floor(idle / per_worker)) if per_worker > 0 else 1
            grown = min(most, n + max(1, min(needed - n, room, n)))
            self._trial = (n, rate, stall)
            self._change(grown, now, figures, f"the loop waited {stall:.1%}: {n} -> {grown} workers")
            return
        least = max(self._floor[0], self.least) if self._floor else self.least
        slowest = max(self._recent_busy)  # (the reads of bursts, when every lane opens segments at once, included)
        spare = loop > 0 and (n - 1) / slowest >= self.spare / loop
        if n > least and spare and self._calm >= self.calm_windows:
            self._shrunk_from, self._calm = n, 0
            self._change(n - 1, now, figures, f"no wait, {n - 1} worker(s) would read {self.spare}x the loop's pace")
            return
        self._note(now, figures, "steady")

    def _expire(self, now: float, loop: float) -> None:
        """A ceiling or floor ends after its cooldown, or when the loop's pace moved by half or more since."""

        def holds(bound: tuple[int, float, float] | None) -> bool:
            if bound is None:
                return False
            _, until, pace = bound
            moved = pace > 0 and loop > 0 and max(loop / pace, pace / loop) >= 1.5
            return now < until and not moved

        if not holds(self._ceiling):
            self._ceiling = None
        if not holds(self._floor):
            self._floor = None

    def _change(self, workers: int, now: float, figures: tuple[float, float, float, float], reason: str) -> None:
        self.workers = workers
        self._skip = self._in_flight(workers, self.depth)
        self._note(now, figures, reason)

    def _note(self, now: float, figures: tuple[float, float, float, float], reason: str) -> None:
        stall, rate, worker_cores, idle = figures
        last = self.history[-1] if self.history else None
        if last is not None and (last.workers, last.read_ahead, last.reason) == (self.workers, self.depth, reason):
            return  # (a window that changes nothing and says nothing new is not kept)
        at = now - (self._started or now)
        self.history.append(Setting(at, self.workers, self.depth, stall, rate, worker_cores, idle, reason))
        del self.history[:-256]


class IdleCores:
    """Cores of those this process may run on that stood idle between two calls (Linux's /proc/stat; elsewhere
    the whole allowance counts as idle, so the tuner is bounded by its most workers alone)."""

    def __init__(self) -> None:
        self.cpus = allowed_cpus()
        self._last = self._read()

    def __call__(self) -> float:
        now = self._read()
        last, self._last = self._last, now
        if now is None or last is None:
            return float(len(self.cpus))
        (idle, total), (idle_before, total_before) = now, last
        spent = total - total_before
        return len(self.cpus) * (idle - idle_before) / spent if spent > 0 else float(len(self.cpus))

    def _read(self) -> tuple[int, int] | None:
        try:
            with open("/proc/stat") as stat:
                idle = total = 0
                for line in stat:
                    if not line.startswith("cpu") or line.startswith("cpu "):
                        continue
                    name, *fields = line.split()
                    if int(name[3:]) not in self.cpus:
                        continue
                    ticks = [int(field) for field in fields[:8]]
                    idle += ticks[3] + ticks[4]  # idle, iowait
                    total += sum(ticks)
                return idle, total
        except (OSError, ValueError, IndexError):
            return None


def allowed_cpus() -> set[int]:
    """The CPUs this process may run on."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))
