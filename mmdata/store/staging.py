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

from mmdata.errors import ConcurrentWriteError, DestinationError
from mmdata.schema import DatasetSchema
from mmdata.store.filesystem import join, resolve, writing_new_file
from mmdata.store.hold import hold_store
from mmdata.store.layout import DATASET_FILE
from mmdata.store.versions import NextVersion


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

    With `overwrite` the objects under `url` are removed first; otherwise an object already there with the same
    size is kept (an upload interrupted before is completed, not repeated), an object of another size is another
    writer's and refused, and every object is created only where none is (S3's conditional write), `dataset.json`
    last (`store.versions`): of two uploads into one place, one publishes and the other is told.
    """
    fs, root = resolve(url)
    if overwrite and fs.exists(root):
        fs.rm(root, recursive=True)
    files = sorted(p for p in local.rglob("*") if p.is_file() and p.name != DATASET_FILE)
    staged = DatasetSchema.from_json((local / DATASET_FILE).read_bytes(), str(local / DATASET_FILE))
    sent = 0
    put = upload or _put
    with (
        hold_store(url, f"the upload of {local} to {url}") as hold,
        NextVersion(hold) as version,
        tqdm(total=len(files) + 1, unit="file", desc=f"upload -> {url}", disable=not progress) as bar,
    ):
        for path in files:
            target = join(root, path.relative_to(local).as_posix())
            there = _size_there(fs, target)
            if there is not None and there != path.stat().st_size:
                raise DestinationError(
                    f"'{path.relative_to(local)}' already exists in '{url}' ({there} bytes) and is not this"
                    " upload's: another writer is writing there; nothing of it was written over"
                )
            if there is None:
                try:
                    put(fs, path, target)
                except FileExistsError:
                    raise ConcurrentWriteError(
                        f"'{path.relative_to(local)}' appeared in '{url}' while this upload was writing it: another"
                        " writer is writing there; nothing of it was written over"
                    ) from None
                except OSError as exc:
                    raise DestinationError(
                        f"uploading '{path.relative_to(local)}' to '{url}' failed ({exc}); run the same command"
                        " with --resume to finish the upload"
                    ) from exc
                sent += path.stat().st_size
            bar.update(1)
        try:
            version.publish(staged)
        except OSError as exc:
            raise DestinationError(
                f"uploading '{DATASET_FILE}' to '{url}' failed ({exc}); run the same command with --resume to finish"
                " the upload"
            ) from exc
        sent += (local / DATASET_FILE).stat().st_size
        bar.update(1)
    return sent


def upload_new_files(local: Path, url: str, names: set[str], progress: bool = True) -> int:
    """Upload the files `names` (relative to `local`) into the store at `url`; the bytes sent. An append's new
    shards, before the version naming them is published: each is created only where no object is (S3's
    conditional write). One found there with this append's bytes was uploaded by this append before it was
    interrupted and is kept; any other is another writer's and never written over (ConcurrentWriteError)."""
    fs, root = resolve(url)
    sent = 0
    with tqdm(total=len(names), unit="file", desc=f"upload -> {url}", disable=not progress) as bar:
        for name in sorted(names):
            path, target = local / name, join(root, name)
            if _size_there(fs, target) is None:
                try:
                    _put(fs, path, target)
                    sent += path.stat().st_size
                except FileExistsError:
                    pass  # (created meanwhile: compared below)
                except OSError as exc:
                    raise DestinationError(
                        f"uploading '{name}' to '{url}' failed ({exc}); run the same command with --resume to finish"
                    ) from exc
                else:
                    bar.update(1)
                    continue
            if not _same_bytes(fs, target, path):
                raise ConcurrentWriteError(
                    f"'{name}' already exists in '{url}' and is not this append's: another writer appended to the"
                    " store; a store's files are never written over, and nothing of this append was published: run"
                    " it again to append to the store as it is now"
                )
            bar.update(1)
    return sent


def _put(fs: fsspec.AbstractFileSystem, path: Path, target: str) -> None:
    """Upload `path` as `target`, only if no object is there (FileExistsError otherwise)."""
    with path.open("rb") as source, writing_new_file(target, fs) as handle:
        shutil.copyfileobj(source, handle, 8 << 20)


def _same_bytes(fs: fsspec.AbstractFileSystem, target: str, path: Path) -> bool:
    """Whether the object `target` holds exactly the bytes of the local file `path` (read a block at a time)."""
    if _size_there(fs, target) != path.stat().st_size:
        return False
    with fs.open(target, "rb") as remote, path.open("rb") as mine:
        while block := mine.read(8 << 20):
            if remote.read(len(block)) != block:
                return False
    return True


def _size_there(fs: fsspec.AbstractFileSystem, target: str) -> int | None:
    """The size of `target` in the store, or None when there is no such file."""
    try:
        return int(fs.size(target))
    except (FileNotFoundError, OSError):
        return None


def remove_staging(local: Path) -> None:
    shutil.rmtree(local, ignore_errors=True)
