"""How good a packing plan is: efficiency, padding, and how evenly the ranks are loaded."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from mmdata.planning.packing.plan import PackingPlan


@dataclass
class PlanStats:
    steps: int
    ranks: int
    micro_batches: int
    samples: int
    chunks: int
    dropped_samples: int
    deferred_samples: int
    tokens: int
    efficiency: float  # real tokens / (steps x ranks x budget)
    padding_fraction: float
    rank_token_spread: float  # mean over steps of (max / mean rank tokens - 1)
    rank_token_spread_max: float
    rank_attention_spread: float  # the same for sum(len^2)

    def as_dict(self) -> dict:
        return asdict(self)


def plan_stats(plan: PackingPlan) -> PlanStats:
    """Statistics of a plan, for `mmdata bench` and the packing benchmark."""
    steps, ranks = plan.steps.shape if plan.steps.size else (0, plan.config.ranks)
    lengths = plan.rows.tokens[plan.members]
    batch_of = np.repeat(np.arange(len(plan.batch_offsets) - 1), np.diff(plan.batch_offsets))
    tokens = np.bincount(batch_of, weights=lengths, minlength=len(plan.batch_offsets) - 1)
    squares = np.bincount(batch_of, weights=lengths.astype(np.float64) ** 2, minlength=len(tokens))
    per_step = tokens[plan.steps] if steps else np.zeros((0, ranks))
    per_step_sq = squares[plan.steps] if steps else np.zeros((0, ranks))
    capacity = steps * ranks * plan.config.budget
    efficiency = float(tokens.sum() / capacity) if capacity else 0.0
    return PlanStats(
        steps=int(steps),
        ranks=int(ranks),
        micro_batches=int(len(tokens)),
        samples=int(len(np.unique(plan.rows.sample[plan.members]))) if len(plan.members) else 0,
        chunks=int(len(plan.members)),
        dropped_samples=int(len(plan.dropped_samples)),
        deferred_samples=int(len(plan.deferred_samples)),
        tokens=int(tokens.sum()),
        efficiency=efficiency,
        padding_fraction=1.0 - efficiency if capacity else 0.0,
        rank_token_spread=_spread(per_step, np.mean),
        rank_token_spread_max=_spread(per_step, np.max),
        rank_attention_spread=_spread(per_step_sq, np.mean),
    )


def _spread(per_step: np.ndarray, reduce) -> float:
    if not len(per_step):
        return 0.0
    means = per_step.mean(axis=1)
    return float(reduce(per_step.max(axis=1) / np.where(means > 0, means, 1) - 1))
