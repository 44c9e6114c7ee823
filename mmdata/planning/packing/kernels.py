"""Numba kernels for bin packing by token counts: first-fit decreasing in O(n log n), and minimum bin slack.

First fit keeps a segment tree over bins holding each bin's remaining capacity, so the leftmost
bin with room is found in O(log bins). Minimum bin slack keeps a segment tree over the items'
lengths (0..capacity) counting the items at each, so "the longest item that fits" and the pair and triple
searches that complete a bin cost O(log capacity) per probe.
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


# The completion search of minimum bin slack: how many candidates it tries per bin.
_TRIPLE_FIRST_TRIES = 16
_PAIR_TRIES = 64
_GREEDY_LOOKAHEAD = 64


@njit(cache=True)
def minimum_bin_slack(lengths, capacity):
    """Bin index per item and the number of bins, filling one bin at a time.

    A bin takes the longest item that fits until its room is within three such items; from
    there it takes whichever of the longest fitting item, the best pair or the best triple
    leaves the least room (after the greedy fill that follows). Where samples come in a few
    sizes (policy windows: cameras x frames x tokens per frame + actions), first fit leaves
    every bin short by up to the smallest size; completing bins with pairs and triples fills
    them almost exactly (Gupta and Ho's minimum bin slack, limited to three items).
    """
    n = lengths.shape[0]
    size = _tree_size(capacity + 1)
    counts = np.zeros(2 * size, dtype=np.int64)  # items of each length still unpacked
    head = np.full(capacity + 1, -1, dtype=np.int64)  # a stack of items per length, lowest index on top
    next_item = np.full(max(n, 1), -1, dtype=np.int64)
    for item in range(n - 1, -1, -1):
        length = lengths[item]
        next_item[item] = head[length]
        head[length] = item
        _add(counts, size, length, 1)
    assignment = np.empty(n, dtype=np.int64)
    take = np.empty(3, dtype=np.int64)
    bins = 0
    left = n
    while left > 0:
        room = capacity
        while left > 0:
            longest = _largest_at_most(counts, size, room)
            if longest < 0:
                break
            take[0], take[1], take[2] = longest, -1, -1
            if room <= 3 * longest:
                slack = _greedy_slack(counts, size, room)
                if slack > 0:
                    pair, a, b = _best_pair(counts, size, room)
                    if pair > 0 and room - pair < slack:
                        slack = room - pair
                        take[0], take[1] = a, b
                if slack > 0:
                    triple, c, a, b = _best_triple(counts, size, room)
                    if triple > 0 and room - triple < slack:
                        take[0], take[1], take[2] = c, a, b
            for j in range(3):
                length = take[j]
                if length >= 0:
                    item = head[length]
                    head[length] = next_item[item]
                    _add(counts, size, length, -1)
                    assignment[item] = bins
                    left -= 1
                    room -= length
        bins += 1
    return assignment, bins


@njit(cache=True)
def _largest_at_most(counts, size, limit):
    """Largest value <= limit with a non-zero count, or -1."""
    node = size + limit
    if counts[node] > 0:
        return limit
    # climb until a left sibling subtree holds a count, then descend to its rightmost leaf
    while node > 1:
        if node % 2 == 1 and counts[node - 1] > 0:
            node -= 1
            while node < size:
                node = 2 * node + 1 if counts[2 * node + 1] > 0 else 2 * node
            return node - size
        node //= 2
    return -1


@njit(cache=True)
def _greedy_slack(counts, size, room):
    """Room left after taking the longest fitting item again and again (counts are restored)."""
    taken = np.empty(_GREEDY_LOOKAHEAD, dtype=np.int64)
    k = 0
    while k < _GREEDY_LOOKAHEAD and room > 0:
        length = _largest_at_most(counts, size, room)
        if length < 0:
            break
        _add(counts, size, length, -1)
        taken[k] = length
        k += 1
        room -= length
    for i in range(k):
        _add(counts, size, taken[i], 1)
    return room


@njit(cache=True)
def _best_pair(counts, size, room):
    """(sum, a, b) of the two available lengths a <= b with the largest sum <= room; sum -1 if none."""
    best, best_a, best_b = -1, -1, -1
    a = _smallest_at_least(counts, size, 1)
    tries = 0
    while a >= 0 and 2 * a <= room and tries < _PAIR_TRIES:
        b = _largest_at_most(counts, size, room - a)
        if b == a and counts[size + a] < 2:
            b = -1
        if b >= a and a + b > best:
            best, best_a, best_b = a + b, a, b
            if best == room:
                break
        a = _smallest_at_least(counts, size, a + 1)
        tries += 1
    return best, best_a, best_b


@njit(cache=True)
def _best_triple(counts, size, room):
    """(sum, c, a, b) of three available lengths with the largest sum <= room; sum -1 if none."""
    best, best_c, best_a, best_b = -1, -1, -1, -1
    smallest = _smallest_at_least(counts, size, 1)
    if smallest < 0 or room - 2 * smallest < 1:
        return best, best_c, best_a, best_b
    c = _largest_at_most(counts, size, room - 2 * smallest)
    tries = 0
    while c >= 1 and tries < _TRIPLE_FIRST_TRIES:
        _add(counts, size, c, -1)
        pair, a, b = _best_pair(counts, size, room - c)
        _add(counts, size, c, 1)
        if pair > 0 and c + pair > best:
            best, best_c, best_a, best_b = c + pair, c, a, b
            if best == room:
                break
        c = _largest_at_most(counts, size, c - 1)
        tries += 1
    return best, best_c, best_a, best_b


@njit(cache=True)
def bin_loads(assignment, bins, lengths):
    """Tokens and sum of squared lengths (attention cost) per bin."""
    tokens = np.zeros(bins, dtype=np.int64)
    squares = np.zeros(bins, dtype=np.float64)
    for item in range(assignment.shape[0]):
        tokens[assignment[item]] += lengths[item]
        squares[assignment[item]] += float(lengths[item]) * float(lengths[item])
    return tokens, squares
