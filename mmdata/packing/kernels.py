"""Numba kernels for bin packing by token counts: first-fit and best-fit decreasing in O(n log n).

First fit keeps a segment tree over bins holding each bin's remaining capacity, so the leftmost
bin with room is found in O(log bins). Best fit keeps a segment tree over remaining-capacity
values (0..capacity) counting the bins at each, and a stack of bins per value, so the bin with
the least room that still fits is found in O(log capacity).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _tree_size(n):
    size = 1
    while size < n:
        size *= 2
    return size


@njit(cache=True)
def first_fit_decreasing(lengths, capacity):
    """Bin index per item (items taken longest first, ties by index) and the number of bins."""
    n = lengths.shape[0]
    order = np.argsort(-lengths, kind="mergesort")
    # Any-fit packing never leaves two bins at most half full, so it opens fewer than
    # 2 * total / capacity + 1 bins: the tree needs no more leaves than that.
    size = _tree_size(max(1, min(n, 2 * (lengths.sum() // capacity) + 2)))
    tree = np.zeros(2 * size, dtype=np.int64)  # max remaining capacity in each subtree; unopened bins = capacity
    for leaf in range(size):
        tree[size + leaf] = capacity
    for node in range(size - 1, 0, -1):
        tree[node] = max(tree[2 * node], tree[2 * node + 1])
    assignment = np.empty(n, dtype=np.int64)
    bins = 0
    for k in range(n):
        item = order[k]
        need = lengths[item]
        node = 1
        while node < size:
            node = 2 * node if tree[2 * node] >= need else 2 * node + 1
        leaf = node - size
        assignment[item] = leaf
        if leaf + 1 > bins:
            bins = leaf + 1
        tree[node] -= need
        node //= 2
        while node >= 1:
            tree[node] = max(tree[2 * node], tree[2 * node + 1])
            node //= 2
    return assignment, bins


@njit(cache=True)
def best_fit_decreasing(lengths, capacity):
    """Bin index per item, each put in the open bin with the least room that fits it."""
    n = lengths.shape[0]
    order = np.argsort(-lengths, kind="mergesort")
    size = _tree_size(capacity + 1)
    counts = np.zeros(2 * size, dtype=np.int64)  # bins whose remaining capacity is each value
    head = np.full(capacity + 1, -1, dtype=np.int64)  # a stack of bins per remaining capacity
    next_bin = np.full(max(n, 1), -1, dtype=np.int64)
    assignment = np.empty(n, dtype=np.int64)
    bins = 0
    for k in range(n):
        item = order[k]
        need = lengths[item]
        value = -1
        if counts[1] > 0:
            value = _smallest_at_least(counts, size, need)
        if value < 0:
            chosen = bins
            bins += 1
            room = capacity
        else:
            chosen = head[value]
            head[value] = next_bin[chosen]
            _add(counts, size, value, -1)
            room = value
        assignment[item] = chosen
        room -= need
        next_bin[chosen] = head[room]
        head[room] = chosen
        _add(counts, size, room, 1)
    return assignment, bins


@njit(cache=True)
def _add(counts, size, value, delta):
    node = size + value
    while node >= 1:
        counts[node] += delta
        node //= 2


@njit(cache=True)
def _smallest_at_least(counts, size, need):
    """Smallest value >= need with a non-zero count, or -1."""
    node = size + need
    if counts[node] > 0:
        return need
    # climb until a right sibling subtree holds a count, then descend to its leftmost leaf
    while node > 1:
        if node % 2 == 0 and counts[node + 1] > 0:
            node += 1
            while node < size:
                node = 2 * node if counts[2 * node] > 0 else 2 * node + 1
            return node - size
        node //= 2
    return -1


@njit(cache=True)
def bin_loads(assignment, bins, lengths):
    """Tokens and sum of squared lengths (attention cost) per bin."""
    tokens = np.zeros(bins, dtype=np.int64)
    squares = np.zeros(bins, dtype=np.float64)
    for item in range(assignment.shape[0]):
        tokens[assignment[item]] += lengths[item]
        squares[assignment[item]] += float(lengths[item]) * float(lengths[item])
    return tokens, squares


@njit(cache=True)
def bucket_indices(lengths, boundaries):
    """Bucket per item: the first boundary >= its length (len(boundaries) when longer than all)."""
    return np.searchsorted(boundaries, lengths, side="left")
