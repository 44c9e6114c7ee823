"""An epoch's order: a map from each position of the epoch to the sample read there, evaluated position by position
(nothing of the size of the epoch is made), so one planner serves ten samples and a billion alike.

Samples are numbered in manifest and time order (`planning.sample_index`). The orders:

- "blocks": each episode's samples cut into blocks of a stored segment's worth, the blocks in a keyed permutation and
  dealt in turn from `open_blocks` of them, so that a worker's frame cache decodes a segment once for its samples
  while each step mixes several episodes (`EpisodeBlockOrder` over `BlockOrder`);
- "locality": the runs of samples of one shard in a keyed permutation, taken `shards_per_group` runs at a time,
  the samples of each group in a keyed permutation of their own (WebDataset's shard shuffle and sample buffer,
  exactly reproducible: a worker reads few shards at a time);
- "global": one keyed permutation of every sample;
- "none": manifest and time order;
- "auto", a loader's default: "blocks" where the samples read a camera, else "locality" (`resolve_shuffle`).

Every permutation is a `KeyedPermutation` keyed by (seed, epoch): a balanced Feistel network over the smallest even
number of bits that holds n, made a bijection of [0, n) by cycle walking (a value that lands outside is sent through
again; it lands inside within four passes on average), its round function a 64-bit mixer of the key, the round and
the half. So an order costs the same at any size and any position of it is found without the positions before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from mmdata.errors import OptionError

Shuffle = Literal["auto", "blocks", "locality", "global", "none"]
SHUFFLES = ("blocks", "locality", "global", "none")  # the orders an epoch is made in
SHUFFLE_MODES = ("auto", *SHUFFLES)  # what a loader takes: "auto" is resolved by `resolve_shuffle`
# Names the way the orders and their dealing make an epoch's steps; a loader state carries it (in its fingerprint),
# so a state saved by another way is refused by name rather than resumed into other steps. Changes with the steps.
ORDER_VERSION = "one planner 2"
# Slots an epoch of a mixture may hold in this order: the spreads multiply two slot numbers in 64 bits.
MAX_MIXED_SLOTS = 1 << 32
_BLOCK_STREAM, _GLOBAL_STREAM, _LOCALITY_STREAM = 0xB10C, 0x610B, 0x10CA
REMAINDER_CHUNKS = 1024  # runs of episodes whose last, shorter segments the "blocks" order puts in a keyed order


ROUNDS = 6
_MASK64 = (1 << 64) - 1


class KeyedPermutation:
    """A bijection of [0, `size`) chosen by `key` (any integer; equal keys give equal permutations)."""

    def __init__(self, size: int, key: int):
        if size < 0:
            raise OptionError(f"a permutation's size is at least 0, not {size}")
        self.size = int(size)
        self.half_bits = max(1, (max(1, self.size - 1).bit_length() + 1) // 2)
        self._mask = np.uint64((1 << self.half_bits) - 1)
        self._round_keys = [np.uint64(_mix(key * ROUNDS + number + 1)) for number in range(ROUNDS)]

    def __len__(self) -> int:
        return self.size

    def __call__(self, positions: np.ndarray | int) -> np.ndarray:
        """Where each of `positions` (in [0, size)) goes, as int64."""
        points = np.asarray(positions, dtype=np.int64)
        if points.size and (points.min() < 0 or points.max() >= self.size):
            raise IndexError(f"positions must lie in [0, {self.size})")
        values = self._network(points.astype(np.uint64))
        outside = np.flatnonzero(values >= self.size)
        while len(outside):
            values[outside] = self._network(values[outside])
            outside = outside[values[outside] >= self.size]
        return values.astype(np.int64)

    def _network(self, values: np.ndarray) -> np.ndarray:
        shift = np.uint64(self.half_bits)
        left, right = values >> shift, values & self._mask
        for round_key in self._round_keys:
            left, right = right, left ^ (_mix_array(right ^ round_key) & self._mask)
        return (left << shift) | right


def _mix(value: int) -> int:
    """splitmix64's finaliser of one integer (the round keys)."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def _mix_array(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over uint64 values (wrapping products, as the mixer wants)."""
    values = values * np.uint64(0x9E3779B97F4A7C15)
    values = (values ^ (values >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    values = (values ^ (values >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return values ^ (values >> np.uint64(31))


def as_shuffle(value: Shuffle | bool) -> Shuffle:
    """An order from torch's `shuffle=True/False` (the default "auto" / "none") or by name."""
    if isinstance(value, (bool, np.bool_)):
        return "auto" if value else "none"
    if value == "segments":
        raise OptionError(
            "the 'segments' order is now 'blocks' (the same order at any size: runs of a segment's samples dealt in"
            " turn); give shuffle='blocks', or leave the 'auto' default"
        )
    if value not in SHUFFLE_MODES:
        raise OptionError(f"shuffle is True, False or one of {', '.join(SHUFFLE_MODES)}, not {value!r:.60}")
    return value


def resolve_shuffle(mode: Shuffle, reads_video: bool) -> Shuffle:
    """The order "auto" stands for: "blocks" where the samples read a camera (its frame cache then decodes each
    frame about once per epoch), else "locality". Other modes are themselves."""
    if mode != "auto":
        return mode
    return "blocks" if reads_video else "locality"


class Order(Protocol):
    """One epoch's order of `count` samples: the sample at any of its positions."""

    @property
    def count(self) -> int: ...

    def samples_at(self, positions: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class IdentityOrder:
    """The "none" order: position p reads sample p."""

    count: int

    def samples_at(self, positions: np.ndarray) -> np.ndarray:
        return np.asarray(positions, dtype=np.int64)


class GlobalOrder:
    """The "global" order: a keyed permutation of every sample."""

    def __init__(self, count: int, seed: int, epoch: int):
        self.count = count
        self._permutation = KeyedPermutation(count, _key(seed, epoch, _GLOBAL_STREAM))

    def samples_at(self, positions: np.ndarray) -> np.ndarray:
        return self._permutation(np.asarray(positions, dtype=np.int64))


class LocalityOrder:
    """The "locality" order (see the module) of `count` samples whose runs of one shard begin at `run_starts`
    (ascending, the first 0): the runs permuted, grouped `shards_per_group` at a time, each group's samples
    permuted on their own. Costs the runs' arrays, not the samples'."""

    def __init__(self, count: int, run_starts: np.ndarray, shards_per_group: int, seed: int, epoch: int):
        if shards_per_group < 1:
            raise OptionError(f"shards_per_group must be at least 1, not {shards_per_group}")
        self.count, self.group_runs = count, shards_per_group
        self._seed, self._epoch = seed, epoch
        starts = np.asarray(run_starts, dtype=np.int64)
        sizes = np.diff(np.append(starts, count))
        runs = KeyedPermutation(len(starts), _key(seed, epoch, _LOCALITY_STREAM))(np.arange(len(starts)))
        self._run_at = runs  # the run at each place of the permuted list
        self._run_starts = starts
        self._placed = np.concatenate([[0], np.cumsum(sizes[runs])]).astype(np.int64)  # positions before each place

    def samples_at(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        places = len(self._run_at)
        group = (np.searchsorted(self._placed, positions, side="right") - 1) // self.group_runs
        first = self._placed[group * self.group_runs]
        size = self._placed[np.minimum((group + 1) * self.group_runs, places)] - first
        shuffled = np.empty(len(positions), np.int64)
        for number in np.unique(group).tolist():
            mine = group == number
            within = KeyedPermutation(int(size[mine][0]), _key(self._seed, self._epoch, _LOCALITY_STREAM, number + 1))
            shuffled[mine] = first[mine] + within(positions[mine] - first[mine])
        place = np.searchsorted(self._placed, shuffled, side="right") - 1
        return self._run_starts[self._run_at[place]] + shuffled - self._placed[place]


@dataclass(frozen=True)
class BlockOrder:
    """The "blocks" order of one epoch of `count` samples: the samples, turned by a random offset per epoch
    (unless not `turned`), cut into blocks of `block` consecutive samples whose order a keyed permutation sets; the
    epoch's positions, in each run between two `cuts` (the lanes of the steps that read them), take that sequence of
    blocks `open_blocks` at a time, one sample from each open block in turn (a micro-batch of 8 from a group of 8
    holds 8 blocks, about 8 episodes); a run's last, shorter group is dealt from as many runs of about a block as it
    holds. Dealing within a lane keeps each block's samples on the lane, so one worker's frame cache decodes its
    segment once (a group dealt across a lane's end would leave each of its blocks half on each lane); where a
    lane is shorter than a group (a small epoch over many ranks), or without cuts, the epoch is dealt as one run."""

    count: int
    block: int
    open_blocks: int
    seed: int
    epoch: int
    turned: bool = True
    cuts: np.ndarray | None = field(default=None, compare=False)  # ascending positions, from 0 to `count`
    _blocks: KeyedPermutation = field(init=False, repr=False, compare=False)
    _lanes: np.ndarray = field(init=False, repr=False, compare=False)  # each run's first position, `count` last
    _turn: int = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.block < 1 or self.open_blocks < 1:
            raise OptionError("a block holds at least 1 sample and at least 1 block is open")
        keys = np.random.SeedSequence([self.seed, self.epoch, _BLOCK_STREAM]).generate_state(3, np.uint64)
        lanes = np.asarray([0, self.count] if self.cuts is None else self.cuts, dtype=np.int64)
        if len(lanes) < 2 or lanes[0] != 0 or lanes[-1] != self.count or np.any(np.diff(lanes) < 0):
            raise OptionError(f"an order's cuts run from 0 to its {self.count} positions, ascending")
        sizes = np.diff(lanes)
        if sizes[sizes > 0].min(initial=self.count) < self.block * self.open_blocks:
            lanes = np.array([0, self.count], np.int64)  # (lanes shorter than a group: mixing them matters more)
        object.__setattr__(self, "_blocks", KeyedPermutation(self.count // self.block, int(keys[0])))
        object.__setattr__(self, "_lanes", lanes)
        object.__setattr__(self, "_turn", int(keys[2] % max(1, self.count)) if self.turned else 0)

    def samples_at(self, positions: np.ndarray) -> np.ndarray:
        """The sample number (manifest and time order) at each of `positions` in [0, count)."""
        positions = np.asarray(positions, dtype=np.int64)
        lane = np.searchsorted(self._lanes, positions, side="right") - 1
        first = self._lanes[lane]
        virtual = first + self._dealt(positions - first, self._lanes[lane + 1] - first)
        number, offset = np.divmod(virtual, self.block)
        whole = number < len(self._blocks)
        virtual[whole] = self._blocks(number[whole]) * self.block + offset[whole]
        return (virtual + self._turn) % max(1, self.count)

    def _dealt(self, local: np.ndarray, size: np.ndarray) -> np.ndarray:
        """Where each `local` position of a run of `size` positions lies in the run's sequence of blocks: each group
        of `open_blocks` blocks dealt one sample from each in turn; the run's last, shorter group of `n` positions
        cut into `ceil(n / block)` parts (at most `open_blocks`) of near-equal sizes, dealt the same way."""
        span = self.block * self.open_blocks
        group, within = np.divmod(local, span)
        held = np.minimum(span, size - group * span)  # (the group's positions)
        parts = np.clip(-(-held // self.block), 1, self.open_blocks)
        turn, part = np.divmod(within, parts)
        smallest, larger = np.divmod(held, parts)  # (the first `larger` parts hold one more)
        return group * span + part * smallest + np.minimum(part, larger) + turn


@dataclass(frozen=True)
class SourceInterleave:
    """The source of each position of an epoch of `sum(targets)` positions, and its slot among that source's."""

    targets: tuple[int, ...]

    def __post_init__(self):
        if not self.targets or min(self.targets) < 0:
            raise OptionError(f"a mixture's slots per source are at least 0, not {list(self.targets)}")
        if sum(self.targets) > MAX_MIXED_SLOTS:
            raise OptionError(
                f"an epoch of a mixture holds at most {MAX_MIXED_SLOTS:,} samples, not"
                f" {sum(self.targets):,}: give Mixture(epoch_samples=...) no larger"
            )

    def place(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, slot within the source) of each of `positions` in [0, sum(targets))."""
        local = np.asarray(positions, dtype=np.uint64)
        source = np.full(len(local), len(self.targets) - 1, np.int64)
        slot = np.empty(len(local), np.int64)
        unplaced = np.arange(len(local))
        rest = sum(self.targets)
        for number, target in enumerate(self.targets[:-1]):
            if not len(unplaced) or rest == 0:
                break
            x = local[unplaced]
            before = x * np.uint64(target) // np.uint64(rest)
            mine = (x + np.uint64(1)) * np.uint64(target) // np.uint64(rest) > before
            source[unplaced[mine]] = number
            slot[unplaced[mine]] = before[mine]
            local[unplaced[~mine]] = x[~mine] - before[~mine]
            unplaced = unplaced[~mine]
            rest -= target
        slot[unplaced] = local[unplaced]
        return source, slot

    def counts_before(self, positions: np.ndarray) -> np.ndarray:
        """`[len(positions), sources]`: how many of each source's slots lie before each of `positions` (the same
        chain of even spreads as `place`, counted in closed form)."""
        left = np.asarray(positions, dtype=np.uint64).copy()
        counts = np.empty((len(left), len(self.targets)), np.int64)
        rest = sum(self.targets)
        for number, target in enumerate(self.targets[:-1]):
            mine = left * np.uint64(target) // np.uint64(rest) if rest else np.zeros_like(left)
            counts[:, number] = mine
            left -= mine
            rest -= target
        counts[:, -1] = left
        return counts


@dataclass(frozen=True, eq=False)
class EpisodeBlocks:
    """A source's episodes cut into whole blocks of `block` samples from each one's first (`episode_blocks`), worked
    out once and kept for every epoch: each episode's first sample (`firsts`, the count last), the whole blocks
    before each episode (`whole_firsts`, all of them last) and the samples after episodes' last whole blocks before
    each episode (`rest_firsts`)."""

    block: int
    firsts: np.ndarray
    whole_firsts: np.ndarray
    rest_firsts: np.ndarray

    @property
    def whole_samples(self) -> int:
        return int(self.whole_firsts[-1]) * self.block


def episode_blocks(episode_firsts: np.ndarray, block: int) -> EpisodeBlocks:
    """The whole blocks of `block` samples of episodes whose first samples are `episode_firsts` (the count last):
    what `EpisodeBlockOrder` numbers blocks by."""
    firsts = np.asarray(episode_firsts, dtype=np.int64)
    whole = np.concatenate([[0], np.cumsum(np.diff(firsts) // block)]).astype(np.int64)
    return EpisodeBlocks(block, firsts, whole, firsts - block * whole)


class EpisodeBlockOrder:
    """The "blocks" order with its blocks cut where a store's segments are: each episode's samples from its first, in
    whole blocks of a stored segment's samples (`blocks`, so that a block is one decode), ordered as `BlockOrder`
    orders blocks. The samples after an episode's last whole block (its last, shorter segment's) are spread evenly
    over the epoch between them, each episode's together and in time order (one decode), the episodes in
    `REMAINDER_CHUNKS` runs put in a keyed order."""

    def __init__(self, blocks: EpisodeBlocks, open_blocks: int, seed: int, epoch: int, cuts: np.ndarray | None = None):
        self.count, self._cut = int(blocks.firsts[-1]), blocks
        whole = blocks.whole_samples
        self._spread = SourceInterleave((whole, self.count - whole))
        within = None if cuts is None else self._spread.counts_before(cuts)[:, 0]  # (the whole blocks' slots before)
        self._blocks = BlockOrder(whole, blocks.block, open_blocks, seed, epoch, turned=False, cuts=within)
        episodes = len(blocks.firsts) - 1
        chunks = max(1, min(REMAINDER_CHUNKS, episodes))
        self._chunk_episodes = np.linspace(0, episodes, chunks + 1).astype(np.int64)
        sizes = np.diff(blocks.rest_firsts[self._chunk_episodes])
        self._chunk_at = KeyedPermutation(chunks, _key(seed, epoch, _BLOCK_STREAM, 1))(np.arange(chunks))
        self._chunk_placed = np.concatenate([[0], np.cumsum(sizes[self._chunk_at])]).astype(np.int64)

    def samples_at(self, positions: np.ndarray) -> np.ndarray:
        cut = self._cut
        stream, slot = self._spread.place(np.asarray(positions, dtype=np.int64))
        samples = np.empty(len(slot), np.int64)
        whole = stream == 0
        number, offset = np.divmod(self._blocks.samples_at(slot[whole]), cut.block)
        episode = np.searchsorted(cut.whole_firsts, number, side="right") - 1
        samples[whole] = cut.firsts[episode] + (number - cut.whole_firsts[episode]) * cut.block + offset
        rest = slot[~whole]
        place = np.searchsorted(self._chunk_placed, rest, side="right") - 1
        first_episode = self._chunk_episodes[self._chunk_at[place]]
        remainder = cut.rest_firsts[first_episode] + rest - self._chunk_placed[place]
        episode = np.searchsorted(cut.rest_firsts, remainder, side="right") - 1
        before = cut.whole_firsts[episode + 1] - cut.whole_firsts[episode]
        samples[~whole] = cut.firsts[episode] + before * cut.block + remainder - cut.rest_firsts[episode]
        return samples


@dataclass(frozen=True, eq=False)
class OrderRecipe:
    """How one source's samples are ordered, whatever the epoch (`order`): the resolved `mode`, the samples of a
    block and the blocks open at once ("blocks"), the first sample of each run of one shard's samples and the runs
    per group ("locality")."""

    mode: Shuffle
    block: int = 1
    open_blocks: int = 8
    run_starts: np.ndarray | None = None
    shards_per_group: int = 8
    episode_firsts: np.ndarray | None = None  # ("blocks": each episode's first sample, the count last)
    _episode_blocks: EpisodeBlocks | None = field(default=None, init=False, repr=False)  # (from episode_firsts)

    def __post_init__(self):
        if self.mode not in SHUFFLES:
            raise OptionError(f"an epoch is ordered in one of {', '.join(SHUFFLES)}, not {self.mode!r:.60}")
        if self.mode == "locality" and self.run_starts is None:
            raise OptionError("the 'locality' order needs the samples' runs of one shard")
        blocks = None
        if self.mode == "blocks" and self.episode_firsts is not None:
            blocks = episode_blocks(self.episode_firsts, self.block)
        object.__setattr__(self, "_episode_blocks", blocks)

    def order(self, count: int, seed: int, epoch: int, cuts: np.ndarray | None = None) -> Order:
        """The order of an epoch of the source's `count` samples (`seed` and `epoch` key it); `cuts`, the first
        position of each lane of the steps that read it, keeps a block on one lane ("blocks")."""
        if self.mode == "none":
            return IdentityOrder(count)
        if self.mode == "global":
            return GlobalOrder(count, seed, epoch)
        if self.mode == "locality":
            assert self.run_starts is not None
            return LocalityOrder(count, self.run_starts, self.shards_per_group, seed, epoch)
        blocks = self._episode_blocks
        if blocks is None:
            return BlockOrder(count, self.block, self.open_blocks, seed, epoch, cuts=cuts)
        if count != blocks.firsts[-1]:
            raise OptionError(f"the 'blocks' order cut by episode holds {int(blocks.firsts[-1])} samples, not {count}")
        return EpisodeBlockOrder(blocks, self.open_blocks, seed, epoch, cuts)

    def block_spread(self) -> float:
        """How far apart a block's samples lie in the order against dealt alone: the epoch's samples over those of
        whole blocks (the episodes' last, shorter segments' samples lie between them); 1 without episodes."""
        blocks = self._episode_blocks
        if blocks is None or not blocks.whole_samples:
            return 1.0
        return float(blocks.firsts[-1]) / float(blocks.whole_samples)

    def describe(self) -> list:
        """What of the recipe decides the steps, for a loader state's fingerprint (the runs follow from the data)."""
        if self.mode == "blocks":
            return [self.mode, self.block, self.open_blocks, "by episode" if self.episode_firsts is not None else ""]
        if self.mode == "locality":
            return [self.mode, self.shards_per_group]
        return [self.mode]


def shard_run_starts(shards: np.ndarray, first_samples: np.ndarray) -> np.ndarray:
    """The first sample of each run of consecutive episodes in one shard (`shards`: each episode's shard, as codes
    or names; `first_samples`: each episode's first sample number and, last, the count): the runs "locality"
    shuffles. Episodes without samples join their neighbours' runs."""
    shards = np.asarray(shards)
    if len(shards) == 0:
        return np.zeros(1, np.int64)
    begins = np.flatnonzero(np.concatenate([[True], shards[1:] != shards[:-1]]))
    firsts = np.asarray(first_samples, dtype=np.int64)
    starts = firsts[begins]
    keep = np.concatenate([[True], np.diff(starts) > 0]) & (starts < firsts[-1])
    keep[0] = True
    return starts[keep]


def _key(seed: int, epoch: int, stream: int, *more: int) -> int:
    return int(np.random.SeedSequence([seed, epoch, stream, *more]).generate_state(1, np.uint64)[0])
