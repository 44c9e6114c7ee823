"""Manifest rows copied from stores into a new manifest: chosen rows of each row group, brought to one schema,
renumbered 0..n-1 and written a row group at a time, so that a manifest of millions of episodes is copied in the
memory of one row group and a reader sees the new file whole or not at all."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from mmdata.store.filesystem import writing_atomically
from mmdata.store.handle import Store
from mmdata.store.manifest import ROW_GROUP_ROWS, STATISTICS, renumbered


def chosen_rows(store: Store, rows: np.ndarray) -> Iterator[pa.Table]:
    """The rows `rows` (ascending) of `store`'s manifest, in order, a row group at a time."""
    for first, group in store.manifest.row_groups():
        inside = rows[(rows >= first) & (rows < first + group.num_rows)] - first
        if len(inside):
            yield group.take(pa.array(inside))


def write_rows(
    fs: fsspec.AbstractFileSystem,
    path: str,
    parts: Iterable[pa.Table],
    schema: pa.Schema,
    total: int,
    description: str,
    progress: bool,
) -> None:
    """`parts` (rows of manifests, in order; columns they lack filled with nulls) as the episodes 0..total-1 of a
    manifest of `schema` at `path`, in row groups of `ROW_GROUP_ROWS`."""
    written = 0
    bar = tqdm(total=total, unit="episode", desc=description, disable=not progress)
    with (
        bar,
        writing_atomically(path, fs) as handle,
        pq.ParquetWriter(handle, schema, compression="zstd", write_statistics=STATISTICS) as writer,
    ):
        for rows in _regrouped(conformed(part, schema) for part in parts):
            writer.write_table(renumbered(rows, np.arange(written, written + rows.num_rows, dtype=np.int64)))
            written += rows.num_rows
            bar.update(rows.num_rows)
        if written != total:  # (raised inside the block: the file is not published)
            raise AssertionError(f"{written} manifest rows written where {total} were chosen")


def conformed(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """`rows` with the columns of `schema`, in its order: a column they lack (a camera's packet indexes, in a store
    written before them) is null in every row."""
    columns = [
        rows.column(field.name).cast(field.type)
        if field.name in rows.column_names
        else pa.nulls(rows.num_rows, field.type)
        for field in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def _regrouped(parts: Iterable[pa.Table]) -> Iterator[pa.Table]:
    """The rows of `parts` in groups of `ROW_GROUP_ROWS` (the last one shorter)."""
    pending: list[pa.Table] = []
    held = 0
    for part in parts:
        pending.append(part)
        held += part.num_rows
        while held >= ROW_GROUP_ROWS:
            joined = pa.concat_tables(pending)
            yield joined.slice(0, ROW_GROUP_ROWS)
            rest = joined.slice(ROW_GROUP_ROWS)
            pending, held = ([rest] if rest.num_rows else []), rest.num_rows
    if held:
        yield pa.concat_tables(pending)
