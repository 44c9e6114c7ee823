"""A keyed permutation of [0, n) evaluated at any point without the permutation being made: the place of
the k-th sample of an epoch of a billion samples costs the same as of a hundred, in time and in memory.

A balanced Feistel network over the smallest even number of bits that holds n, made a bijection of [0, n)
by cycle walking (a value that lands outside is sent through the network again until it lands inside; it
lands inside within four passes on average, as the network's domain is less than four times n). The
network is a bijection whatever its round function; the round function (a 64-bit mixer of the key, the
round and the half) decides how random the order looks.
"""

from __future__ import annotations

import numpy as np

from mmdata.errors import OptionError

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
