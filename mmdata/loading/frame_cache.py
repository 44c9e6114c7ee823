"""Decoded frames a worker keeps for the micro-batches it reads next, evicted by the plan.

The plan says, before anything is read, which samples each of a worker's next steps holds, and the
align stage says which frames of which segments each of them needs. So when a segment is decoded for
this micro-batch, the frames of it that the next `HORIZON` steps will ask for are decoded in the same
pass and kept; a later micro-batch takes them instead of decoding the segment again. A frame is kept
only while a planned sample still needs it, and when the bound is reached the segment needed last is
dropped first (the furthest next use: what the plan knows, not a guess). A frame dropped early is
decoded again, never served wrong: the cache holds exact copies of what the decoder produced for
that segment, frame and geometry.

Used by the decode stage on the CPU backends in the worker; GPU decoding in the main process does not
use it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

# How many of a worker's own next steps the cache plans for.
HORIZON = 32

SegmentKey = Hashable  # (source, SegmentRef, FrameGeometry): one segment delivered at one geometry


@dataclass
class Upcoming:
    """What a worker's next steps need: per segment key, the frames, and the first step (1 = the next) that uses it."""

    frames: dict[SegmentKey, set[int]] = field(default_factory=dict)
    first_use: dict[SegmentKey, int] = field(default_factory=dict)

    def add(self, key: SegmentKey, frames: Iterable[int], step: int) -> None:
        self.frames.setdefault(key, set()).update(frames)
        self.first_use[key] = min(self.first_use.get(key, step), step)


@dataclass
class FrameCacheStats:
    served: int = 0  # frames handed to a micro-batch from the cache
    ahead: int = 0  # frames decoded for a later micro-batch (decoded now, delivered later)
    evicted: int = 0  # frames dropped before their last planned use
    peak_bytes: int = 0

    def snapshot(self) -> dict[str, int]:
        return {"served": self.served, "ahead": self.ahead, "evicted": self.evicted, "peak_bytes": self.peak_bytes}


class FrameCache:
    """Frames of segments, at most `max_bytes` of them, kept for the upcoming steps (0 disables it)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self.stats = FrameCacheStats()
        self.upcoming = Upcoming()
        self._frames: dict[SegmentKey, dict[int, np.ndarray]] = {}

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def plan(self, upcoming: Upcoming) -> None:
        """What the next steps need; frames no longer needed are dropped now."""
        self.upcoming = upcoming
        for key in list(self._frames):
            needed = upcoming.frames.get(key, set())
            kept = self._frames[key]
            for frame in [f for f in kept if f not in needed]:
                self.bytes -= kept.pop(frame).nbytes
            if not kept:
                del self._frames[key]

    def cached(self, key: SegmentKey) -> Mapping[int, np.ndarray]:
        return self._frames.get(key, {})

    def wanted_ahead(self, key: SegmentKey) -> set[int]:
        """The frames of `key` the next steps need that are not kept: worth decoding with this step's."""
        if not self.enabled:
            return set()
        return self.upcoming.frames.get(key, set()) - set(self.cached(key))

    def keep(self, key: SegmentKey, frame: int, pixels: np.ndarray) -> None:
        """Keep a copy of a decoded frame the next steps need, within the bound."""
        if not self.enabled or frame not in self.upcoming.frames.get(key, ()):
            return
        kept = self._frames.setdefault(key, {})
        if frame in kept:
            return
        copy = np.array(pixels, copy=True)
        kept[frame] = copy
        self.bytes += copy.nbytes
        self._within_bound()
        self.stats.peak_bytes = max(self.stats.peak_bytes, self.bytes)

    def _within_bound(self) -> None:
        """Drop whole segments, the one needed last first, until the frames fit."""
        if self.bytes <= self.max_bytes:
            return
        never = len(self.upcoming.first_use) + HORIZON + 1
        by_last_use = sorted(self._frames, key=lambda k: self.upcoming.first_use.get(k, never), reverse=True)
        for key in by_last_use:
            if self.bytes <= self.max_bytes:
                break
            dropped = self._frames.pop(key)
            self.bytes -= sum(frame.nbytes for frame in dropped.values())
            self.stats.evicted += len(dropped)
