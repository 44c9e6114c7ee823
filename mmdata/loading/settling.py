"""Stage 5 of the loading chain, settle (runs where the micro-batch was decoded): with
`on_error="skip"`, put a substitute in place of every sample that failed, so every rank keeps its
step count and every micro-batch its token budget.

A failed sample is replaced by another sample of its micro-batch; when every sample failed, one
sample is first borrowed from those planned after the micro-batch. Both choices depend only on the
plan and on which samples fail, so a resumed run makes the same ones.
"""

from __future__ import annotations

from collections.abc import Callable

from mmdata.errors import SampleError
from mmdata.loading.micro_batch import MicroBatch
from mmdata.planning.samples import SampleRef

# Samples planned after a micro-batch that a worker carries with it, to borrow from when all of its own fail.
FALLBACK_SAMPLES = 32
ReadAlone = Callable[[int, SampleRef], MicroBatch]


def settle(batch: MicroBatch, read_alone: ReadAlone) -> None:
    """Replace every failed sample (see `replace_failed`); when all of them failed, first borrow one
    sample from those planned after the micro-batch (`borrow`), read with `read_alone(step, sample)`."""
    batch.failed_sources = {p: batch.samples[p].source for p in batch.failed}
    if batch.failed and len(batch.failed) == len(batch.samples):
        borrow(batch, read_alone)
    replace_failed(batch)


def borrow(batch: MicroBatch, read_alone: ReadAlone) -> None:
    """Read, in place of the costliest failed sample, the first of `batch.fallback` that fits its
    cost and reads without error. The fallback is the rank's following samples in plan order,
    so the choice depends only on the plan and on which samples fail: a resumed run borrows the same."""
    target = max(batch.failed, key=lambda p: (batch.samples[p].cost, -p))
    for candidate in batch.fallback:
        if candidate.cost > batch.samples[target].cost:
            continue
        alone = read_alone(batch.step, candidate)
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
