"""A least-recently-used cache bounded by bytes: decoded values that nearby samples read again."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import numpy as np

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
    """Keeps recently used values while their total size stays within `max_bytes` (0 disables it).

    A loader worker reads many windows of the same episode in a row (the plan keeps them close),
    so an episode's timestamps, low-dim arrays and decoded audio are read once, not per window.
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = self.misses = 0
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()

    def get(self, key: Hashable, load: Callable[[], T]) -> T:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[0]
        self.misses += 1
        value = load()
        size = size_of(value)
        if size <= self.max_bytes:
            self._entries[key] = (value, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self.bytes -= dropped
        return value

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_entries": OrderedDict(), "bytes": 0}
