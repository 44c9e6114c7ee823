"""Conversion into object storage: the store is made in a local staging folder, then uploaded with
`dataset.json` last, so a reader never sees a store that is not whole.

The staging folder (default: under `~/.cache/mmdata/staging/`, one per destination URL) holds the
conversion's resume state, so `--resume` continues an interrupted conversion or an interrupted
upload. Objects already uploaded with the right size are not sent again.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import fsspec
import xxhash
from fsspec.implementations.local import LocalFileSystem
from tqdm import tqdm

from mmdata.errors import DestinationError
from mmdata.store.filesystem import join, resolve
from mmdata.store.layout import DATASET_FILE


def is_remote(destination: str | os.PathLike) -> bool:
    """Whether `destination` is an fsspec URL of a filesystem other than the local one."""
    text = str(destination)
    if "://" not in text:
        return False
    fs, _ = resolve(text)
    return not isinstance(fs, LocalFileSystem)


def default_staging(url: str) -> Path:
    """The local folder a conversion into `url` is staged in, the same on every run (for --resume)."""
    base = Path(os.environ.get("MMDATA_STAGING", Path.home() / ".cache" / "mmdata" / "staging"))
    return base / xxhash.xxh64_hexdigest(url.rstrip("/").encode())


def publish(
    local: Path, url: str, overwrite: bool = False, progress: bool = True, upload: Callable | None = None
) -> int:
    """Upload the complete store at `local` to `url`, `dataset.json` last; returns the bytes sent.

    With `overwrite` the objects under `url` are removed first; otherwise an object already there
    with the same size is kept (an upload interrupted before is completed, not repeated).
    """
    fs, root = resolve(url)
    if overwrite and fs.exists(root):
        fs.rm(root, recursive=True)
    files = sorted(p for p in local.rglob("*") if p.is_file() and p.name != DATASET_FILE)
    sent = 0
    put = upload or _put
    with tqdm(total=len(files) + 1, unit="file", desc=f"upload -> {url}", disable=not progress) as bar:
        for path in [*files, local / DATASET_FILE]:
            target = join(root, path.relative_to(local).as_posix())
            if path.name != DATASET_FILE and _already_there(fs, target, path.stat().st_size):
                bar.update(1)
                continue
            try:
                put(fs, path, target)
            except OSError as exc:
                raise DestinationError(
                    f"uploading '{path.relative_to(local)}' to '{url}' failed ({exc}); run the same command"
                    " with --resume to finish the upload"
                ) from exc
            sent += path.stat().st_size
            bar.update(1)
    return sent


def upload_new_files(local: Path, url: str, names: set[str], progress: bool = True) -> int:
    """Upload the files `names` (relative to `local`) into the store at `url`; the bytes sent. An append's new
    shards, before the version naming them is published: their names come after every file the store held when
    the append began, so one found there with its size was uploaded by this append before it was interrupted,
    and one of another size is not this append's and is never written over (DestinationError)."""
    fs, root = resolve(url)
    sent = 0
    with tqdm(total=len(names), unit="file", desc=f"upload -> {url}", disable=not progress) as bar:
        for name in sorted(names):
            path, target = local / name, join(root, name)
            there = _size_there(fs, target)
            if there is not None and there != path.stat().st_size:
                raise DestinationError(
                    f"'{name}' already exists in '{url}' ({there} bytes) and is not this append's: a store's files"
                    " are never written over; nothing of the store was changed"
                )
            if there is None:
                try:
                    _put(fs, path, target)
                except OSError as exc:
                    raise DestinationError(
                        f"uploading '{name}' to '{url}' failed ({exc}); run the same command with --resume to finish"
                    ) from exc
                sent += path.stat().st_size
            bar.update(1)
    return sent


def _put(fs: fsspec.AbstractFileSystem, path: Path, target: str) -> None:
    fs.put_file(str(path), target)


def _size_there(fs: fsspec.AbstractFileSystem, target: str) -> int | None:
    """The size of `target` in the store, or None when there is no such file."""
    try:
        return int(fs.size(target))
    except (FileNotFoundError, OSError):
        return None


def _already_there(fs: fsspec.AbstractFileSystem, target: str, size: int) -> bool:
    return _size_there(fs, target) == size


def remove_staging(local: Path) -> None:
    shutil.rmtree(local, ignore_errors=True)
