"""A local disk cache of pieces fetched from object storage, so a second epoch does not download again.

Entries are content-addressed: the key hashes the store, the piece's address and its manifest checksum,
so a store rewritten at the same URL never gets another store's bytes (and every hit is checked like
a fetch, when the reader verifies). Files are written under a unique temporary name and renamed into
place, so any number of processes and loaders on one host can share a folder. A hit refreshes the
entry's modification time; when the folder grows past `max_bytes`, the least recently used entries
are removed (by one process at a time, under a lock file) down to 90% of it. Each process counts what
it adds and rescans the folder every 5% of `max_bytes`, so the folder may pass the limit by that much
per process before it is trimmed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from pathlib import Path

import xxhash

from mmdata.sharding.manifest import Piece

LOW_WATERMARK = 0.9
RESCAN_FRACTION = 0.05
LOCK_FILE = ".lock"


class PieceCache:
    """Pieces of the store `namespace` (its URL) kept in `folder`, at most about `max_bytes` in all."""

    def __init__(self, folder: str | os.PathLike, max_bytes: int, namespace: str):
        if max_bytes <= 0:
            raise ValueError(f"a piece cache needs max_bytes > 0, not {max_bytes}")
        self.folder = Path(folder)
        self.max_bytes = max_bytes
        self.namespace = namespace
        self.hits = 0
        self.misses = 0
        self._added_since_scan = 0
        self._known_bytes: int | None = None

    def get(self, piece: Piece) -> bytes | None:
        """The cached bytes of `piece`, or None (never cached, evicted, or unreadable)."""
        path = self._path(piece)
        try:
            data = path.read_bytes()
        except OSError:
            self.misses += 1
            return None
        with contextlib.suppress(OSError):
            os.utime(path)
        if len(data) != piece.size:
            self.discard(piece)
            self.misses += 1
            return None
        self.hits += 1
        return data

    def put(self, piece: Piece, data: bytes) -> None:
        """Keep `data` as `piece`'s bytes; a cache that cannot be written (disk full) is only a slower read."""
        path = self._path(piece)
        temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary.write_bytes(data)
            os.replace(temporary, path)
        except OSError:
            with contextlib.suppress(OSError):
                temporary.unlink()
            return
        self._added_since_scan += len(data)
        if self._due_for_scan():
            self._trim()

    def contains(self, piece: Piece) -> bool:
        """Whether `piece` is cached now (it may still be evicted before it is read)."""
        return self._path(piece).exists()

    def discard(self, piece: Piece) -> None:
        """Remove `piece`'s entry (one found damaged)."""
        with contextlib.suppress(OSError):
            self._path(piece).unlink()

    def size(self) -> int:
        """Bytes the cache folder holds now."""
        return sum(size for _, size, _ in self._entries())

    def _due_for_scan(self) -> bool:
        if self._known_bytes is None or self._added_since_scan > RESCAN_FRACTION * self.max_bytes:
            return True
        return self._known_bytes + self._added_since_scan > self.max_bytes

    def _path(self, piece: Piece) -> Path:
        address = f"{self.namespace}\0{piece.path}\0{piece.offset}\0{piece.size}\0{piece.checksum}"
        key = xxhash.xxh3_128_hexdigest(address.encode())
        return self.folder / key[:2] / key

    def _entries(self) -> list[tuple[float, int, Path]]:
        """(last use, bytes, path) of every entry; entries another process removes meanwhile are left out."""
        found = []
        for shard in self.folder.iterdir() if self.folder.exists() else []:
            if not shard.is_dir():
                continue
            for entry in os.scandir(shard):
                if entry.name.startswith("."):
                    continue
                with contextlib.suppress(OSError):
                    status = entry.stat()
                    found.append((status.st_mtime, status.st_size, Path(entry.path)))
        return found

    def _trim(self) -> None:
        """Rescan the folder; remove the least recently used entries if it holds more than `max_bytes`."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / LOCK_FILE, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                entries = self._entries()
                total = sum(size for _, size, _ in entries)
                if total > self.max_bytes:
                    for _, size, path in sorted(entries, key=lambda entry: entry[0]):
                        if total <= LOW_WATERMARK * self.max_bytes:
                            break
                        with contextlib.suppress(OSError):
                            path.unlink()
                            total -= size
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        self._known_bytes = total
        self._added_since_scan = 0
