"""A writer's hold on a store: one writer at a time, and the one refused is told who holds it.

A local store's folder is locked (`flock`) for the writer's whole run, whatever it writes (a conversion, an append,
an edit, a split, merge or compaction destination), and the kernel lets go when the writer ends, however it ends: a
killed writer never leaves a lock behind. Beside the lock the writer records who it is (`WRITER_FILE`: process,
host, command, start), which the refused writer names. In object storage, which has no locks, an append (the one
writer that writes media other writers would write again: the next shards, a Zarr array's last chunk) records
itself by creating that file only if it is absent (a conditional write), and removes it when it ends; the other
writers are refused while it is there, and publish their version by a compare-and-swap (`store.versions`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import fsspec
from fsspec.implementations.local import LocalFileSystem

from mmdata.checks import parse_json
from mmdata.errors import ConcurrentWriteError, DestinationError
from mmdata.store.filesystem import join, read_file, resolve, writing_atomically, writing_new_file
from mmdata.store.layout import WRITER_FILE

MAX_WRITER_BYTES = 4096


@dataclass(frozen=True)
class StoreHold:
    """A store (or a destination) this writer holds: where it is, and what the writer is (for the messages)."""

    fs: fsspec.AbstractFileSystem
    root: str
    url: str
    writer: str

    @property
    def local(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)


@contextlib.contextmanager
def hold_store(url: str | os.PathLike, writer: str, lease: bool = False) -> Iterator[StoreHold]:
    """Hold the store or destination at `url` for the writer described by `writer` ("mmdata edit ... delete"): a
    local folder (made if need be) is locked until the block ends; in object storage, `lease` (an append) records
    the writer by a conditional create, and without it the store is only checked to be held by no append.
    ConcurrentWriteError names the writer holding it."""
    fs, root = resolve(str(url))
    hold = StoreHold(fs, root, str(url), writer)
    if hold.local:
        with _locked_folder(hold):
            yield hold
        return
    record = join(root, WRITER_FILE)
    if not lease:
        if fs.exists(record):
            raise _held(hold, _holder(fs, record), stale_hint=True)
        yield hold
        return
    try:
        with writing_new_file(record, fs) as handle:
            handle.write(_record(writer))
    except FileExistsError:
        raise _held(hold, _holder(fs, record), stale_hint=True) from None
    try:
        yield hold
    finally:
        with contextlib.suppress(OSError):
            fs.rm(record)


@contextlib.contextmanager
def locked_folder(path: str | os.PathLike) -> Iterator[None]:
    """The local folder `path` (which must exist) locked by this process until the block ends (`flock`: released
    by the kernel however the process ends); BlockingIOError when another holds it."""
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def _locked_folder(hold: StoreHold) -> Iterator[None]:
    if os.path.lexists(hold.root) and not os.path.isdir(hold.root):
        raise DestinationError(f"'{hold.url}' is not a folder; a store is written into a folder")
    os.makedirs(hold.root, exist_ok=True)
    record = join(hold.root, WRITER_FILE)
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(locked_folder(hold.root))
        except BlockingIOError:
            raise _held(hold, _holder(hold.fs, record), stale_hint=False) from None
        with contextlib.suppress(OSError), writing_atomically(record) as handle:  # (only informs a writer refused)
            handle.write(_record(hold.writer))
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.unlink(record)


def _record(writer: str) -> bytes:
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return json.dumps({"writer": writer, "pid": os.getpid(), "host": socket.gethostname(), "since": since}).encode()


def _holder(fs: fsspec.AbstractFileSystem, record: str) -> str:
    """Who the record at `record` says holds the store, in words ("" when it cannot be read)."""
    try:
        found = parse_json(read_file(fs, record, MAX_WRITER_BYTES))
    except Exception:  # (a record is only a hint: one that cannot be read is left out of the message)
        return ""
    if not isinstance(found, dict):
        return ""
    parts = [f"'{str(found.get('writer', '?'))[:200]}'"]
    if isinstance(found.get("pid"), int):
        parts.append(f"process {found['pid']} on {str(found.get('host', '?'))[:100]}")
    if isinstance(found.get("since"), str):
        parts.append(f"since {found['since'][:40]}")
    return ", ".join(parts)


def _held(hold: StoreHold, holder: str, stale_hint: bool) -> ConcurrentWriteError:
    who = f" ({holder})" if holder else ""
    message = (
        f"'{hold.url}' is being written by another mmdata writer now{who}; nothing of '{hold.writer}' was written:"
        " run it again when that one has ended, and it applies to the version that one leaves"
    )
    if stale_hint:
        message += (
            f". If that writer is gone (killed), delete '{join(hold.root, WRITER_FILE)}', which only it removes,"
            " then run this again"
        )
    return ConcurrentWriteError(message)


def empty_folder(root: str | os.PathLike) -> None:
    """Remove what the local folder `root` holds, keeping the folder itself (and the lock held on it) and the record
    of the writer holding it: what `--overwrite` and a compaction starting again over a leftover do."""
    for child in Path(root).iterdir():
        if is_writer_record(child.name):
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def is_writer_record(name: str) -> bool:
    """Whether `name` (a file name in a store's folder) is a writer's record, which no emptiness check counts."""
    return name == WRITER_FILE
