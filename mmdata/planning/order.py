"""The epoch's sample order: random, yet local enough that a worker reads few shards at a time.

"locality" shuffles the shards, takes them `shards_per_group` at a time and shuffles the samples
of each group together (as WebDataset's shard shuffle plus sample buffer does, but exactly
reproducible); "global" is one permutation of every sample; "none" keeps manifest order.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from mmdata.errors import OptionError

Shuffle = Literal["locality", "global", "none"]
SHUFFLES = ("locality", "global", "none")
_ORDER_STREAM = 0x5A3D


def as_shuffle(value: Shuffle | bool) -> Shuffle:
    """A shuffle mode from torch's `shuffle=True/False` (the default "locality" / "none") or by name."""
    if isinstance(value, (bool, np.bool_)):
        return "locality" if value else "none"
    if value not in SHUFFLES:
        raise OptionError(f"shuffle is True, False or one of {', '.join(SHUFFLES)}, not {value!r}")
    return value


def sample_order(
    shards: np.ndarray, seed: int, epoch: int, shuffle: Shuffle = "locality", shards_per_group: int = 8
) -> np.ndarray:
    """A permutation of the samples (given each sample's shard number), from (seed, epoch) alone."""
    if shuffle not in SHUFFLES:
        raise OptionError(f"shuffle is one of {', '.join(SHUFFLES)}, not '{shuffle}'")
    if shards_per_group < 1:
        raise OptionError(f"shards_per_group must be at least 1, not {shards_per_group}")
    count = len(shards)
    if shuffle == "none":
        return np.arange(count, dtype=np.int64)
    rng = np.random.default_rng([seed, epoch, _ORDER_STREAM])
    if shuffle == "global":
        return rng.permutation(count).astype(np.int64)
    shard_ids = _distinct(np.asarray(shards, dtype=np.int64))
    group_of_shard = np.empty(int(shard_ids.max()) + 1 if len(shard_ids) else 0, dtype=np.int64)
    group_of_shard[rng.permutation(shard_ids)] = np.arange(len(shard_ids)) // shards_per_group
    group = group_of_shard[shards]
    tiebreak = rng.random(count)
    return np.lexsort((tiebreak, group)).astype(np.int64)


def _distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, ascending, as `np.unique` gives them (by a sort: numpy 2's hashing `unique` is
    ~50x slower on an epoch's worth of shard numbers)."""
    ordered = np.sort(values)
    return ordered[np.concatenate([[True], ordered[1:] != ordered[:-1]])] if len(ordered) else ordered
