"""Token cost of samples: what a sample weighs in the model's sequence, from its stream lengths."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

TokensPer = Mapping[str, float | Callable[[np.ndarray], np.ndarray]]


def token_costs(stream_lengths: Mapping[str, np.ndarray], tokens_per: TokensPer) -> np.ndarray:
    """Tokens per sample: sum over streams of (length x tokens per unit), or a callable per stream.

    `stream_lengths[s]` holds, per sample, the stream's length in its own unit (frames for a
    camera, steps for actions, seconds for audio); `tokens_per[s]` converts it. A callable gets
    the whole length array and returns token counts. Costs are rounded up to whole tokens.
    """
    missing = [name for name in tokens_per if name not in stream_lengths]
    if missing:
        raise ValueError(f"tokens_per names streams with no lengths: {', '.join(missing)}")
    total: np.ndarray | None = None
    for name, per in tokens_per.items():
        lengths = np.asarray(stream_lengths[name], dtype=np.float64)
        tokens = np.asarray(per(lengths) if callable(per) else lengths * float(per), dtype=np.float64)
        total = tokens if total is None else total + tokens
    if total is None:
        raise ValueError("tokens_per is empty: give at least one stream's tokens per unit")
    return np.ceil(total - 1e-9).astype(np.int64)


@dataclass
class Chunked:
    """Samples after long ones were split or dropped: each row is (sample, chunk index, tokens)."""

    sample: np.ndarray
    chunk: np.ndarray
    tokens: np.ndarray
    dropped: np.ndarray

    def __len__(self) -> int:
        return len(self.tokens)


def fit_to_budget(costs: np.ndarray, budget: int, long: Literal["split", "drop"] = "split", unit: int = 1) -> Chunked:
    """Make every sample fit one micro-batch of `budget` tokens.

    Longer samples are cut into consecutive chunks (long-horizon world-model sequences), each
    keeping its chunk index, or dropped and listed, as chosen. Cuts fall on multiples of `unit`
    tokens (e.g. the tokens of one frame), so no frame is split between chunks.
    """
    costs = np.asarray(costs, dtype=np.int64)
    if budget < 1:
        raise ValueError(f"token budget must be at least 1, not {budget}")
    if unit < 1:
        raise ValueError(f"the indivisible unit must be at least 1 token, not {unit}")
    if budget < unit:
        raise ValueError(
            f"token budget {budget} is smaller than the smallest chunk ({unit} tokens, one indivisible unit);"
            " raise the budget or lower the tokens per frame"
        )
    if len(costs) and costs.min() < 1:
        bad = int(np.flatnonzero(costs < 1)[0])
        raise ValueError(f"sample {bad} costs {int(costs[bad])} tokens; every sample must cost at least 1")
    if long not in ("split", "drop"):
        raise ValueError(f"long samples are 'split' or 'drop', not '{long}'")
    too_long = costs > budget
    if long == "drop":
        keep = np.flatnonzero(~too_long)
        return Chunked(keep, np.zeros(len(keep), np.int64), costs[keep], np.flatnonzero(too_long))
    chunk_size = budget // unit * unit
    pieces = np.where(too_long, -(-costs // chunk_size), 1)
    sample = np.repeat(np.arange(len(costs)), pieces)
    starts = np.repeat(np.cumsum(pieces) - pieces, pieces)
    chunk = np.arange(len(sample)) - starts
    tokens = np.minimum(np.where(too_long[sample], chunk_size, costs[sample]), costs[sample] - chunk * chunk_size)
    return Chunked(sample, chunk, tokens, np.empty(0, np.int64))


def check_order(order: np.ndarray, rows: int) -> np.ndarray:
    """`order` as int64 row indices, after checking they are distinct and in [0, rows)."""
    order = np.asarray(order, dtype=np.int64)
    if len(order) and (order.min() < 0 or order.max() >= rows or np.bincount(order, minlength=rows).max() > 1):
        raise ValueError(f"order must list distinct row indices in [0, {rows})")
    return order
