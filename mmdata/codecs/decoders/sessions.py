"""A pool of hardware decoder sessions on one GPU: at most one per decode engine, kept open, and
reconfigured for a new frame size rather than recreated.

Opening an NVDEC session costs milliseconds and its memory, while reconfiguring one for another
size within the maximum it was opened for costs little; sessions beyond the number of engines only
queue for them. So threads borrow sessions: one of the same codec and size if idle, else one of the
same codec that can take the size, else a new one while under `capacity`, else an idle one of
another codec closed to make room, else they wait. A session that failed is closed, not returned:
its decoder may hold half a stream.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

Size = tuple[int, int]  # (width, height)


class DecoderSession(Protocol):
    """One open hardware decoder: a codec, the largest frame it was opened for, the size it decodes now."""

    codec: str
    max_size: Size
    size: Size

    def reconfigure(self, size: Size) -> None: ...

    def decode(self, packets: Sequence[tuple[bytes, int]]) -> list[tuple[int, Any]]:
        """(frame shown, decoded frame) of every frame the (bytes, frame shown) packets decode to, flushed after."""
        ...

    def close(self) -> None: ...


@dataclass
class PoolCounts:
    """What the pool did: sessions opened, lent as they were, reconfigured, and closed."""

    opened: int = 0
    reused: int = 0
    reconfigured: int = 0
    closed: int = 0


class SessionPool:
    """Sessions made by `open_session(codec, size)`, at most `capacity` open at once (see the module)."""

    def __init__(self, open_session: Callable[[str, Size], DecoderSession], capacity: int):
        if capacity < 1:
            raise ValueError(f"a session pool holds at least one session, not {capacity}")
        self.capacity = capacity
        self.counts = PoolCounts()
        self._open_session = open_session
        self._idle: list[DecoderSession] = []
        self._open = 0
        self._changed = threading.Condition()

    @contextmanager
    def session(self, codec: str, size: Size) -> Iterator[DecoderSession]:
        """Borrow a session decoding `codec` at `size` for the duration of the block."""
        lent = self._borrow(codec, size)
        try:
            yield lent
        except BaseException:
            self._close(lent)
            raise
        with self._changed:
            self._idle.append(lent)
            self._changed.notify()

    def close(self) -> None:
        """Close the idle sessions (those lent out are closed by whoever holds them)."""
        with self._changed:
            idle, self._idle = self._idle, []
        for session in idle:
            self._close(session)

    def _borrow(self, codec: str, size: Size) -> DecoderSession:
        with self._changed:
            while True:
                found = self._take(lambda s: s.codec == codec and s.size == size)
                if found is not None:
                    self.counts.reused += 1
                    return found
                found = self._take(lambda s: s.codec == codec and fits(size, s.max_size))
                if found is not None:
                    break
                if self._open < self.capacity:
                    self._open += 1
                    self.counts.opened += 1
                    return self._opened(codec, size)
                if self._idle:
                    evicted = self._idle.pop(0)
                    self._changed.release()
                    try:
                        self._close(evicted)
                    finally:
                        self._changed.acquire()
                    continue
                self._changed.wait()
        try:
            found.reconfigure(size)
        except BaseException:
            self._close(found)
            raise
        with self._changed:
            self.counts.reconfigured += 1
        return found

    def _take(self, wanted: Callable[[DecoderSession], bool]) -> DecoderSession | None:
        for position, session in enumerate(self._idle):
            if wanted(session):
                return self._idle.pop(position)
        return None

    def _opened(self, codec: str, size: Size) -> DecoderSession:
        """A new session, its place given back when opening fails (called holding the lock, released here)."""
        self._changed.release()
        try:
            return self._open_session(codec, size)
        except BaseException:
            with self._changed:
                self._open -= 1
                self._changed.notify()
            raise
        finally:
            self._changed.acquire()

    def _close(self, session: DecoderSession) -> None:
        try:
            session.close()
        finally:
            with self._changed:
                self._open -= 1
                self.counts.closed += 1
                self._changed.notify()


def fits(size: Size, max_size: Size) -> bool:
    return size[0] <= max_size[0] and size[1] <= max_size[1]
