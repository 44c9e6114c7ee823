"""The epoch's sample order: random, yet local enough that a worker reads few shards at a time.

"locality" shuffles the shards, takes them `shards_per_group` at a time and shuffles the samples
of each group together (as WebDataset's shard shuffle plus sample buffer does, but exactly
reproducible); "global" is one permutation of every sample; "none" keeps manifest order;
"segments" (`segment_order`) keeps the samples that read one stored video segment close together
in one lane of steps, so a worker's decoded-frame cache serves them from one decode; "blocks"
(`planning.block_order`) does the same for epochs too large to order whole, each rank planning
only its own steps. "auto", a loader's default, is "blocks" for an epoch of more than
`BLOCKS_FROM` samples (of a store or a mixture) counted in batches or windows under a token
budget, else "segments" where it applies and "locality" elsewhere (`resolve_shuffle`).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from mmdata.errors import OptionError

Shuffle = Literal["auto", "locality", "global", "none", "segments", "blocks"]
SHUFFLES = ("locality", "global", "none", "segments", "blocks")  # the orders an epoch is made in
SHUFFLE_MODES = ("auto", *SHUFFLES)  # what a loader takes: "auto" is resolved by `resolve_shuffle`
_ORDER_STREAM = 0x5A3D
# Names the way `segment_order` makes an epoch's steps; a loader state carries it (in its fingerprint), so a state
# saved by another way is refused by name rather than resumed into other steps. Changes with the steps it makes.
SEGMENT_ORDER_VERSION = "lanes cut to their steps"
# Samples from which "auto" plans a single store in the "blocks" order: above it, ordering the whole epoch in every
# rank takes seconds and hundreds of MB (`benchmarks/scale_bench.py`); below it, the orders keep the batches they made.
BLOCKS_FROM = 1 << 24


def as_shuffle(value: Shuffle | bool) -> Shuffle:
    """A shuffle mode from torch's `shuffle=True/False` (the default "auto" / "none") or by name."""
    if isinstance(value, (bool, np.bool_)):
        return "auto" if value else "none"
    if value not in SHUFFLE_MODES:
        raise OptionError(f"shuffle is True, False or one of {', '.join(SHUFFLE_MODES)}, not {value!r}")
    return value


def resolve_shuffle(mode: Shuffle, counts_samples: bool, reads_video: bool, epoch_samples: int = 0) -> Shuffle:
    """The order "auto" stands for: "blocks" where an epoch holds more than `BLOCKS_FROM` samples
    (`epoch_samples`: a store's samples or a mixture's slots), else "segments" where batches count samples and
    the samples read a camera (its frame cache then decodes each frame about once per epoch), else "locality".
    Other modes are themselves."""
    if mode != "auto":
        return mode
    if epoch_samples > BLOCKS_FROM:
        return "blocks"
    return "segments" if counts_samples and reads_video else "locality"


def sample_order(
    shards: np.ndarray, seed: int, epoch: int, shuffle: Shuffle = "locality", shards_per_group: int = 8
) -> np.ndarray:
    """A permutation of the samples (given each sample's shard number), from (seed, epoch) alone."""
    if shuffle not in SHUFFLES:
        raise OptionError(f"shuffle is one of {', '.join(SHUFFLES)}, not '{shuffle}'")
    if shards_per_group < 1:
        raise OptionError(f"shards_per_group must be at least 1, not {shards_per_group}")
    if shuffle in ("segments", "blocks"):
        raise OptionError(f"the '{shuffle}' order is made from the samples' segments, not by sample_order")
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


def segment_order(
    blocks: np.ndarray, seed: int, epoch: int, lanes: int, open_blocks: int, step_samples: int
) -> np.ndarray:
    """A permutation of the samples in which the samples of one segment (`blocks`: a number per sample, the
    same for the samples that read the same stored segment) lie close together in one lane, from (seed,
    epoch) alone.

    The segments are shuffled and their samples, in that order, cut into `lanes` lanes of exactly the samples
    each lane's steps hold (step `k` is lane `k % lanes`'s, to the epoch's last step), so at most `lanes - 1`
    segments are shared by two lanes. Each lane keeps `open_blocks` segments open and draws one sample from each
    in turn (a segment's samples in the order they are numbered, their time order), opening the lane's next
    segment in a slot whose segment is used up; the lanes take turns, `step_samples` samples (one step) at a
    time. With a multiple of the loader's workers as lanes, each lane goes to one worker for the whole epoch,
    whose frame cache decodes a segment's next frames once for its next samples, while each step mixes
    `open_blocks` segments (episodes) and consecutive steps come from different lanes. More open segments mix
    more and keep more decoded frames alive.
    """
    if lanes < 1 or open_blocks < 1 or step_samples < 1:
        raise OptionError("lanes, open segments and samples per step must each be at least 1")
    count = len(blocks)
    if count == 0:
        return np.empty(0, np.int64)
    rng = np.random.default_rng([seed, epoch, _ORDER_STREAM, 1])
    ids, block = np.unique(np.asarray(blocks, dtype=np.int64), return_inverse=True)
    rank = rng.permutation(len(ids))[block]  # each sample's segment's place in the shuffled list
    sequence = np.argsort(rank, kind="stable")  # the shuffled segments' samples, each segment's in time order
    lane = np.empty(count, np.int64)
    lane[sequence] = np.repeat(np.arange(lanes), _lane_sizes(count, lanes, step_samples))
    # a segment cut between two lanes is one piece in each; a lane's pieces fill its slots in turn
    new_piece = np.concatenate([[True], (np.diff(rank[sequence]) != 0) | (np.diff(lane[sequence]) != 0)])
    piece = np.empty(count, np.int64)
    piece[sequence] = np.cumsum(new_piece) - 1
    first_piece = np.full(lanes, count, np.int64)
    np.minimum.at(first_piece, lane, piece)
    slot = (piece - first_piece[lane]) % open_blocks
    # per (lane, slot): its pieces in turn, a piece's samples in time order, as the sort is stable:
    # a worker's next reads need a segment's next frames
    grouped = np.lexsort((piece, slot, lane))
    keys = lane[grouped] * open_blocks + slot[grouped]
    starts = np.concatenate([[0], np.flatnonzero(np.diff(keys)) + 1])
    run = np.arange(count) - np.repeat(starts, np.diff(np.concatenate([starts, [count]])))
    drawn = grouped[np.lexsort((slot[grouped], run, lane[grouped]))]  # per lane: one from each slot in turn
    lane_of = lane[drawn]
    lane_starts = np.searchsorted(lane_of, np.arange(lanes))
    position = np.arange(count) - lane_starts[lane_of]
    return drawn[np.lexsort((position, lane_of, position // step_samples))].astype(np.int64)


def _lane_sizes(count: int, lanes: int, step_samples: int) -> np.ndarray:
    """How many of `count` samples each lane holds when step `k` of `step_samples` samples is lane `k % lanes`'s
    and the last step holds what is left."""
    steps = -(-count // step_samples)
    sizes = (steps // lanes + (np.arange(lanes) < steps % lanes)) * step_samples
    sizes[(steps - 1) % lanes] -= steps * step_samples - count
    return sizes


def _distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, ascending, as `np.unique` gives them (by a sort: numpy 2's hashing `unique` is
    ~50x slower on an epoch's worth of shard numbers)."""
    ordered = np.sort(values)
    return ordered[np.concatenate([[True], ordered[1:] != ordered[:-1]])] if len(ordered) else ordered
