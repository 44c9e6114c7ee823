"""A store's next version from a choice of its episodes: the kept rows renumbered into a new manifest, new
statistics, then `dataset.json` naming them, swapped last and in one step (`store.versions`).

What a reader of the store sees is `dataset.json`: until it is swapped, the store is the version before (an edit
that fails or is killed at any step leaves it so, and the files it wrote under its own names are removed, by it or
by the next writer); after it, the new version, whose manifest points at the same shards and arrays. An edit holds
the store while it writes (`store.hold`: a second writer is refused at once, naming the first) and publishes only
if the store is still the version it read, so two writers never lose each other's work. A reader that opened the
version before keeps reading its files: the manifest and statistics of the version before the new one are kept,
older ones removed (as an append does). The manifest is copied a row group at a time, so a store of millions of
episodes is edited in the memory of one row group.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mmdata.editing.rows import chosen_rows, write_rows
from mmdata.editing.selection import EpisodeSelection
from mmdata.errors import EditError, MmdataError
from mmdata.schema import DatasetSchema
from mmdata.store.filesystem import join
from mmdata.store.handle import Store, open_store
from mmdata.store.hold import hold_store
from mmdata.store.layout import PARTIAL_DIR
from mmdata.store.statistics import compute_stats, read_stats
from mmdata.store.versions import NextVersion, Statistics, complete_version, utc_now

Action = Literal["delete", "keep"]


StatsFate = Literal["recomputed", "kept"]  # the new version's statistics: computed again, or the version before's


@dataclass(frozen=True)
class EditReport:
    """What an edit made: the store's new version, its episodes before and after, and its statistics."""

    url: str
    version: int
    episodes_before: int
    episodes_after: int
    manifest_file: str
    stats: StatsFate


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
    with editing(url, f"mmdata edit {url} {action}") as (store, version):
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
        schema = next_version(store.schema, history_entry(action, len(kept), count, described), version)
        stats = compute_stats if recompute_stats else stats_before(store, f"episodes were {verb}")
        manifest = manifest_of(store, chosen_rows(store, kept), store.manifest.schema, len(kept), progress)
        complete_version(version, schema, manifest, stats, store.schema)
        return EditReport(url, schema.version, count, len(kept), schema.manifest_file, _how(recompute_stats))


def remove_stream(url: str, name: str, progress: bool = True) -> EditReport:
    """Write the next version of the store at `url` without stream `name`: its manifest columns and its entry in
    `dataset.json` and in the statistics (the other streams' statistics are unchanged, so none is computed). An
    episode's duration is the end of its longest stream: where the stream removed ended last, the episode's
    duration becomes the end of the longest stream left."""
    with editing(url, f"mmdata edit {url} remove-stream {name}") as (store, version):
        try:
            store.schema.stream(name)
        except KeyError as exc:
            raise EditError(f"'{url}': {exc.args[0]}") from None
        streams = [stream for stream in store.schema.streams if stream.name != name]
        timed = [stream.name for stream in streams if stream.kind != "text"]
        if not timed:
            raise EditError(f"'{url}': '{name}' is its last stream with values; a store without one cannot be read")
        count = len(store)
        entry = history_entry("remove-stream", count, count, f"remove stream '{name}'")
        added = {stream: origin for stream, origin in store.schema.stream_origins.items() if stream != name}
        schema = dataclasses.replace(next_version(store.schema, entry, version), streams=streams, stream_origins=added)
        columns = [field for field in store.manifest.schema if not field.name.startswith(f"{name}/")]
        kept = [field.name for field in columns]
        parts = (ended_with_streams(rows.select(kept), timed) for _, rows in store.manifest.row_groups())
        try:
            stats: Statistics = {key: _without(value, name) for key, value in read_stats(store).items()}
        except MmdataError:
            stats = compute_stats
        manifest = manifest_of(store, parts, pa.schema(columns), count, progress)
        complete_version(version, schema, manifest, stats, store.schema)
        return EditReport(url, schema.version, count, count, schema.manifest_file, "kept")


def ended_with_streams(rows: pa.Table, streams: list[str]) -> pa.Table:
    """`rows` with each episode's duration the end of the longest of `streams` (what the manifest checks hold a
    duration to), for a version whose streams are `streams`."""
    return with_durations(rows, pc.max_element_wise(*(stream_end(rows, name) for name in streams), pa.scalar(0.0)))


def stream_end(rows: pa.Table, name: str) -> pa.Array:
    """Each row's end of stream `name` in seconds (0 where missing), as float64."""
    return pc.fill_null(pc.cast(rows.column(f"{name}/t_end"), pa.float64()), 0.0)


def with_durations(rows: pa.Table, durations: pa.Array) -> pa.Table:
    """`rows` with `durations` (seconds) as their `duration` column, of its type."""
    place = rows.schema.get_field_index("duration")
    return rows.set_column(place, rows.schema.field(place), pc.cast(durations, rows.schema.field(place).type))


@contextlib.contextmanager
def editing(url: str, writer: str) -> Iterator[tuple[Store, NextVersion]]:
    """The store at `url`, held by the edit `writer` ("mmdata edit URL delete"), and its next version (see
    `store.versions`): what the block writes under the version's names is removed if it fails, and a store changed
    meanwhile by another writer is a ConcurrentWriteError."""
    with hold_store(url, writer) as hold, NextVersion(hold) as version:
        yield editable_store(url), version


def next_version(schema: DatasetSchema, entry: dict, version: NextVersion) -> DatasetSchema:
    """`schema`'s next version: its manifest and statistics files, named by its writer `version`, and `entry`
    (`history_entry`) added."""
    manifest_file, stats_file = version.file_names(schema.version + 1)
    return dataclasses.replace(
        schema,
        num_episodes=entry["episodes"],
        manifest_file=manifest_file,
        stats_file=stats_file,
        history=[*schema.history, entry],
    )


def history_entry(edit: str, episodes: int, before: int, described: str) -> dict:
    """What `dataset.json`'s history says of an edit: when, what, the episodes it left of how many."""
    return {
        "time": utc_now(),
        "edit": edit,
        "episodes": episodes,
        "episodes_before": before,
        "first_episode": 0,
        "source": described,
    }


def editable_store(url: str) -> Store:
    """The store at `url`, refused while an append to it is under way or was interrupted."""
    store = open_store(url)
    if store.fs.exists(join(store.root, PARTIAL_DIR)):
        raise EditError(
            f"'{url}' holds an append in progress or interrupted ({PARTIAL_DIR}/): finish it with `mmdata convert"
            " ... --append --resume`, or give it up by deleting that folder, then edit"
        )
    return store


def manifest_of(
    store: Store, parts: Iterator[pa.Table], columns: pa.Schema, rows: int, progress: bool
) -> Callable[[str], None]:
    """What writes an edit's manifest of `rows` rows, of `columns`, from `parts` (its rows in order), where the new
    version names it (`store.versions.complete_version`)."""

    def write(path: str) -> None:
        write_rows(store.fs, path, parts, columns, rows, f"edit {store.url}", progress)

    return write


def _how(recomputed: bool) -> StatsFate:
    return "recomputed" if recomputed else "kept"


def _without(section: object, name: str) -> object:
    """A statistics section without stream `name`'s entry."""
    return {key: value for key, value in section.items() if key != name} if isinstance(section, dict) else section


def stats_before(store: Store, change: str) -> dict:
    """`store`'s statistics, marked as computed before `change` (what `--keep-stats` keeps)."""
    try:
        stats = read_stats(store)
    except MmdataError as exc:
        raise EditError(
            f"'{store.url}' has no statistics to keep ({exc}); edit with the statistics computed again (leave out"
            " --keep-stats)"
        ) from exc
    stats["before_edit"] = f"computed over '{store.url}' before {change}; run `mmdata stats` to compute them again"
    return stats
