"""A least-recently-used cache bounded by bytes: decoded values that nearby samples read again."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import numpy as np
from cachetools import LRUCache

T = TypeVar("T")


def size_of(value: Any) -> int:
    """Bytes held by an array, or by the arrays inside a tuple or an object's attributes."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, (tuple, list)):
        return sum(size_of(v) for v in value)
    if hasattr(value, "__dict__"):
        return sum(size_of(v) for v in vars(value).values())
    return 64


class ByteBudgetCache:
    """Keeps recently used values while their total size stays within `max_bytes` (0 disables it): a
    `cachetools.LRUCache` weighed by `size_of`, counting hits and misses.

    A loader worker reads many windows of the same episode in a row (the plan keeps them close),
    so an episode's timestamps, low-dim arrays and decoded audio are read once, not per window.
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.hits = self.misses = 0
        self._entries: LRUCache = LRUCache(maxsize=max(max_bytes, 1), getsizeof=size_of)

    @property
    def bytes(self) -> int:
        return int(self._entries.currsize)

    def get(self, key: Hashable, load: Callable[[], T]) -> T:
        try:
            value = self._entries[key]
        except KeyError:
            self.misses += 1
        else:
            self.hits += 1
            return value
        value = load()
        if self.max_bytes and size_of(value) <= self.max_bytes:
            self._entries[key] = value
        return value

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_entries": LRUCache(maxsize=max(self.max_bytes, 1), getsizeof=size_of)}
