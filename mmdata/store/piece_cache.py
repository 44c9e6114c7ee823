"""A local disk cache of pieces fetched from object storage, so a second epoch does not download again.

The cache lives in a sub-folder of its own, `<cache_dir>/mmdata-piece-cache`, and touches nothing else: it
reads, counts and removes only files named as its entries (32 hex digits, under 2-hex-digit folders), never
through a symbolic link, so a user's files beside it or a link planted in a shared folder are left alone.
Entries are content-addressed: the key hashes the store, the piece's address and its manifest checksum,
so a store rewritten at the same URL never gets another store's bytes (and every hit is checked like
a fetch, when the reader verifies). Files are written under a unique temporary name and renamed into
place, so any number of processes and loaders on one host can share a folder. A hit refreshes the
entry's modification time; when the folder grows past `max_bytes`, the least recently used entries
are removed (by one process at a time, under a lock file) down to 90% of it. Each process counts what
it adds and rescans the folder every 5% of `max_bytes`, so the folder may pass the limit by that much
per process before it is trimmed. A cache that cannot be written, locked or trimmed (a full disk, a lock
file another user owns) is only a slower read, never a failed one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
import time
import uuid
from pathlib import Path

import xxhash

from mmdata.store.manifest import Piece

LOW_WATERMARK = 0.9
RESCAN_FRACTION = 0.05
LOCK_FILE = ".lock"
SUBFOLDER = "mmdata-piece-cache"
_SHARD_NAME = re.compile(r"[0-9a-f]{2}\Z")
_ENTRY_NAME = re.compile(r"[0-9a-f]{32}\Z")
_TEMPORARY_NAME = re.compile(r"\.[0-9a-f]{32}\.[0-9a-f]{32}\.tmp\Z")
STALE_TEMPORARY_SECONDS = 3600.0  # a writer's temporary file older than this was left by a crash


class PieceCache:
    """Pieces of the store `namespace` (its URL) kept in `folder`, at most about `max_bytes` in all."""

    def __init__(self, folder: str | os.PathLike, max_bytes: int, namespace: str):
        if max_bytes <= 0:
            raise ValueError(f"a piece cache needs max_bytes > 0, not {max_bytes}")
        self.folder = Path(folder) / SUBFOLDER
        self.max_bytes = max_bytes
        self.namespace = namespace
        self.hits = 0
        self.misses = 0
        self._added_since_scan = 0
        self._known_bytes: int | None = None

    def get(self, piece: Piece) -> bytes | None:
        """The cached bytes of `piece`, or None (never cached, evicted, unreadable, or not the cache's own file)."""
        path = self._path(piece, create=False)
        data = _read_entry(path, piece.size) if path is not None else None
        if path is None or data is None:
            self.misses += 1
            return None
        with contextlib.suppress(OSError):
            os.utime(path, follow_symlinks=False)
        if len(data) != piece.size:
            self.discard(piece)
            self.misses += 1
            return None
        self.hits += 1
        return data

    def put(self, piece: Piece, data: bytes) -> None:
        """Keep `data` as `piece`'s bytes; a cache that cannot be written (disk full) is only a slower read."""
        try:
            path = self._path(piece, create=True)
        except OSError:
            return
        if path is None:
            return
        temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        try:
            with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "wb") as out:
                out.write(data)
            os.replace(temporary, path)
        except OSError:
            with contextlib.suppress(OSError):
                temporary.unlink()
            return
        self._added_since_scan += len(data)
        if self._due_for_scan():
            with contextlib.suppress(OSError):
                self._trim()

    def contains(self, piece: Piece) -> bool:
        """Whether `piece` is cached now (it may still be evicted before it is read)."""
        path = self._path(piece, create=False)
        return path is not None and _is_entry_file(path)

    def discard(self, piece: Piece) -> None:
        """Remove `piece`'s entry (one found damaged)."""
        path = self._path(piece, create=False)
        if path is not None and _is_entry_file(path):
            with contextlib.suppress(OSError):
                path.unlink()

    def size(self) -> int:
        """Bytes the cache folder holds now."""
        return sum(size for _, size, _ in self._entries())

    def _due_for_scan(self) -> bool:
        if self._known_bytes is None or self._added_since_scan > RESCAN_FRACTION * self.max_bytes:
            return True
        return self._known_bytes + self._added_since_scan > self.max_bytes

    def _path(self, piece: Piece, create: bool) -> Path | None:
        """Where `piece`'s entry lives; None where the cache's folders are not real folders (a link planted
        there is never followed). `create` makes the folders first."""
        address = f"{self.namespace}\0{piece.path}\0{piece.offset}\0{piece.size}\0{piece.checksum}"
        key = xxhash.xxh3_128_hexdigest(address.encode())
        shard = self.folder / key[:2]
        if create:
            self.folder.mkdir(parents=True, exist_ok=True)
            if _is_real_folder(self.folder):
                shard.mkdir(exist_ok=True)
        if not (_is_real_folder(self.folder) and _is_real_folder(shard)):
            return None
        return shard / key

    def _entries(self) -> list[tuple[float, int, Path]]:
        """(last use, bytes, path) of every entry the cache wrote; entries another process removes meanwhile,
        files of other names and links are left out. Temporary files a crashed writer left are removed."""
        found: list[tuple[float, int, Path]] = []
        if not _is_real_folder(self.folder):
            return found
        now = time.time()
        for shard in os.scandir(self.folder):
            if not (_SHARD_NAME.match(shard.name) and shard.is_dir(follow_symlinks=False)):
                continue
            for entry in os.scandir(shard.path):
                with contextlib.suppress(OSError):
                    status = entry.stat(follow_symlinks=False)
                    if not stat.S_ISREG(status.st_mode):
                        continue
                    if _ENTRY_NAME.match(entry.name):
                        found.append((status.st_mtime, status.st_size, Path(entry.path)))
                    elif _TEMPORARY_NAME.match(entry.name) and now - status.st_mtime > STALE_TEMPORARY_SECONDS:
                        os.unlink(entry.path)
        return found

    def _trim(self) -> None:
        """Rescan the folder; remove the least recently used entries if it holds more than `max_bytes`. Skipped
        (the cache only grows past its limit for a while) when the lock cannot be had."""
        if not _is_real_folder(self.folder):
            return
        with open(_lock_descriptor(self.folder / LOCK_FILE), "rb") as lock:
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


def _lock_descriptor(path: Path) -> int:
    """The cache's lock file, opened without following a link; read-only where another user owns it in a
    shared folder (a shared lock on a read-only descriptor is still a lock)."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except PermissionError:
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW)


def _is_real_folder(path: Path) -> bool:
    """A folder itself, not a link to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _is_entry_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _read_entry(path: Path, size: int) -> bytes | None:
    """The bytes of the entry file at `path` (not through a link), at most `size` + 1 of them."""
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as entry:
            return entry.read(size + 1)
    except OSError:
        return None
