"""A store's next version from a choice of its episodes: the kept rows renumbered into a new manifest, new
statistics, then `dataset.json` naming them, replaced last and in one step.

What a reader of the store sees is `dataset.json`: until it is replaced, the store is the version before (an
edit that fails or is killed at any step leaves it so, and the files it wrote under the next version's names
are written again by the next edit); after it, the new version, whose manifest points at the same shards and
arrays. A reader that opened the version before keeps reading its files: the manifest and statistics of the
version before the new one are kept, older ones removed (as an append does). The manifest is copied a row
group at a time, so a store of millions of episodes is edited in the memory of one row group.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from mmdata.conversion.append import remove_superseded, utc_now
from mmdata.editing.selection import EpisodeSelection
from mmdata.errors import EditError, MmdataError
from mmdata.schema import DatasetSchema, version_file_name
from mmdata.store.dataset import Dataset
from mmdata.store.filesystem import join, write_text_atomically, writing_atomically
from mmdata.store.handle import Store, open_store
from mmdata.store.layout import DATASET_FILE, PARTIAL_DIR
from mmdata.store.manifest import ROW_GROUP_ROWS, STATISTICS, renumbered
from mmdata.store.statistics import compute_stats, read_stats, write_stats

Action = Literal["delete", "keep"]


@dataclass(frozen=True)
class EditReport:
    """What an edit made: the store's new version, its episodes before and after, and its statistics."""

    url: str
    version: int
    episodes_before: int
    episodes_after: int
    manifest_file: str
    stats: Literal["recomputed", "kept"]


def edit_store(
    url: str,
    action: Action,
    selection: EpisodeSelection,
    recompute_stats: bool = True,
    progress: bool = True,
) -> EditReport:
    """Write the next version of the store at `url` without the episodes `selection` names ("delete") or with
    only those ("keep"). Statistics are computed again over the kept episodes, or (`recompute_stats=False`, for
    stores too large to read again) the version before's are kept, marked as such."""
    if action not in ("delete", "keep"):
        raise EditError(f"an edit deletes or keeps episodes, not {action!r}")
    store = open_store(url)
    if store.fs.exists(join(store.root, PARTIAL_DIR)):
        raise EditError(
            f"'{url}' holds an append in progress or interrupted ({PARTIAL_DIR}/): finish it with `mmdata convert"
            " ... --append --resume`, or give it up by deleting that folder, then edit"
        )
    count = len(store)
    table = store.columns(selection.columns) if selection.columns else pa.table({})
    named = selection.rows(table, count)
    kept = np.setdiff1d(np.arange(count), named) if action == "delete" else named
    if len(kept) == 0:
        raise EditError(f"keeping {selection.describe()} of '{url}' would leave no episode; nothing was changed")
    if len(kept) == count:
        raise EditError(f"'{url}' has no episode to {action} ({selection.describe()}): nothing was changed")
    verb = "deleted" if action == "delete" else "kept"
    described = f"{action} {len(named)} episode{'' if len(named) == 1 else 's'} ({selection.describe()})"
    schema = _next_schema(store.schema, len(kept), count, action, described)
    _write_manifest(store, kept, schema.manifest_file, progress)
    edited = Store(url, schema=schema)
    write_stats(edited, compute_stats(Dataset(edited)) if recompute_stats else _stats_before(store, verb))
    write_text_atomically(join(store.root, DATASET_FILE), schema.to_json(), store.fs)
    remove_superseded(store.fs, store.root, schema)
    return EditReport(
        url, schema.version, count, len(kept), schema.manifest_file, "recomputed" if recompute_stats else "kept"
    )


def _next_schema(schema: DatasetSchema, kept: int, before: int, action: Action, described: str) -> DatasetSchema:
    version = schema.version + 1
    entry = {
        "time": utc_now(),
        "edit": action,
        "episodes": kept,
        "episodes_before": before,
        "first_episode": 0,
        "source": described,
    }
    return DatasetSchema(
        layout=schema.layout,
        streams=schema.streams,
        num_episodes=kept,
        created=schema.created,
        format_version=schema.format_version,
        manifest_file=version_file_name("episodes", version),
        stats_file=version_file_name("stats", version),
        history=[*schema.history, entry],
    )


def _write_manifest(store: Store, kept: np.ndarray, name: str, progress: bool) -> None:
    """The kept rows, renumbered 0..n-1 (their keys with them), a row group at a time, into `name`."""
    path = join(store.root, name)
    written = 0
    with writing_atomically(path, store.fs) as handle:
        writer: pq.ParquetWriter | None = None
        with tqdm(total=len(kept), unit="episode", desc=f"edit {store.url}", disable=not progress) as bar:
            for rows in _regrouped(_kept_rows(store, kept)):
                numbers = np.arange(written, written + rows.num_rows, dtype=np.int64)
                rows = renumbered(rows, numbers)
                if writer is None:
                    writer = pq.ParquetWriter(handle, rows.schema, compression="zstd", write_statistics=STATISTICS)
                writer.write_table(rows)
                written += rows.num_rows
                bar.update(rows.num_rows)
        if writer is not None:
            writer.close()


def _kept_rows(store: Store, kept: np.ndarray) -> Iterator[pa.Table]:
    """The kept rows of each of the manifest's row groups, in order."""
    for first, group in store.manifest.row_groups():
        inside = kept[(kept >= first) & (kept < first + group.num_rows)] - first
        if len(inside):
            yield group.take(pa.array(inside))


def _regrouped(parts: Iterator[pa.Table]) -> Iterator[pa.Table]:
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


def _stats_before(store: Store, verb: str) -> dict:
    """The version before's statistics, marked as computed before the edit (what `--keep-stats` keeps)."""
    try:
        stats = read_stats(store)
    except MmdataError as exc:
        raise EditError(
            f"'{store.url}' has no statistics to keep ({exc}); edit with the statistics computed again (leave out"
            " --keep-stats)"
        ) from exc
    stats["before_edit"] = f"computed before episodes were {verb}; run `mmdata stats {store.url}` to compute them again"
    return stats
