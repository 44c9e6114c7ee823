"""Paths and URLs through fsspec: local folders, file://, memory://, s3://, gs://, https://."""

from __future__ import annotations

import time

import fsspec
from fsspec.core import url_to_fs

READ_RETRIES = 3


def resolve(path_or_url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and the root path inside it for a local path or an fsspec URL."""
    fs, root = url_to_fs(str(path_or_url))
    return fs, root.rstrip("/") or "/"


def join(root: str, relative: str) -> str:
    return f"{root.rstrip('/')}/{relative}" if relative else root


def read_range(fs: fsspec.AbstractFileSystem, path: str, offset: int, size: int) -> bytes:
    """One byte-range read, retried on transient I/O errors (remote stores drop connections)."""
    for attempt in range(READ_RETRIES):
        try:
            data = fs.cat_file(path, start=offset, end=offset + size)
        except (OSError, TimeoutError):
            if attempt == READ_RETRIES - 1:
                raise
            time.sleep(0.2 * 2**attempt)
            continue
        if len(data) != size:
            raise OSError(f"{path}: short read at byte {offset} ({len(data)} of {size} bytes)")
        return data
    raise AssertionError("unreachable")
