"""A store's next version, written and published the one way every writer writes one (a conversion, an append, each
edit, a split, merge or compaction), with a concurrent writer detected rather than lost: the room both conversion and
editing publish through (`complete_version`), neither importing the other.

1. The writer holds the store (`store.hold`) and notes the version it starts from: locally `dataset.json`'s bytes,
   in object storage its ETag, or that there is none (a new store).
2. It writes the files the new version names under names of its own (`NextVersion.file_names`: the version's
   number and the writer's tag), so two writers of one version never write the same file.
3. `publish` swaps `dataset.json` for the new version's only if it is still the one noted (compare and swap):
   locally a check and a rename while the writer holds the folder's lock, or a link that fails if a store
   appeared; in S3 a conditional write (`If-Match` the ETag noted, or `If-None-Match: *`). A writer whose store
   changed meanwhile removes its files and raises ConcurrentWriteError, naming the version published since:
   nothing of it is visible, and running it again applies it to that version.
4. Then the files of versions no reader can still be reading are removed: every version file older than the
   version before the new one, and those a writer that lost or died left; the version before is kept for the
   readers that opened it.

`complete_version` keeps the order of the new version's files: the manifest, then the statistics (read through the
new version before it is published), then `dataset.json`, then the store's partial folder removed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import xxhash

from mmdata.errors import ConcurrentWriteError, MmdataError, StoreError
from mmdata.schema import DatasetSchema, version_file_name, version_of_file
from mmdata.store.dataset import Dataset
from mmdata.store.filesystem import is_s3, join, temporary_of, writing_atomically, writing_new_file
from mmdata.store.handle import MAX_SCHEMA_BYTES, Store
from mmdata.store.hold import StoreHold
from mmdata.store.layout import DATASET_FILE, PARTIAL_DIR
from mmdata.store.statistics import write_stats

_CONFLICT_CODES = ("PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "404")


@dataclass(frozen=True)
class _Noted:
    """What a writer noted of `dataset.json` when it began: its bytes (locally, and on filesystems without
    conditional writes) or its ETag (S3); both None when there was none."""

    content: bytes | None
    etag: str | None

    @property
    def exists(self) -> bool:
        return self.content is not None or self.etag is not None


class NextVersion:
    """The next version of the store `hold` holds, from the version there when it was made (see the module).

    Used as a context manager around the writing: if the block fails, the files written under this writer's
    names are removed, and if the store changed meanwhile the failure is reported as the ConcurrentWriteError it
    is (a loser whose files a winner removed fails on them)."""

    def __init__(self, hold: StoreHold):
        self.hold = hold
        self.tag = secrets.token_hex(4)
        self._noted = _note(hold)
        self._own: list[str] = []
        self.published = False

    def tag_by(self, what: str) -> None:
        """Name this writer's files by `what` it writes (its options and inputs) rather than at random: for a writer
        that holds the store alone (an append: `store.hold`) and must write the same bytes when run again (resumed),
        as a run that was not interrupted writes."""
        self.tag = xxhash.xxh64_hexdigest(what.encode())[:8]

    def file_names(self, version: int) -> tuple[str, str]:
        """The manifest and statistics file names of store version `version`, this writer's own (version 0, a
        conversion's or a compaction's, keeps the plain names: its destination is held by one writer)."""
        tag = self.tag if version else ""
        names = version_file_name("episodes", version, tag), version_file_name("stats", version, tag)
        self._own.extend(names)
        return names

    def publish(self, schema: DatasetSchema, previous: DatasetSchema | None = None) -> None:
        """Make `schema` the store's version: `dataset.json` swapped if it is still the one noted (else
        ConcurrentWriteError, this writer's files removed), then the files of superseded versions removed.
        `previous`: the version this one follows, whose files are kept for its readers."""
        path = join(self.hold.root, DATASET_FILE)
        document = schema.to_json().encode("utf-8")
        fs = self.hold.fs
        try:
            if self.hold.local or not is_s3(fs):
                if self.changed():
                    raise FileExistsError(path)
                writing = writing_atomically if self._noted.exists else writing_new_file
                with writing(path, fs) as handle:
                    handle.write(document)
            elif self._noted.exists:
                fs.pipe_file(path, document, IfMatch=self._noted.etag)
            else:
                fs.pipe_file(path, document, mode="create")
        except FileExistsError:
            raise self._conflict() from None
        except OSError as exc:
            if _is_conflict(exc):
                raise self._conflict() from None
            raise
        finally:
            if not self.hold.local:
                fs.invalidate_cache(path)
        self.published = True
        keep = {schema.manifest_file, schema.stats_file}
        if previous is not None:
            keep |= {previous.manifest_file, previous.stats_file}
        self._remove_superseded(schema.version, keep)

    def changed(self) -> bool:
        """Whether `dataset.json` is no longer what this writer noted when it began."""
        return _note(self.hold) != self._noted

    def discard(self) -> None:
        """Remove the files written under this writer's names (nothing a reader reads: they are no version's yet)."""
        for name in self._own:
            with contextlib.suppress(OSError):
                self.hold.fs.rm(join(self.hold.root, name))

    def __enter__(self) -> NextVersion:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if error is None or self.published or isinstance(error, ConcurrentWriteError):
            return
        self.discard()
        changed = False
        if isinstance(error, Exception):
            with contextlib.suppress(Exception):  # (the failure reported stays the writer's own then)
                changed = self.changed()
        if changed:
            raise self._conflict() from error

    def _conflict(self) -> ConcurrentWriteError:
        """The error of a writer whose store changed since it began, its files removed."""
        self.discard()
        hold = self.hold
        now = _described_version(hold)
        return ConcurrentWriteError(
            f"'{hold.url}' changed while '{hold.writer}' was being written: another writer published {now} first;"
            f" nothing of '{hold.writer}' was published (its files were removed): run it again to apply it to"
            " the store as it is now"
        )

    def _remove_superseded(self, version: int, keep: set[str]) -> None:
        """Remove the manifests and statistics of versions up to `version` that are not in `keep` (versions before
        the one before, and those writers that lost or died left), and, locally, temporaries a killed writer left
        (the folder is held: no other writer is writing one now). Versions after `version` are a writer's that
        began from this one, and are kept."""
        fs, root = self.hold.fs, self.hold.root
        try:
            names = [entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(root, detail=False, refresh=True)]
        except OSError:
            return
        for name in names:
            number = version_of_file(name)
            stale = number is not None and number <= version and name not in keep
            if stale or (self.hold.local and temporary_of(name) is not None):
                with contextlib.suppress(OSError):
                    fs.rm(join(root, name))


def _note(hold: StoreHold) -> _Noted:
    """What `dataset.json` is now (see `_Noted`)."""
    path = join(hold.root, DATASET_FILE)
    fs = hold.fs
    if not hold.local and is_s3(fs):
        fs.invalidate_cache(path)
        try:
            etag = fs.info(path).get("ETag")
        except FileNotFoundError:
            return _Noted(None, None)
        return _Noted(None, str(etag or ""))
    try:
        with fs.open(path, "rb") as handle:
            return _Noted(handle.read(MAX_SCHEMA_BYTES + 1), None)
    except FileNotFoundError:
        return _Noted(None, None)


def _described_version(hold: StoreHold) -> str:
    """The store version there now, in words ("version 3 (delete 2 episodes (...))")."""
    try:
        with hold.fs.open(join(hold.root, DATASET_FILE), "rb") as handle:
            schema = DatasetSchema.from_json(handle.read(MAX_SCHEMA_BYTES + 1))
    except (OSError, StoreError, ValueError):
        return "a version of it"
    if not schema.history:
        return "version 0"
    latest = schema.history[-1]
    what = latest.get("source") if latest.get("edit") else f"an append of {latest.get('episodes')} episode(s)"
    return f"version {schema.version} ({str(what)[:200]})"


def _is_conflict(error: BaseException) -> bool:
    """Whether an object store refused a conditional write because the object changed (or went away)."""
    seen: BaseException | None = error
    while seen is not None:
        response = getattr(seen, "response", None)  # (botocore's ClientError, under s3fs's OSError)
        code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
        if code in _CONFLICT_CODES or any(marker in str(seen) for marker in ("PreconditionFailed", "pre-conditions")):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


Statistics = dict[str, Any] | Callable[[Dataset], dict[str, Any]]
"""A new version's statistics: given, or computed from the version (read through a reader of it)."""


def complete_version(
    version: NextVersion,
    schema: DatasetSchema,
    write_manifest: Callable[[str], None],
    statistics: Statistics,
    previous: DatasetSchema | None = None,
    statistics_optional: bool = False,
) -> str | None:
    """Write the files `schema` names (`version`'s own) into the store `version` is the next version of and publish
    it: the manifest (`write_manifest(path)`), then the statistics, then `dataset.json` swapped if no other writer
    published one since (`previous`: the version it follows), then the store's partial folder removed. Until the
    swap a reader sees the version before, whole. With `statistics_optional` (a conversion, whose store is worth
    having without them) statistics that cannot be computed are left out and why is returned; else it raises."""
    fs, root, url = version.hold.fs, version.hold.root, version.hold.url
    write_manifest(join(root, schema.manifest_file))
    problem = None
    try:
        dataset = Dataset(Store(url, schema=schema))
        write_stats(dataset, statistics(dataset) if callable(statistics) else statistics)
    except (MmdataError, OSError, ValueError, MemoryError) as exc:
        if not statistics_optional:
            raise
        why = str(exc) or type(exc).__name__
        problem = f"normalization statistics were not written ({why}); run `mmdata stats {url}` to compute them"
    version.publish(schema, previous)
    if fs.exists(join(root, PARTIAL_DIR)):  # (an append into object storage keeps its state in its staging)
        fs.rm(join(root, PARTIAL_DIR), recursive=True)
    return problem


def utc_now() -> str:
    """Now, as ISO 8601 UTC (what a store's history records of each version); `SOURCE_DATE_EPOCH` (the
    reproducible-builds convention) sets it."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    seconds = int(epoch) if epoch and epoch.isdigit() else time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
