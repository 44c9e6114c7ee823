"""Paths and URLs through fsspec, and the one read path every store read takes.

Every read has a deadline and retries only transient errors (timeouts, dropped connections,
throttling and server errors) with exponential backoff and jitter; a permanent error (a missing
object, no permission, an object shorter than the manifest says) fails at once, naming the object.
Local files are read with `pread` after checking that they are regular files, so a FIFO or a
device inside a store fails at once instead of blocking forever; other filesystems are read on a
daemon thread that the caller stops waiting for when the deadline passes. Small files mmdata
writes (metadata beside a store) are replaced atomically with `write_text_atomically`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import random
import re
import stat
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO, TypeVar

import fsspec
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from mmdata.checks import option_bool, option_int, option_number
from mmdata.errors import IntegrityError, OptionError, ReadError, ReadTimeoutError, StorageBusyError
from mmdata.store.s3_plain import PlainS3Reader, plain_reader_for

T = TypeVar("T")

TRANSIENT_ERRNOS = frozenset(
    {
        errno.EAGAIN,
        errno.EINTR,
        errno.EIO,
        errno.EBUSY,
        errno.ETIMEDOUT,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.ECONNREFUSED,
        errno.EPIPE,
        errno.ENETDOWN,
        errno.ENETUNREACH,
        errno.EHOSTUNREACH,
    }
)
PERMANENT_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


@dataclass(frozen=True)
class ReadPolicy:
    """How every read of a store behaves.

    `timeout_s` bounds one request; a transient failure (timeout, reset connection, throttling,
    server error) is tried again up to `attempts` times in all, waiting `backoff_s`, doubled each
    time up to `max_backoff_s`, with jitter; permanent failures are not retried. Local files are
    read directly (fast); set `guard_local_reads` for stores on network or FUSE mounts that can
    stall, so their reads get the deadline too. `concurrency` bounds the requests one process has
    in flight when it fetches a micro-batch's pieces ahead from object storage, and pieces of one
    file at most `coalesce_gap` bytes apart are fetched in one request: a larger gap makes fewer
    requests (each costs the reader a few ms of CPU and a round trip; at 20 ms and 100+ MB/s, 1 MiB
    read and dropped costs less than a request) and reads bytes nobody asked for (policy windows of
    one camera: 1 MiB reads about 11x the bytes needed in a tenth of the requests of 0; 4 MiB about
    14x in a fourteenth, `benchmarks/results/s3_request_cost_cpu.json`).

    `cache_dir` keeps what is fetched from object storage on local disk, in its sub-folder
    `mmdata-piece-cache` (nothing else there is touched), up to about `cache_max_bytes` (least
    recently used removed first), shared by every process and loader on the host, so a second epoch
    does not download again (see `mmdata.store.piece_cache`).

    `plain_s3_gets` reads byte ranges of S3 objects by plain signed GETs (a third of s3fs's CPU per
    request) where the filesystem's options allow (`mmdata.store.s3_plain`); False leaves every read to s3fs.
    """

    timeout_s: float = 60.0
    attempts: int = 4
    backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    guard_local_reads: bool = False
    concurrency: int = 8
    coalesce_gap: int = 1 << 20
    cache_dir: str | None = None
    cache_max_bytes: int = 100 << 30
    plain_s3_gets: bool = True

    def __post_init__(self):
        option_number(self.timeout_s, "ReadPolicy timeout_s", 1e-3, 86400.0)
        option_int(self.attempts, "ReadPolicy attempts", 1, 100)
        option_number(self.backoff_s, "ReadPolicy backoff_s", 0.0, 3600.0)
        option_number(self.max_backoff_s, "ReadPolicy max_backoff_s", 0.0, 3600.0)
        option_int(self.concurrency, "ReadPolicy concurrency", 1, 1024)
        option_int(self.coalesce_gap, "ReadPolicy coalesce_gap", 0, 1 << 30)
        option_int(self.cache_max_bytes, "ReadPolicy cache_max_bytes", 1, 1 << 60)
        option_bool(self.guard_local_reads, "ReadPolicy guard_local_reads")
        option_bool(self.plain_s3_gets, "ReadPolicy plain_s3_gets")
        if self.cache_dir is not None and not isinstance(self.cache_dir, (str, os.PathLike)):
            raise OptionError(f"ReadPolicy cache_dir is a folder path, not {self.cache_dir!r:.60}")

    def delay(self, attempt: int) -> float:
        """Seconds to wait before try `attempt + 1`: exponential, with full jitter in its upper half."""
        ceiling = min(self.max_backoff_s, self.backoff_s * 2**attempt)
        return ceiling * (0.5 + 0.5 * random.random())


DEFAULT_READ_POLICY = ReadPolicy()


def resolve(path_or_url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and the root path inside it for a local path or an fsspec URL. An object-store URL with a `.`
    or `..` segment is refused before any request: object stores take keys literally, and an HTTP client that
    resolves the segments would ask for another prefix's or another bucket's objects."""
    fs, root = url_to_fs(str(path_or_url))
    if not isinstance(fs, LocalFileSystem) and any(part in (".", "..") for part in root.split("/")):
        raise OptionError(
            f"'{path_or_url}' has a '.' or '..' segment; object storage takes keys as they are written (no folder"
            " climbs out of another): write the key without them"
        )
    return fs, root.rstrip("/") or "/"


def join(root: str, relative: str) -> str:
    """`relative` under `root`; a path that climbs out first (`../other/x`, a split or merged store's origins) is
    resolved here, since object stores take keys literally; one that would climb above the filesystem's root (or
    out of the bucket) is refused (ValueError)."""
    if relative.startswith("../"):
        return _climbed(root, relative)
    return f"{root.rstrip('/')}/{relative}" if relative else root


def _climbed(root: str, relative: str) -> str:
    """`root` joined with `relative`, which starts with `../`: resolved, and refused if it leaves `root`'s
    filesystem root or bucket (the first component of an object store's path)."""
    parts = relative.split("/")
    ups = 0
    while ups < len(parts) and parts[ups] == "..":
        ups += 1
    above = [part for part in root.strip("/").split("/") if part]
    floor = 0 if root.startswith("/") else 1  # (an object store's bucket is never climbed out of)
    if ups > len(above) - floor:
        raise ValueError(f"'{relative}' climbs {ups} folders above '{root}', out of its filesystem or bucket")
    return posixpath.normpath(f"{root.rstrip('/')}/{relative}")


def relative_path(target: str, start: str) -> str:
    """`target` relative to `start`, both paths on one filesystem (what `join(start, ...)` takes back)."""
    return posixpath.relpath(posixpath.join("/", target), posixpath.join("/", start))


def write_text_atomically(path: str, text: str, fs: fsspec.AbstractFileSystem | None = None) -> None:
    """Write `text` to `path` (local, or on `fs`) as `write_bytes_atomically` does."""
    write_bytes_atomically(path, [text.encode("utf-8")], fs)


def write_bytes_atomically(path: str, chunks: Iterable[bytes], fs: fsspec.AbstractFileSystem | None = None) -> None:
    """Write `chunks` to `path` (local, or on `fs`) as `writing_atomically` does."""
    with writing_atomically(path, fs) as handle:
        for chunk in chunks:
            handle.write(chunk)


@contextlib.contextmanager
def writing_atomically(path: str, fs: fsspec.AbstractFileSystem | None = None) -> Iterator[BinaryIO]:
    """A binary file to write `path` through: locally a temporary file of this writer's own (`create_temporary`),
    synced and renamed over `path` when the block ends, so a reader sees the old file or the whole new one, and
    a link planted at `path` is replaced, never written through; elsewhere one upload (object stores replace
    whole objects, and an upload that fails is not completed). Nothing is left if the block fails."""
    with _writing(path, fs, replace=True) as handle:
        yield handle


@contextlib.contextmanager
def writing_new_file(path: str, fs: fsspec.AbstractFileSystem | None = None) -> Iterator[BinaryIO]:
    """`writing_atomically` for a file that must not exist yet: locally the temporary is linked to `path`, which
    fails if anything (a file, a link) is there; in object storage an upload that only creates (S3's
    `If-None-Match: *`). FileExistsError when `path` exists: a writer never replaces what it did not make."""
    with _writing(path, fs, replace=False) as handle:
        yield handle


@contextlib.contextmanager
def _writing(path: str, fs: fsspec.AbstractFileSystem | None, replace: bool) -> Iterator[BinaryIO]:
    if fs is not None and not isinstance(fs, LocalFileSystem):
        if not replace and not is_s3(fs) and fs.exists(path):
            raise FileExistsError(errno.EEXIST, "the object exists", path)
        remote = fs.open(path, "wb" if replace or not is_s3(fs) else "xb")
        try:
            yield remote
        except BaseException:
            with contextlib.suppress(Exception):
                remote.discard()
            raise
        remote.close()
        return
    temporary, handle = create_temporary(path)
    try:
        with handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        if replace:
            os.replace(temporary, path)
        else:
            os.link(temporary, path)
            os.unlink(temporary)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def is_s3(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether `fs` is S3's (s3fs), whose writes can be conditional."""
    protocol = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "s3" in protocol or "s3a" in protocol


_TEMPORARY = re.compile(r"\.(.+)\.[0-9a-f]{32}\.tmp")


def create_temporary(path: str | os.PathLike) -> tuple[str, BinaryIO]:
    """A new file beside `path`, named for it and for this writer alone (`.NAME.<random>.tmp`), created exclusively
    and without following a link (`O_CREAT | O_EXCL | O_NOFOLLOW`): a link or file planted at any name is never
    written through. Returns its path and the open file."""
    folder, name = os.path.split(os.fspath(path))
    temporary = os.path.join(folder, f".{name}.{uuid.uuid4().hex}.tmp")
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    return temporary, open(os.open(temporary, flags, 0o644), "w+b")  # noqa: SIM115 (a muxer may read back)


@contextlib.contextmanager
def replacing_by_name(path: str | os.PathLike) -> Iterator[str]:
    """The path of a new temporary file of this writer's own beside the local `path` (`create_temporary`), for a
    writer that must open it by name (FFmpeg's muxer reopens its output to move the index to the front), renamed
    over `path` when the block ends, removed if it fails."""
    temporary, handle = create_temporary(path)
    handle.close()
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def create_afresh(path: str | os.PathLike) -> BinaryIO:
    """A new, empty file at `path`, a name only this writer writes (a shard being written): whatever is there (the
    file an interrupted run left, or a link) is removed first, then the file is created exclusively without
    following a link, so nothing outside is ever written through it."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    return open(os.open(path, flags, 0o644), "wb")  # noqa: SIM115


def temporary_of(name: str) -> str | None:
    """The file name a temporary named `name` (`create_temporary`) was written for; None if it is no temporary."""
    match = _TEMPORARY.fullmatch(name)
    return match.group(1) if match else None


def read_range(
    fs: fsspec.AbstractFileSystem, path: str, offset: int, size: int, policy: ReadPolicy = DEFAULT_READ_POLICY
) -> bytes:
    """Exactly `size` bytes at `offset` of `path`; fewer bytes there is an IntegrityError (not retried)."""
    if offset < 0 or size < 0:
        raise IntegrityError(f"{path}: invalid byte range at {offset} of {size} bytes")
    if size == 0:
        return b""
    what = f"bytes {offset}..{offset + size}"
    data = _retried(fs, path, policy, what, lambda: _ranged(fs, path, offset, size, policy))
    if len(data) != size:
        raise IntegrityError(
            f"{path}: {len(data)} bytes at byte {offset} where {size} were expected; the file is truncated:"
            " restore it or convert again"
        )
    return data


def read_file(
    fs: fsspec.AbstractFileSystem, path: str, max_bytes: int, policy: ReadPolicy = DEFAULT_READ_POLICY
) -> bytes:
    """The whole of a small file; one that holds more than `max_bytes` is an IntegrityError."""
    data = _retried(fs, path, policy, "the file", lambda: _read(fs, path, 0, max_bytes + 1, policy))
    if len(data) > max_bytes:
        raise IntegrityError(f"{path} is larger than the {max_bytes} bytes such a file may hold")
    return data


def file_size(fs: fsspec.AbstractFileSystem, path: str, policy: ReadPolicy = DEFAULT_READ_POLICY) -> int:
    """The length of `path` in bytes (no byte of it read)."""
    return _retried(fs, path, policy, "its size", lambda: _size(fs, path))


def read_tail(
    fs: fsspec.AbstractFileSystem, path: str, size: int, policy: ReadPolicy = DEFAULT_READ_POLICY
) -> tuple[bytes, int]:
    """The last `size` bytes of `path` and the file's length."""

    def attempt() -> tuple[bytes, int]:
        length = _size(fs, path)
        if length < size:
            raise IntegrityError(f"{path} holds {length} bytes, fewer than the {size} of its index")
        return _read(fs, path, length - size, size, policy), length

    return _retried(fs, path, policy, f"its last {size} bytes", attempt)


def _ranged(fs: fsspec.AbstractFileSystem, path: str, offset: int, size: int, policy: ReadPolicy) -> bytes:
    """`_read`, with the answer of object storage checked against the range asked for: a server that ignored the
    range (the whole object back) is named once and its answer cut to the range; one that sent a longer body, or a
    shorter one than the object holds there, is a transient failure that names what it sent (tried again)."""
    data = _read(fs, path, offset, size, policy)
    if len(data) == size or isinstance(fs, LocalFileSystem):
        return data
    length = _size(fs, path)
    if len(data) < size and offset + size > length:
        return data  # (the object ends first: a truncated file, which the caller names)
    if len(data) == length and offset + size <= length:
        _warn_once(
            str(fs.protocol),
            f"{fs.protocol}: the server ignored a byte-range request (it answered with the whole {length}-byte object"
            f" {path}); every read downloads whole objects: use a server that serves ranges",
        )
        return data[offset : offset + size]
    raise StorageBusyError(
        f"{path}: the server answered {len(data)} bytes for the {size} bytes at {offset} of a {length}-byte object"
        " (a body of the wrong length)"
    )


_WARNED: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    """Warn of `message` once per process for `key` (a filesystem)."""
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _read(fs: fsspec.AbstractFileSystem, path: str, offset: int, size: int, policy: ReadPolicy) -> bytes:
    if isinstance(fs, LocalFileSystem):
        return _pread(path, offset, size)
    plain = _plain_reader(fs) if policy.plain_s3_gets else None
    if plain is not None:
        data = plain.read(path, offset, size)
        if data is not None:
            return data
        _PLAIN_READERS[id(fs)] = (weakref.ref(fs), None)  # an answer only s3fs handles: s3fs reads from now on
    return in_this_process(fs).cat_file(path, start=offset, end=offset + size)


_PLAIN_READERS: dict[int, tuple[weakref.ref, PlainS3Reader | None]] = {}


def _plain_reader(fs: fsspec.AbstractFileSystem) -> PlainS3Reader | None:
    """The plain GET reader of the filesystem `fs` (`store.s3_plain`), made once; None: s3fs reads."""
    known = _PLAIN_READERS.get(id(fs))
    if known is None or known[0]() is not fs:
        known = _PLAIN_READERS[id(fs)] = (weakref.ref(fs), plain_reader_for(fs))
    return known[1]


def _size(fs: fsspec.AbstractFileSystem, path: str) -> int:
    if isinstance(fs, LocalFileSystem):
        descriptor, length = _open_regular(path)
        os.close(descriptor)
        return length
    return int(in_this_process(fs).size(path))


_FORKED_COPIES: dict[tuple[int, int], fsspec.AbstractFileSystem] = {}


def in_this_process(fs: fsspec.AbstractFileSystem) -> fsspec.AbstractFileSystem:
    """`fs`, or in a process forked after it was made (DataLoader workers) a fresh instance with the
    same options: fsspec's asynchronous filesystems (s3, gcs, http) hold an event loop and
    connections that a forked child cannot use ("This class is not fork-safe")."""
    made_in = getattr(fs, "_pid", None)
    if made_in is None or made_in == os.getpid():
        return fs
    key = (os.getpid(), id(fs))
    copy = _FORKED_COPIES.get(key)
    if copy is None:
        from fsspec.asyn import reset_lock

        reset_lock()
        copy = _FORKED_COPIES[key] = type(fs)(**fs.storage_options, skip_instance_cache=True)
    return copy


def _open_regular(path: str) -> tuple[int, int]:
    """A read-only descriptor of `path` and its length; `path` must be a regular file (opened with
    O_NONBLOCK, so a FIFO does not block)."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    status = os.fstat(descriptor)
    if not stat.S_ISREG(status.st_mode):
        os.close(descriptor)
        raise IntegrityError(f"{path} is not a regular file (a FIFO, device or socket); a store holds only files")
    return descriptor, status.st_size


def _pread(path: str, offset: int, size: int) -> bytes:
    descriptor, length = _open_regular(path)
    try:
        size = max(0, min(size, length - offset))
        parts = []
        while size > 0:
            part = os.pread(descriptor, min(size, 1 << 30), offset)
            if not part:
                break
            parts.append(part)
            offset += len(part)
            size -= len(part)
        return b"".join(parts)
    finally:
        os.close(descriptor)


_RETRIES = [0]


def read_retries() -> int:
    """Reads this process has tried again after a transient error, so far (the loader reports them)."""
    return _RETRIES[0]


def _retried(fs, path: str, policy: ReadPolicy, what: str, attempt: Callable[[], T]) -> T:
    """`attempt()` under the policy's deadline, tried again on transient errors only."""
    guarded = policy.guard_local_reads or not isinstance(fs, LocalFileSystem)
    last: BaseException | None = None
    for number in range(policy.attempts):
        if number:
            _RETRIES[0] += 1
            time.sleep(policy.delay(number - 1))
        try:
            return _with_deadline(attempt, policy.timeout_s) if guarded else attempt()
        except (IntegrityError, ReadError) as exc:
            if not isinstance(exc, ReadTimeoutError):
                raise
            last = exc
        except PERMANENT_ERRORS as exc:
            raise ReadError(f"{path}: cannot read {what}: {exc.strerror or exc}; restore it or convert again") from exc
        except Exception as exc:
            if not is_transient(exc):
                raise ReadError(f"{path}: cannot read {what}: {type(exc).__name__}: {exc}") from exc
            last = exc
    if isinstance(last, ReadTimeoutError):
        raise ReadTimeoutError(
            f"{path}: reading {what} did not finish within {policy.timeout_s:g} s, {policy.attempts} time(s);"
            " the storage is stalled (raise ReadPolicy.timeout_s if it is only slow)"
        ) from last
    raise ReadError(
        f"{path}: reading {what} failed {policy.attempts} time(s) with transient errors, the last:"
        f" {type(last).__name__}: {last}"
    ) from last


def is_transient(error: BaseException) -> bool:
    """Whether trying again may succeed: timeouts, connection errors, throttling and 5xx responses."""
    if isinstance(error, (TimeoutError, ConnectionError)):
        return True
    if isinstance(error, PERMANENT_ERRORS):
        return False
    if isinstance(error, OSError):
        return error.errno in TRANSIENT_ERRNOS or error.errno is None
    status = getattr(error, "status", None) or getattr(error, "status_code", None)
    if isinstance(status, int):
        return status == 429 or status >= 500
    text = str(error)
    return any(marker in text for marker in ("SlowDown", "Throttl", "503", "500 ", "502", "504"))


def _with_deadline(call: Callable[[], T], timeout_s: float) -> T:
    """`call()` on a daemon thread; the caller stops waiting after `timeout_s` and the thread is
    abandoned (a daemon, so a read stalled for good never holds the interpreter at exit)."""
    outcome: dict[str, object] = {}
    done = threading.Event()

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the waiting caller
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="mmdata-read", daemon=True).start()
    if not done.wait(timeout_s):
        raise ReadTimeoutError(f"no answer within {timeout_s:g} s")
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]
