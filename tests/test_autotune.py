"""The worker tuner against a simulated pipeline: a machine of some cores, a training loop that takes a batch every
so many milliseconds and keeps some cores busy, and workers that each need so much CPU per step and slow down
when the cores are oversubscribed. It converges, it does not oscillate, and it keeps to both budgets."""

from __future__ import annotations

import pytest

from mmdata.errors import OptionError
from mmdata.loading.autotune import StepTiming, WorkerTuner


class SimulatedPipeline:
    """Steps taken on a virtual clock. `loop`: the loop's own seconds per step; `trainer_cores`: the cores it keeps
    busy meanwhile; each step costs a worker `step_cpu` CPU-seconds, stretched when workers and trainer together
    want more than the machine's `cores`."""

    def __init__(
        self,
        cores: int,
        loop: float,
        step_cpu: float,
        trainer_cores: float = 0.0,
        most_rate: float = 1e9,
        burst: float = 0.0,
    ):
        self.cores, self.loop, self.step_cpu, self.trainer_cores = cores, loop, step_cpu, trainer_cores
        self.most_rate = most_rate  # steps/s a shared resource (a disk, a link) allows, however many workers
        self.burst = burst  # the wait a burst of slow reads costs a loop whose workers read one step ahead
        self.now = 0.0
        self.busy_cores = 0.0  # over the last step

    def in_flight(self, workers: int, depth: int) -> int:
        return workers * depth + 3

    def idle_cores(self) -> float:
        return max(0.0, self.cores - self.busy_cores)

    def step(self, workers: int, depth: int = 2) -> StepTiming:
        wanted = workers + self.trainer_cores
        busy = self.step_cpu * max(1.0, wanted / self.cores)  # a worker's wall time per step
        supply = max(busy / workers, 1.0 / self.most_rate)  # the pool delivers a step this often
        wait = max(0.0, supply - self.loop) + max(0.0, self.burst / depth - 0.25 * self.burst)  # (none from 4 on)
        self.now += self.loop + wait
        rate = 1.0 / (self.loop + wait)
        self.busy_cores = min(self.cores, self.trainer_cores + rate * self.step_cpu)
        return StepTiming(wait=wait, loop=self.loop, busy=busy, cpu=self.step_cpu)


def run(tuner: WorkerTuner, pipeline: SimulatedPipeline, seconds: float) -> list[tuple[float, int, float]]:
    """(time, workers, the step's wait) per step for `seconds` of simulated time."""
    steps = []
    end = pipeline.now + seconds
    while pipeline.now < end:
        timing = pipeline.step(tuner.workers, tuner.depth)
        steps.append((pipeline.now, tuner.workers, timing.wait))
        tuner.observe(timing, pipeline.now)
    return steps


def tuner_for(pipeline: SimulatedPipeline, workers: int = 2, most: int = 16, **options) -> WorkerTuner:
    return WorkerTuner(workers, most, pipeline.in_flight, pipeline.idle_cores, **options)


def stalled_share(steps, since: float) -> float:
    late = [wait for at, _, wait in steps if at >= since]
    return sum(wait > 1e-3 for wait in late) / max(1, len(late))


def changes(steps, since: float) -> int:
    counts = [workers for at, workers, _ in steps if at >= since]
    return sum(a != b for a, b in zip(counts, counts[1:]))


def test_a_loop_bound_run_grows_to_the_workers_it_needs_and_then_stalls_no_step():
    pipeline = SimulatedPipeline(cores=16, loop=0.02, step_cpu=0.1, trainer_cores=1)  # 5 workers keep up
    tuner = tuner_for(pipeline, workers=2)
    steps = run(tuner, pipeline, 60)
    assert stalled_share(steps, since=15) == 0
    assert 5 <= tuner.workers <= 7, tuner.history  # enough, and not many more than enough


def test_a_loop_slower_than_the_workers_lets_workers_go_down_to_what_keeps_it_fed():
    pipeline = SimulatedPipeline(cores=16, loop=0.1, step_cpu=0.1, trainer_cores=1)  # one worker nearly keeps up
    tuner = tuner_for(pipeline, workers=8)
    steps = run(tuner, pipeline, 120)
    assert tuner.workers == 2, tuner.history  # one would read 1.0x the loop's pace: under the 2x spare
    assert stalled_share(steps, since=60) == 0


def test_a_loop_slower_than_one_worker_keeps_the_fewest_workers_it_was_given():
    pipeline = SimulatedPipeline(cores=16, loop=0.5, step_cpu=0.05)  # one worker would read 10x the loop's pace
    tuner = tuner_for(pipeline, workers=4, least=2)
    run(tuner, pipeline, 120)
    assert tuner.workers == 2, tuner.history


def test_a_throughput_bound_run_stops_where_another_worker_is_no_faster_and_does_not_oscillate():
    pipeline = SimulatedPipeline(cores=2, loop=0.0, step_cpu=0.05)  # two workers fill the machine
    tuner = tuner_for(pipeline, workers=1, most=8, cooldown=30)
    steps = run(tuner, pipeline, 120)
    assert tuner.workers == 2, tuner.history
    assert changes(steps, since=20) <= 2 * (100 // 30), tuner.history  # at most one retry per cooldown


def test_a_worker_that_adds_no_speed_is_taken_back_and_not_tried_again_before_the_cooldown():
    pipeline = SimulatedPipeline(cores=16, loop=0.0, step_cpu=0.05, most_rate=50)  # a link of 50 steps/s
    tuner = tuner_for(pipeline, workers=2, most=16, cooldown=30)
    steps = run(tuner, pipeline, 25)
    reasons = [setting.reason for setting in tuner.history]
    assert any("no faster" in reason for reason in reasons), reasons
    assert tuner.workers <= 4 and changes(steps, since=8) <= 1, reasons


def test_no_worker_is_added_into_cores_the_trainer_keeps_busy():
    pipeline = SimulatedPipeline(cores=4, loop=0.0, step_cpu=0.05, trainer_cores=3)  # one core left
    tuner = tuner_for(pipeline, workers=1, most=8)
    steps = run(tuner, pipeline, 60)
    assert max(workers for _, workers, _ in steps) == 1, tuner.history
    assert any("no idle core" in setting.reason for setting in tuner.history)


def test_the_most_workers_is_never_exceeded():
    pipeline = SimulatedPipeline(cores=64, loop=0.001, step_cpu=0.1)  # would take 100 workers
    tuner = tuner_for(pipeline, workers=2, most=6)
    steps = run(tuner, pipeline, 30)
    assert max(workers for _, workers, _ in steps) == 6
    assert tuner.history[-1].reason.endswith("6 is the most")


def test_a_loop_that_speeds_up_or_slows_down_fourfold_is_fed_again_within_ten_seconds():
    pipeline = SimulatedPipeline(cores=16, loop=0.08, step_cpu=0.1, trainer_cores=1)
    tuner = tuner_for(pipeline, workers=2)
    steps = run(tuner, pipeline, 40)
    pipeline.loop = 0.02  # 4x faster
    steps += run(tuner, pipeline, 40)
    assert stalled_share(steps, since=50 + 0.1) == 0  # fed again within ten seconds of the change at 40
    fast_workers = tuner.workers
    pipeline.loop = 0.08  # 4x slower
    steps += run(tuner, pipeline, 60)
    assert stalled_share(steps, since=90) == 0
    assert tuner.workers < fast_workers, tuner.history  # and the cores it no longer needs are given back


def test_the_settings_over_time_say_what_was_chosen_and_why():
    pipeline = SimulatedPipeline(cores=16, loop=0.02, step_cpu=0.1)
    tuner = tuner_for(pipeline, workers=2)
    run(tuner, pipeline, 20)
    first = tuner.history[0].to_dict()
    assert set(first) == {
        "at", "workers", "read_ahead", "stall", "steps_per_second", "worker_cores", "idle_cores", "reason"
    }  # fmt: skip
    assert "the loop waited" in first["reason"] and first["workers"] > 2


def test_a_loop_that_waits_while_the_workers_stand_idle_gets_a_deeper_read_ahead_not_more_workers():
    pipeline = SimulatedPipeline(cores=16, loop=0.05, step_cpu=0.02, burst=0.02)  # workers mostly idle
    tuner = tuner_for(pipeline, workers=2)
    steps = run(tuner, pipeline, 30)
    assert tuner.depth == 4 and tuner.workers <= 2, tuner.history
    assert stalled_share(steps, since=10) == 0
    assert "read-ahead 2 -> 4" in tuner.history[0].reason


@pytest.mark.parametrize("workers, most, depth", [(0, 4, 2), (5, 4, 2), (1, 0, 2), (True, 4, 2), (1, 4, 9), (1, 4, 0)])
def test_a_tuner_refuses_counts_out_of_range(workers, most, depth):
    with pytest.raises(OptionError):
        WorkerTuner(workers, most, lambda n, d: n * d, lambda: 1.0, depth=depth)
