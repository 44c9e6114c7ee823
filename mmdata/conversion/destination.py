"""Where a conversion writes: checks that it may, and the saved options a resumed run must match.

A local destination may not overlap the source; a non-empty one needs `--resume` (same source and
options as the interrupted run, recorded in `.mmdata-partial/options.json`) or `--overwrite`.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import fsspec

from mmdata.checks import parse_json
from mmdata.errors import DestinationError
from mmdata.importers.episode import EpisodeSource
from mmdata.store.filesystem import join, write_text_atomically
from mmdata.store.hold import empty_folder, is_writer_record
from mmdata.store.layout import CONVERT_AGAIN, DATASET_FILE, PARTIAL_DIR, start_again

OPTIONS_FILE = "options.json"
SOURCES_FILE = "sources.json"


def refuse_overlap(root: Path, sources: list[EpisodeSource], source_root: str | os.PathLike | None) -> None:
    """Refuse a destination that is, contains or lies inside the source: converting would delete
    (--overwrite), clean up (--resume) or write over the recordings."""
    target = Path(os.path.realpath(root))
    if source_root is not None:
        origin = Path(os.path.realpath(source_root))
        if target == origin or origin in target.parents or target in origin.parents:
            raise DestinationError(
                f"destination '{root}' overlaps the source '{source_root}'; write the store to a folder outside"
                " the source (nothing in the source is ever deleted or written)"
            )
    folders = {os.path.dirname(s.path) for e in sources for s in e.streams}
    for folder in sorted(folders):
        resolved = Path(os.path.realpath(folder))
        if resolved == target or target in resolved.parents:
            raise DestinationError(
                f"destination '{root}' holds source recordings ({folder}); write the store to a folder outside"
                " the source (nothing in the source is ever deleted or written)"
            )


def destination_failure(root: Path | str, error: OSError) -> DestinationError:
    """A DestinationError that says what failed to be written and what to do about it."""
    where = error.filename or root
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free space (or choose another disk) and run the same command with --resume"
        return DestinationError(f"the disk is full while writing '{where}'; {fix}; finished shards are kept")
    if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return DestinationError(f"cannot write '{where}': {error.strerror}; choose a writable destination")
    return DestinationError(f"writing '{where}' failed: {error.strerror or error}; fix it and run again with --resume")


def prepare_destination(root: Path, fingerprint: dict[str, Any], resume: bool, overwrite: bool) -> None:
    """Make a local destination ready: empty (created), replaced (`overwrite`), or an interrupted
    conversion with the same `fingerprint` (`resume`)."""
    options_path = root / PARTIAL_DIR / OPTIONS_FILE
    if root.is_symlink() and overwrite:
        raise DestinationError(
            f"destination '{root}' is a symbolic link (to '{os.path.realpath(root)}'); --overwrite replaces a folder,"
            " not a link's target: give the folder itself, or remove the link"
        )
    if root.exists() and not root.is_dir():
        raise DestinationError(f"destination '{root}' exists and is not a folder")
    if root.exists() and any(not is_writer_record(entry.name) for entry in root.iterdir()):
        if overwrite:
            empty_folder(root)
        elif resume:
            if (root / DATASET_FILE).exists():
                raise DestinationError(f"'{root}' is already a complete store; nothing to resume ({REPLACE_STORE})")
            if not options_path.exists():
                raise DestinationError(
                    f"'{root}' is not an interrupted mmdata conversion (no {PARTIAL_DIR}/{OPTIONS_FILE});"
                    " choose an empty destination, or pass --overwrite to delete everything in it and convert there"
                )
            _check_same_options(str(root), str(options_path), options_path.read_bytes(), fingerprint, CONVERT_AGAIN)
            return
        else:
            raise _not_empty(str(root))
    (root / PARTIAL_DIR).mkdir(parents=True, exist_ok=True)
    write_text_atomically(str(options_path), json.dumps(fingerprint, indent=1))


def prepare_append(root: Path, fingerprint: dict[str, Any], resume: bool) -> None:
    """Make a complete store ready for an append: a new one's partial folder, or with `resume` the
    interrupted one's, made with the same `fingerprint` (source, options and store version)."""
    options_path = root / PARTIAL_DIR / OPTIONS_FILE
    if options_path.exists():
        if not resume:
            raise DestinationError(
                f"an append into '{root}' was interrupted; pass --resume to finish it, or {start_again(root)}"
            )
        _check_same_options(str(root), str(options_path), options_path.read_bytes(), fingerprint, start_again(root))
        return
    (root / PARTIAL_DIR).mkdir(exist_ok=True)
    write_text_atomically(str(options_path), json.dumps(fingerprint, indent=1))


def prepare_remote_destination(
    fs: fsspec.AbstractFileSystem, root: str, url: str, fingerprint: dict[str, Any], resume: bool, overwrite: bool
) -> None:
    """`prepare_destination` for a store written straight into object storage (`convert --engine ray`)."""
    options_path = join(root, f"{PARTIAL_DIR}/{OPTIONS_FILE}")
    if check_remote_destination(fs, root, url, resume, overwrite):
        if overwrite:
            fs.rm(root, recursive=True)
        else:
            if not fs.exists(options_path):
                raise DestinationError(
                    f"'{url}' is not an interrupted mmdata conversion (no {PARTIAL_DIR}/{OPTIONS_FILE});"
                    " choose an empty destination, or pass --overwrite to delete everything in it and convert there"
                )
            _check_same_options(url, options_path, fs.cat_file(options_path), fingerprint, CONVERT_AGAIN)
            return
    write_text_atomically(options_path, json.dumps(fingerprint, indent=1), fs)


def check_remote_destination(fs: fsspec.AbstractFileSystem, root: str, url: str, resume: bool, overwrite: bool) -> bool:
    """Whether the object-store destination holds anything; refuses a complete store (unless `overwrite`)
    and anything else unless told what to do with it (`resume` or `overwrite`)."""
    if not fs.exists(root) or all(is_writer_record(entry.rstrip("/").rsplit("/", 1)[-1]) for entry in fs.ls(root)):
        return False
    if fs.exists(join(root, DATASET_FILE)) and not overwrite:
        raise DestinationError(f"'{url}' is already a complete store; {REPLACE_STORE}")
    if not (resume or overwrite):
        raise _not_empty(url)
    return True


REPLACE_STORE = "pass --append to add the episodes to it, or --overwrite to delete it and convert again"


def _check_same_options(
    root: str, options_path: str, saved_text: bytes, fingerprint: dict[str, Any], restart: str
) -> None:
    """Refuse to resume with other options than the interrupted run's; `restart` says how to start again instead."""
    try:
        saved = parse_json(saved_text)
    except ValueError as exc:
        raise DestinationError(f"{options_path} {exc}; {restart}") from exc
    if saved != fingerprint:
        saved = saved if isinstance(saved, dict) else {}
        changed = sorted(k for k in fingerprint if saved.get(k) != fingerprint[k])
        raise DestinationError(
            f"cannot resume '{root}': {', '.join(changed)} changed since the interrupted run;"
            f" resume with the same source and options, or {restart}"
        )


def check_converted_sources(root: Path, names: list[str], files: list[list[list[Any]]], converted: int) -> None:
    """Keep each episode's source files (path, size, modification time; `source_files`) beside the resume state,
    and on resuming refuse when a file of an episode already converted changed since: the store would hold
    the old recording. Episodes not yet converted may change (a broken file fixed before resuming)."""
    path = root / PARTIAL_DIR / SOURCES_FILE
    if converted and path.exists():
        try:
            saved = parse_json(path.read_bytes())
        except ValueError as exc:
            raise DestinationError(f"{path} {exc}; {start_again(root)}") from exc
        if not isinstance(saved, list) or len(saved) != len(files):
            raise DestinationError(f"{path} does not list the source's episodes; {start_again(root)}")
        for name, before, now in zip(names[:converted], saved[:converted], files[:converted]):
            if before != now:
                old = {f[0]: f for f in before if isinstance(f, list) and f} if isinstance(before, list) else {}
                changed = next((f[0] for f in now if old.get(f[0]) != f), now[0][0] if now else "?")
                raise DestinationError(
                    f"cannot resume '{root}': episode '{name}', already converted, was read from {changed},"
                    f" which was modified since; {start_again(root)}"
                )
    write_text_atomically(str(path), json.dumps(files))


def _not_empty(root: str) -> DestinationError:
    return DestinationError(
        f"destination '{root}' is not empty; pass --resume to continue an interrupted conversion, or --overwrite to"
        " delete everything in it and convert there"
    )
