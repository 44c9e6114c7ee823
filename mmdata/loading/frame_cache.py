"""Decoded frames a worker keeps for the micro-batches it reads next, evicted by the plan.

The plan says, before anything is read, which samples each of a worker's next reads holds, and the
align stage says which frames of which segments each of them needs. So when a segment is decoded for
this micro-batch, the frames of it that the next `HORIZON` reads will ask for are decoded in the same
pass and kept; a later micro-batch takes them instead of decoding the segment again. A frame is kept
only while a planned read still needs it, and when the bound is reached the segment needed last is
dropped first (the furthest next use: what the plan knows, not a guess). A frame dropped early is
decoded again, never served wrong: the cache holds exact copies of what the decoder produced for
that segment, frame and geometry.

The cache keeps views of the decoder's outputs, not copies, when most of an output is kept (a segment's frames
for its next samples, the common case), and counts each output it holds once, whole; from any other output it
copies the kept frames out, so the bound holds either way.

A read's needs enter the cache's schedule once, when the read first comes into the horizon, and leave it
once the read is done, so planning costs the same per read however long the horizon is.

The cache holds its frames where they are decoded. A worker that decodes plans and keeps them itself; a
worker whose video the main process decodes (GPU decoders) only plans, and sends with each micro-batch what
it added to its schedule (`CacheSchedule`); the main process keeps one cache per such worker that follows
those schedules (`follow`), so it makes the same choices, holding the frames in the decoder's memory (GPU memory for
a GPU decoder). Decoders with a host-side preparation (DALI, hybrid) decode without it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# How many of a worker's own next reads the cache plans for.
HORIZON = 32
# Kept frames view a decoder's output (no copy) when they are at least this share of the memory the view keeps
# alive, which then counts against the bound whole: at most a third more memory per kept frame than copies.
VIEWED_SHARE = 0.75

SegmentKey = Hashable  # (source, episode, stream, segment, FrameGeometry): one segment delivered at one geometry
Needs = list[tuple[SegmentKey, tuple[int, ...]]]  # one read's frames, per segment key


@dataclass(frozen=True)
class CacheSchedule:
    """What a worker's cache schedule gained at one of its reads, for the cache in the process that decodes it:
    the read's number, the planning worker (its process id) and the (read, needs) it expected then."""

    read: int
    owner: int
    expected: tuple[tuple[int, Needs], ...]


@dataclass
class FrameCacheStats:
    served: int = 0  # frames handed to a micro-batch from the cache
    ahead: int = 0  # frames decoded for a later micro-batch (decoded now, delivered later)
    evicted: int = 0  # frames dropped before their last planned use
    peak_bytes: int = 0

    def snapshot(self) -> dict[str, int]:
        return {"served": self.served, "ahead": self.ahead, "evicted": self.evicted, "peak_bytes": self.peak_bytes}


class FrameCache:
    """Frames of segments, at most `max_bytes` of them, kept for the reads planned next (0 disables it).

    The reader numbers its reads: `start_read` begins the next one, `expect` says what a read (this one
    or a later one) needs, `keep` offers a decoded frame and `cached` serves the kept ones.
    """

    def __init__(self, max_bytes: int, stats: FrameCacheStats | None = None):
        self.max_bytes = max_bytes
        self.bytes = 0
        self.stats = stats if stats is not None else FrameCacheStats()
        self._frames: dict[SegmentKey, dict[int, Any]] = {}
        self._holder_of: dict[SegmentKey, dict[int, Hashable]] = {}  # per key, frame -> the memory its pixels view
        self._holders: dict[Hashable, list[int]] = {}  # per viewed memory: [its bytes, how many kept frames view it]
        self._read = -1  # the read in progress
        self._needs: dict[int, Needs] = {}  # per planned read
        self._wanted: dict[SegmentKey, dict[int, int]] = {}  # per key, frame -> planned needs of it
        self._users: dict[SegmentKey, dict[int, int]] = {}  # per key, planned read -> needs of the key
        self._now: dict[SegmentKey, dict[int, int]] = {}  # the needs of the read in progress
        self._pinned: set[SegmentKey] = set()  # segments the read in progress takes from the cache unread
        self._unplanned = False  # frames are kept that no plan may want (`forget_later`)

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def start_read(self) -> int:
        """Begin the next read and return its number; what the reads before it needed leaves the schedule, and
        frames no planned read needs any more are dropped."""
        self._read += 1
        for number in [number for number in self._needs if number < self._read]:
            for key, frames in self._needs.pop(number):
                self._forget(number, key, frames)
        self._now, self._pinned = {}, set()
        for key, frames in self._needs.get(self._read, ()):
            self._count(self._now.setdefault(key, {}), frames)
        return self._read

    def follow(self, schedule: CacheSchedule) -> None:
        """Begin read `schedule.read` with the needs its planner expected then: the cache then makes the planner's
        choices for frames decoded in this process."""
        self._read = schedule.read - 1
        self.start_read()
        for read, needs in schedule.expected:
            self.expect(read, needs)

    @property
    def next_read(self) -> int:
        """The number `start_read` gives next."""
        return self._read + 1

    def forget_later(self) -> None:
        """Drop what the reads after the one in progress were expected to need (their steps went to another
        reader), so that the next reads are planned afresh. The frames stay until those plans are made
        (`release_unplanned`): what the new steps need of them is not decoded again."""
        for number in [number for number in self._needs if number > self._read]:
            for key, frames in self._needs.pop(number):
                self._forget(number, key, frames, release=False)
        self._unplanned = True

    def release_unplanned(self) -> None:
        """After `forget_later` and the new plans: let go of the kept frames no planned read needs."""
        if not self._unplanned:
            return
        self._unplanned = False
        for key in list(self._frames):
            wanted = self._wanted.get(key, {})
            for frame in [frame for frame in self._frames[key] if frame not in wanted]:
                self._release(key, frame)

    def knows(self, read: int) -> bool:
        return read in self._needs

    def expect(self, read: int, needs: Needs) -> None:
        """Add what `read` (the one in progress or a later one) needs to the schedule."""
        if read < self._read:
            return
        self._needs.setdefault(read, []).extend(needs)
        for key, frames in needs:
            self._count(self._wanted.setdefault(key, {}), frames)
            users = self._users.setdefault(key, {})
            users[read] = users.get(read, 0) + 1
            if read == self._read:
                self._count(self._now.setdefault(key, {}), frames)

    def cached(self, key: SegmentKey) -> Mapping[int, Any]:
        return self._frames.get(key, {})

    def serves(self, key: SegmentKey, frames: Iterable[int]) -> bool:
        """Whether the read in progress takes all of `frames` of `key` from the cache (then it need not read the
        segment); they stay kept until the read is done."""
        kept = self._frames.get(key, {})
        if key not in self._now or not all(frame in kept for frame in frames):
            return False
        self._pinned.add(key)
        return True

    def holds(self, key: SegmentKey, frames: Iterable[int]) -> bool:
        """Whether all of `frames` of `key` are kept now (for a later read: nothing is pinned for it)."""
        kept = self._frames.get(key, {})
        return all(frame in kept for frame in frames)

    def wanted_ahead(self, key: SegmentKey, frame_bytes: int = 0) -> set[int]:
        """The frames of `key` the later reads need that are not kept: worth decoding with this read's when they
        can be kept (none when frames of `frame_bytes` each would not fit the bound together: decoding them now
        would only evict them)."""
        if not self.enabled:
            return set()
        kept = self.cached(key)
        ahead = {frame for frame in self._wanted.get(key, {}) if frame not in kept and self._needed_later(key, frame)}
        return ahead if len(ahead) * frame_bytes <= self.max_bytes else set()

    def keep_decoded(self, key: SegmentKey, frames: Sequence[int], output: Any) -> None:
        """Keep the frames of `key` a later read needs from a decoder's `output` (row `i` holds `frames[i]`: a host
        array or a device tensor), within the bound: as views of `output` when they are at least `VIEWED_SHARE` of
        the memory a view of it keeps alive, else as a compact copy of just them."""
        if not self.enabled:
            return
        kept = self._frames.get(key, {})
        rows: Sequence[int] = [
            row for row, frame in enumerate(frames) if frame not in kept and self._needed_later(key, frame)
        ]
        if not rows:
            return
        memory = _memory_of(output)
        if memory is None or len(rows) * output[rows[0]].nbytes < VIEWED_SHARE * memory[1]:
            output, frames, rows = _compact(output, rows), [frames[row] for row in rows], range(len(rows))
            memory = _memory_of(output)
        assert memory is not None, "a compact copy is memory of its own"
        identity, size = memory
        holder = self._holders.setdefault(identity, [size, 0])
        if not holder[1]:
            self.bytes += size
        holder[1] += len(rows)
        kept, holders = self._frames.setdefault(key, {}), self._holder_of.setdefault(key, {})
        for row in rows:
            kept[frames[row]], holders[frames[row]] = output[row], identity
        self._within_bound()
        self.stats.peak_bytes = max(self.stats.peak_bytes, self.bytes)

    def _release(self, key: SegmentKey, frame: int) -> None:
        """Let go of a kept frame (and of its key once none is kept); the memory it views is counted off once no
        kept frame views it."""
        del self._frames[key][frame]
        identity = self._holder_of[key].pop(frame)
        if not self._frames[key]:
            del self._frames[key], self._holder_of[key]
        holder = self._holders[identity]
        holder[1] -= 1
        if not holder[1]:
            del self._holders[identity]
            self.bytes -= holder[0]

    def _needed_later(self, key: SegmentKey, frame: int) -> bool:
        """Whether a read after the one in progress needs `frame` of `key` (more planned needs than this read's)."""
        return self._wanted.get(key, {}).get(frame, 0) > self._now.get(key, {}).get(frame, 0)

    @staticmethod
    def _count(counts: dict[int, int], frames: Iterable[int]) -> None:
        for frame in frames:
            counts[frame] = counts.get(frame, 0) + 1

    def _forget(self, read: int, key: SegmentKey, frames: tuple[int, ...], release: bool = True) -> None:
        users = self._users[key]
        users[read] -= 1
        if not users[read]:
            del users[read]
        wanted, kept = self._wanted[key], self._frames.get(key, {})
        for frame in frames:
            wanted[frame] -= 1
            if not wanted[frame]:
                del wanted[frame]
                if frame in kept and release:
                    self._release(key, frame)
        if not users:
            del self._users[key], self._wanted[key]

    def _within_bound(self) -> None:
        """Drop whole segments, the one needed last first, until the frames fit; a segment the read in progress
        takes from the cache unread is not dropped (the frame just kept is, when nothing else can be)."""
        if self.bytes <= self.max_bytes:
            return
        droppable = [key for key in self._frames if key not in self._pinned]
        droppable.sort(key=lambda k: min(self._users.get(k, {}), default=self._read), reverse=True)
        for key in droppable:
            if self.bytes <= self.max_bytes:
                break
            frames = list(self._frames[key])
            for frame in frames:
                self._release(key, frame)
            self.stats.evicted += len(frames)


def _memory_of(pixels: Any) -> tuple[Hashable, int] | None:
    """What a view of `pixels` keeps alive: its identity and bytes (None: memory that may be written again, such
    as a frame ring's, which is never viewed)."""
    if isinstance(pixels, np.ndarray):
        root = pixels
        while isinstance(root.base, np.ndarray):
            root = root.base
        return (id(root), root.nbytes) if root.base is None and root.flags.owndata else None
    if hasattr(pixels, "untyped_storage"):
        storage = pixels.untyped_storage()
        return (str(pixels.device), storage.data_ptr()), storage.nbytes()
    return None


def _compact(output: Any, rows: Sequence[int]) -> Any:
    """The frames at `rows` of a decoder output (an array, a tensor or a list of frames) in memory of their own."""
    if isinstance(output, np.ndarray):
        return output[np.asarray(rows)]
    if not isinstance(output, list):
        return output[list(rows)]  # a tensor: indexing by a list copies
    picked = [output[row] for row in rows]
    if isinstance(picked[0], np.ndarray):
        return np.stack(picked)
    joined = picked[0].new_empty((len(picked), *picked[0].shape))
    for place, frame in enumerate(picked):
        joined[place] = frame
    return joined
