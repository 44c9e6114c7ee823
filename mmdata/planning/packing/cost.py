"""Token cost of samples: what a sample weighs in the model's sequence, from its stream lengths."""

from __future__ import annotations

from collections.abc import Callable, Mapping

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
