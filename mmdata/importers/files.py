"""How every importer finds and admits the files it reads: one set of rules, so that a broken link, a FIFO
or a device is an error naming it wherever it appears (never a stream silently missing, never a read that
blocks for ever), and no importer reads a file outside its source."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from mmdata.checks import inside

_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a folder",
}


def file_problem(path: str | os.PathLike, root: str | os.PathLike) -> str | None:
    """Why an importer may not read `path`, found in or named by the source `root`, or None: it must be a
    regular file once links are followed, and lie inside `root` with every link resolved."""
    problem = regular_file_problem(path)
    if problem is None and not inside(root, path):
        return f"is a link to '{Path(path).resolve()}', outside the source"
    return problem


def regular_file_problem(path: str | os.PathLike) -> str | None:
    """Why `path` is not a regular file once links are followed (missing, a broken link, a FIFO, ...), or None."""
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return "is a broken symbolic link" if os.path.islink(path) else "is missing"
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    if not stat.S_ISREG(status.st_mode):
        return f"is {_KINDS.get(stat.S_IFMT(status.st_mode), 'not a file')}, not a regular file"
    return None


def listed(folder: Path, wanted: Callable[[str], bool]) -> list[Path]:
    """The entries of `folder` whose names an importer reads (`wanted`), in name order: hidden names and
    sub-folders left out, but broken links, FIFOs and devices kept, for `file_problem` to name."""
    return sorted(entry for entry in _entries(folder) if wanted(entry.name))


def listed_below(root: Path, wanted: Callable[[str], bool]) -> list[Path]:
    """`listed` over `root` and every folder below it (hidden folders and links to folders not entered)."""
    found = []
    folders = [root]
    while folders:
        folder = folders.pop()
        for entry in _entries(folder, keep_folders=True):
            if entry.is_dir() and not entry.is_symlink():
                folders.append(entry)
            elif not entry.is_dir() and wanted(entry.name):
                found.append(entry)
    return sorted(found)


def _entries(folder: Path, keep_folders: bool = False) -> Iterator[Path]:
    for entry in folder.iterdir():
        if entry.name.startswith("."):
            continue
        if keep_folders or not entry.is_dir():
            yield entry
