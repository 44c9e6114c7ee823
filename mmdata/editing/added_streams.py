"""A stream of another store added to a store's next version, without copying its media: the store's manifest gains
the stream's columns, read from the other store's rows of the same episodes, and `dataset.json` names the store
holding its pieces (`stream_origins`, a path relative to the store, as a split's `origins` are), so readers find
them there (`manifest.rooted_in_origin`).

What it is for: a stream made later from the same recordings (a depth camera, a re-encoded view, annotations as
values) converted into a store of its own, then added to the store training reads. Episodes are matched by their
`source` (the recording a conversion read, the default) or by their order. The other store is only read and must
stay where it is, beside the store (the store refuses to open without it, naming it); `mmdata edit compact` makes
the store hold the stream's media itself. Published as every edit is: `dataset.json` last.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mmdata.editing.derived import inside_path
from mmdata.editing.edits import (
    EditReport,
    StatsFate,
    editing,
    history_entry,
    manifest_of,
    next_version,
    stats_before,
    stream_end,
    with_durations,
)
from mmdata.errors import EditError, MmdataError, OptionError
from mmdata.schema import DatasetSchema, Stream, is_origin
from mmdata.store.filesystem import join, relative_path
from mmdata.store.handle import Store, open_store
from mmdata.store.manifest import ORIGIN
from mmdata.store.manifest_checks import check_manifest
from mmdata.store.statistics import compute_stats, read_stats
from mmdata.store.versions import complete_version

Match = Literal["source", "order"]
MATCHES = ("source", "order")
_SHOWN = 3
ADDED_SLACK_S = 0.1  # an added stream may end this much after an episode, which then lasts until it ends


def add_streams(
    url: str,
    other_url: str,
    names: list[str],
    match: Match = "source",
    recompute_stats: bool = True,
    progress: bool = True,
) -> EditReport:
    """Write the next version of the store at `url` with the streams `names` of the store at `other_url` (the same
    layout, beside it), each episode's read from the other store's episode of the same `source` ("source") or the
    same number ("order"). Statistics are computed again, or (`recompute_stats=False`) the store's are kept and the
    other store's of the added streams added, marked as such."""
    if match not in MATCHES:
        raise OptionError(f"episodes are matched by {' or '.join(MATCHES)}, not {match!r}")
    if not names or len(set(names)) != len(names):
        raise OptionError(f"name each stream to add once, not {names!r}")
    with editing(url, f"mmdata edit {url} add-stream --from {other_url}") as (store, version):
        other = open_store(other_url)
        added = [_addable(store, other, name) for name in names]
        origins = {name: _origin(store, other, name) for name in names}
        rows = _matched_rows(store, other, match)
        described = f"add {', '.join(repr(n) for n in names)} from '{other_url}' (episodes matched by {match})"
        entry = history_entry("add-stream", len(store), len(store), described)
        base = next_version(store.schema, entry, version)
        schema = dataclasses.replace(
            base, streams=[*store.schema.streams, *added], stream_origins={**store.schema.stream_origins, **origins}
        )
        columns = [f.name for f in other.manifest.schema if f.name.split("/", 1)[0] in names and "/" in f.name]
        fields = pa.schema([*store.manifest.schema, *(other.manifest.schema.field(name) for name in columns)])
        kept = None if recompute_stats else _kept_stats(store, other, names)  # (refused before anything is written)
        parts = _joined(store, other, rows, columns, schema, other_url)
        manifest = manifest_of(store, parts, fields, len(store), progress)
        complete_version(version, schema, manifest, compute_stats if kept is None else kept, store.schema)
        how: StatsFate = "recomputed" if kept is None else "kept"
        return EditReport(url, schema.version, len(store), len(store), schema.manifest_file, how)


def _addable(store: Store, other: Store, name: str) -> Stream:
    """`other`'s stream `name`, which `store` (of `other`'s layout) lacks and can hold."""
    if other.schema.layout != store.schema.layout:
        raise EditError(
            f"'{other.url}' is a {other.schema.layout} store and '{store.url}' a {store.schema.layout} one; a stream"
            " is added from a store of the same layout: convert it again with --layout"
            f" {store.schema.layout}"
        )
    try:
        stream = other.schema.stream(name)
    except KeyError as exc:
        raise EditError(f"'{other.url}': {exc.args[0]}") from None
    if stream.kind == "text":
        raise EditError(f"'{name}' is the episodes' task text, which every store holds; add a stream with media")
    if any(s.name == name for s in store.schema.streams):
        raise EditError(
            f"'{store.url}' has a stream '{name}' already; remove it first (`mmdata edit {store.url} remove-stream"
            f" {name}`), or convert the new one under another name"
        )
    return stream


def _origin(store: Store, other: Store, name: str) -> str:
    """The store holding `other`'s stream `name`, as a path from `store`: `other`, or the store `other` names for
    it (a chain of stores ends where the media are)."""
    if other.fs != store.fs:
        raise EditError(
            f"'{other.url}' and '{store.url}' are on different filesystems; a stream added from a store is read by"
            " a relative path: put the stores side by side"
        )
    held = other.schema.stream_origins.get(name)
    if held is None and other.schema.origins:
        values = pc.unique(pc.cast(other.columns([ORIGIN]).column(ORIGIN), pa.string())).to_pylist()
        if len(values) != 1 or not values[0]:
            raise EditError(
                f"'{other.url}' reads '{name}' from {len(values)} stores (it was merged); compact it first"
                f" (`mmdata edit {other.url} compact --into NEW`), then add the stream from NEW"
            )
        held = values[0]
    media = join(other.root, held) if held else other.root
    origin = relative_path(media, store.root)
    if not is_origin(origin) or inside_path(store.root, media) or inside_path(media, store.root):
        raise EditError(
            f"'{store.url}' would name the store at '{media}' as '{origin}': a stream is added from a store that lies"
            " beside it (not inside it, nor around it), in folders of plain names"
        )
    return origin


def _matched_rows(store: Store, other: Store, match: Match) -> np.ndarray:
    """For each of `store`'s episodes, the row of `other` holding the same episode."""
    if match == "order":
        if len(other) != len(store):
            raise EditError(
                f"'{store.url}' holds {len(store)} episodes and '{other.url}' {len(other)}: matched by order, the"
                " stores hold the same episodes in the same order (match by --match source otherwise)"
            )
        return np.arange(len(store), dtype=np.int64)
    theirs = pc.cast(other.columns(["source"]).column("source"), pa.string()).combine_chunks()
    mine = pc.cast(store.columns(["source"]).column("source"), pa.string()).combine_chunks()
    found = pc.index_in(mine, value_set=theirs)
    missing = np.flatnonzero(found.is_null().to_numpy(zero_copy_only=False))
    if len(missing):
        shown = ", ".join(f"episode {i} ('{mine[int(i)].as_py()}')" for i in missing[:_SHOWN])
        raise EditError(
            f"{len(missing)} episode(s) of '{store.url}' have no episode of the same source in '{other.url}', the"
            f" first: {shown}; convert the stream from the same recordings, or match by --match order"
        )
    counted = pc.value_counts(theirs)
    often = pc.greater(counted.field("counts"), 1)
    held = dict(
        zip(counted.field("values").filter(often).to_pylist(), counted.field("counts").filter(often).to_pylist())
    )
    repeated = pa.array(list(held), pa.string())
    twice = np.flatnonzero(pc.is_in(mine, value_set=repeated).to_numpy(zero_copy_only=False))
    if len(twice):
        first = int(twice[0])
        source = mine[first].as_py()
        raise EditError(
            f"'{other.url}' holds {held[source]} episodes of source '{source}' (episode {first} of '{store.url}'):"
            " each episode is matched to one; match by --match order"
        )
    return found.to_numpy(zero_copy_only=False).astype(np.int64)


def _joined(
    store: Store, other: Store, rows: np.ndarray, columns: list[str], schema: DatasetSchema, other_url: str
) -> Iterator[pa.Table]:
    """`store`'s manifest a row group at a time, each row with the added streams' columns of its match in `other`;
    a row the added streams would leave inconsistent (a stream that ends after the episode: the stores' episodes
    do not line up) is refused, naming it, before the manifest is published."""
    where = f"{store.url} with streams of {other_url}"
    for first, part in store.manifest.row_groups():
        found = other.manifest.take(rows[first : first + part.num_rows], columns)
        joined = part
        for name in columns:
            joined = joined.append_column(name, found.column(name))
        joined = _ended_with_added(joined, sorted({column.split("/", 1)[0] for column in columns}))
        before = check_manifest(part, store.schema, store.url, first)
        after = check_manifest(joined, schema, where, first)
        new = {row: message for row, message in after.items() if row not in before}
        if new:
            shown = "; ".join(list(new.values())[:_SHOWN])
            raise EditError(
                f"adding the streams would leave {len(new)} episode(s) of '{store.url}' inconsistent: {shown}. Its"
                f" episodes and '{other_url}''s may not line up (--match source or order); nothing was changed"
            )
        yield joined


def _ended_with_added(rows: pa.Table, added: list[str]) -> pa.Table:
    """`rows` whose durations become the end of an added stream that ends after them by at most `ADDED_SLACK_S` (a
    stream of the same recording: audio a few samples after the last frame); one ending later is left to the
    checks, which refuse it (the stores' episodes do not line up)."""
    duration = pc.cast(rows.column("duration"), pa.float64())
    latest = duration
    for name in added:
        end = stream_end(rows, name)
        near = pc.less_equal(end, pc.add(duration, ADDED_SLACK_S))
        latest = pc.if_else(pc.and_(near, pc.greater(end, latest)), end, latest)
    return with_durations(rows, latest)


def _kept_stats(store: Store, other: Store, names: list[str]) -> dict:
    """`store`'s statistics, marked as computed before the edit, with `other`'s of the streams `names`."""
    stats = stats_before(store, f"streams {', '.join(names)} were added from '{other.url}'")
    try:
        theirs = read_stats(other)
    except MmdataError as exc:
        raise EditError(f"'{other.url}' has no statistics to keep ({exc}); add streams without --keep-stats") from exc
    for section in ("lowdim", "cameras", "moments"):
        mine = stats.setdefault(section, {})
        for name in names:
            if name in theirs.get(section, {}):
                mine[name] = theirs[section][name]
    return stats
