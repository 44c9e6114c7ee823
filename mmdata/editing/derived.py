"""New stores made from existing ones without copying media: a store split into train and validation stores, and
stores of the same streams merged into one.

A new store holds a manifest, statistics and `dataset.json`, and no media: each manifest row names the store that
holds its episode's shards or arrays (`origin`, one of `dataset.json`'s `origins`, paths relative to the new store
such as `../robot-2026`), and readers find the pieces there (`manifest.rooted_in_origin`). The stores it was made
from are not changed; they must stay where they are (a store whose origin is gone refuses to open, naming it).
A store made from a split or merged store names the stores holding the media, never the intermediate store, and
a stream added from another store (`stream_origins`) keeps being read there.

`dataset.json` is written last: until then the destination is no store, and the same split or merge run again
writes over what a failed run left. A destination that is a store already is refused, unless it is the result of
the very same edit (a split stopped between its two stores is completed by running it again).
"""

from __future__ import annotations

import dataclasses
import math
import os
import posixpath
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from fsspec.implementations.local import LocalFileSystem

from mmdata.editing.edits import EditReport, StatsFate, editable_store, history_entry, stats_before
from mmdata.editing.rows import chosen_rows, write_rows
from mmdata.editing.selection import EpisodeSelection
from mmdata.errors import EditError, MmdataError, OptionError
from mmdata.schema import DatasetSchema, is_origin, stream_to_dict, version_file_name, version_of_file
from mmdata.store.filesystem import join, read_file, relative_path, resolve, temporary_of
from mmdata.store.handle import MAX_SCHEMA_BYTES, Store
from mmdata.store.hold import hold_store, is_writer_record
from mmdata.store.layout import DATASET_FILE
from mmdata.store.manifest import ORIGIN
from mmdata.store.statistics import compute_stats
from mmdata.store.versions import NextVersion, complete_version

_MIX = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class ValidationChoice:
    """Which episodes a split sends to validation: those `selection` names, or `fraction` of all episodes drawn by
    `seed` (the same store, fraction and seed always draw the same episodes)."""

    selection: EpisodeSelection | None = None
    fraction: float | None = None
    seed: int = 0

    def __post_init__(self):
        if (self.selection is None) == (self.fraction is None):
            raise OptionError("a split names its validation episodes by a selection or by a fraction, one of the two")
        if self.fraction is not None and not (
            isinstance(self.fraction, (int, float)) and math.isfinite(self.fraction) and 0 < self.fraction < 1
        ):
            raise OptionError(f"the validation fraction is a number between 0 and 1, not {self.fraction!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise OptionError(f"the split's seed is a whole number from 0, not {self.seed!r}")

    def rows(self, store: Store) -> np.ndarray:
        """The validation rows of `store`, ascending."""
        count = len(store)
        if self.selection is not None:
            columns = self.selection.columns
            return self.selection.rows(store.columns(columns) if columns else pa.table({}), count)
        assert self.fraction is not None, "checked when the split was made: a selection or a fraction"
        wanted = min(max(round(self.fraction * count), 1), count - 1) if count > 1 else 0
        return np.sort(np.argsort(_hashed(np.arange(count, dtype=np.uint64), self.seed), kind="stable")[:wanted])

    def describe(self) -> str:
        if self.selection is not None:
            return self.selection.describe()
        return f"{self.fraction:g} of the episodes drawn with seed {self.seed}"


def split_store(
    url: str,
    train_url: str,
    validation_url: str,
    choice: ValidationChoice,
    recompute_stats: bool = True,
    progress: bool = True,
) -> tuple[EditReport, EditReport]:
    """Split the store at `url` into a validation store at `validation_url` (the episodes `choice` names) and a
    train store at `train_url` (the others), both pointing at `url`'s media. Each gets statistics of its own
    episodes, or (`recompute_stats=False`) `url`'s, marked as such."""
    store = editable_store(url)
    validation = choice.rows(store)
    train = np.setdiff1d(np.arange(len(store)), validation)
    if len(validation) == 0 or len(train) == 0:
        part = "validation" if len(validation) == 0 else "train"
        raise EditError(
            f"splitting '{url}' by {choice.describe()} leaves the {part} store without episodes; nothing was written"
        )
    if _location(train_url) == _location(validation_url):
        raise EditError(f"the train and validation stores must be two places, not both '{train_url}'")
    described = f"split of '{url}' ({len(store)} episodes), validation: {choice.describe()}"
    parts = (("train", train_url, train), ("validation", validation_url, validation))
    new = [
        _NewStore(place, [(store, rows)], "split", f"{described}; this is the {part} store")
        for part, place, rows in parts
    ]
    for one, other in ((new[0], new[1]), (new[1], new[0])):
        if inside_path(_location(other.url), _location(one.url)):
            raise EditError(f"'{one.url}' lies inside '{other.url}'; the train and validation stores go side by side")
    return (
        new[0].write(recompute_stats, f"the split into '{train_url}'", progress),
        new[1].write(recompute_stats, f"the split into '{validation_url}'", progress),
    )


def merge_stores(urls: Sequence[str], into: str, recompute_stats: bool = True, progress: bool = True) -> EditReport:
    """Merge the stores at `urls` (the same layout and streams) into a new store at `into`: their episodes in
    order, renumbered, pointing at their media. Statistics are computed over every episode, or
    (`recompute_stats=False`) the first store's are kept, marked as such."""
    if len(urls) < 2:
        raise EditError(f"a merge takes two stores or more, not {len(urls)}")
    places: dict[str, str] = {}
    for url in urls:
        if _location(url) in places:
            raise EditError(
                f"'{url}' and '{places[_location(url)]}' are one store: a merge takes each store once (its episodes"
                " would be in the merged store twice)"
            )
        places[_location(url)] = url
    stores = [editable_store(url) for url in urls]
    _check_same_streams(stores)
    described = "merge of " + ", ".join(f"'{store.url}' ({len(store)} episodes)" for store in stores)
    new = _NewStore(into, [(store, np.arange(len(store))) for store in stores], "merge", described)
    return new.write(recompute_stats, f"the merge into '{into}'", progress)


class _NewStore:
    """A store to write at `url` from chosen rows of `sources`, each row naming the store holding its media."""

    def __init__(self, url: str, sources: list[tuple[Store, np.ndarray]], edit: str, described: str):
        self.url, self.sources = url, sources
        self.fs, self.root = resolve(url)
        first = sources[0][0]
        for store, _ in sources:
            if store.fs != self.fs:
                raise EditError(
                    f"'{url}' and '{store.url}' are on different filesystems; a store made by an edit points at its"
                    " origins' media by relative path: write it beside them (copy the stores to one place first)"
                )
        self.origin_of = [
            {value: self._origin(store, value) for value in _origin_values(store)} for store, _ in sources
        ]
        origins = sorted({origin for mapping in self.origin_of for origin in mapping.values()})
        added = [
            {name: self._origin(store, origin) for name, origin in store.schema.stream_origins.items()}
            for store, _ in sources
        ]
        differing = [mapping for mapping in added[1:] if mapping != added[0]]
        if differing:
            raise EditError(
                f"the stores read streams added from other stores from different places ({added[0]} and"
                f" {differing[0]}); compact them first (`mmdata edit STORE compact --into NEW`), then merge"
            )
        total = sum(len(rows) for _, rows in sources)
        entry = history_entry(edit, total, sum(len(store) for store, _ in sources), described)
        self.schema = DatasetSchema(
            layout=first.schema.layout,
            streams=first.schema.streams,
            num_episodes=total,
            created={"edit": edit, "from": [store.url for store, _ in sources]},
            manifest_file=version_file_name("episodes", 1),
            stats_file=version_file_name("stats", 1),
            history=[entry],
            origins=origins,
            stream_origins=added[0],
        )
        self._check_destination()

    def write(self, recompute_stats: bool, change: str, progress: bool) -> EditReport:
        """Write the manifest, the statistics, then `dataset.json`, which makes the folder a store (published as
        every version is: `store.versions`; the destination held while it is written: `store.hold`)."""
        kept = None if recompute_stats else stats_before(self.sources[0][0], change)  # (refused before any write)
        columns = _union_schema([store.manifest.schema for store, _ in self.sources])
        with hold_store(self.url, f"mmdata edit: {change}") as hold, NextVersion(hold) as version:
            previous = self._check_destination(leftovers_removed=hold.local)
            manifest_file, stats_file = version.file_names(self.schema.version)
            schema = dataclasses.replace(self.schema, manifest_file=manifest_file, stats_file=stats_file)
            total = schema.num_episodes

            def write_manifest(path: str) -> None:
                write_rows(self.fs, path, self._parts(), columns, total, f"write {self.url}", progress)

            complete_version(version, schema, write_manifest, compute_stats if kept is None else kept, previous)
        before = sum(len(source) for source, _ in self.sources)
        how: StatsFate = "recomputed" if recompute_stats else "kept"
        return EditReport(self.url, schema.version, before, total, schema.manifest_file, how)

    def _parts(self) -> Iterator[pa.Table]:
        """The chosen rows of every source, in order, each naming (`origin`) the store holding its media, from the
        new store."""
        for (store, rows), mapping in zip(self.sources, self.origin_of):
            values, origins = pa.array(list(mapping), pa.string()), pa.array(list(mapping.values()), pa.string())
            for part in chosen_rows(store, rows):
                if ORIGIN in part.column_names:
                    found = pc.index_in(pc.fill_null(part.column(ORIGIN), ""), value_set=values)
                    origin, part = pc.take(origins, found), part.drop_columns([ORIGIN])
                else:  # (a store holding its own media)
                    origin = pa.array([mapping[""]] * part.num_rows, pa.string())
                yield part.append_column(ORIGIN, origin)

    def _origin(self, store: Store, value: str) -> str:
        """The path from the new store to the store holding the media of `store`'s rows of origin `value`."""
        media = join(store.root, value) if value else store.root
        origin = relative_path(media, self.root)
        if not is_origin(origin):
            raise EditError(
                f"'{self.url}' would name the store at '{media}' as '{origin}': a store made by an edit lies beside"
                " the stores it is made from (not inside one, nor around one), in folders of plain names"
            )
        return origin

    def _check_destination(self, leftovers_removed: bool = False) -> DatasetSchema | None:
        """The destination is a plain folder (not a link) that is no store (or this same edit's, stopped half-way:
        its schema is returned) and holds nothing else but what an interrupted edit leaves (a version's manifest or
        statistics, temporaries), which `leftovers_removed` (the destination held: none is being written) removes."""
        if isinstance(self.fs, LocalFileSystem) and os.path.islink(self.root):
            raise EditError(
                f"'{self.url}' is a symbolic link (to '{os.path.realpath(self.root)}'); a new store is written"
                " into a folder, not through a link: give the folder itself, or remove the link"
            )
        document = join(self.root, DATASET_FILE)
        found = None
        if self.fs.exists(document):
            try:
                found = DatasetSchema.from_json(read_file(self.fs, document, MAX_SCHEMA_BYTES))
            except MmdataError:
                found = None
            if found is None or [e.get("source") for e in found.history] != [self.schema.history[0]["source"]]:
                raise EditError(
                    f"'{self.url}' is a store already; nothing was written: choose another destination, or delete it"
                )
        try:
            names = [name.rstrip("/").rsplit("/", 1)[-1] for name in self.fs.ls(self.root, detail=False, refresh=True)]
        except (FileNotFoundError, NotADirectoryError):
            return found
        kept = {found.manifest_file, found.stats_file} if found is not None else set()
        leftovers = [name for name in names if _left_by_an_edit(name) and name not in kept]
        others = sorted(name for name in names if name not in (DATASET_FILE, *kept, *leftovers))
        if others:
            shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
            raise EditError(
                f"'{self.url}' holds files ({shown}) that no edit writes; a new store goes to an empty or new folder"
            )
        if leftovers_removed:
            for name in leftovers:
                if not is_writer_record(name):
                    self.fs.rm(join(self.root, name))
        return found


def _left_by_an_edit(name: str) -> bool:
    """Whether a file named `name` in a new store's folder is what an edit writing it leaves when it is interrupted
    (a manifest or statistics of a version, a temporary of one) or the record of the writer holding it."""
    written = temporary_of(name) or (name.removesuffix(".tmp") if name.endswith(".tmp") else None)  # (or older)
    return is_writer_record(name) or version_of_file(written or name) is not None or written == DATASET_FILE


def _origin_values(store: Store) -> list[str]:
    """The `origin` values `store`'s rows hold ("": its own media)."""
    if not store.schema.origins:
        return [""]
    return sorted(pc.unique(pc.cast(store.columns([ORIGIN]).column(ORIGIN), pa.string())).to_pylist())


def _check_same_streams(stores: list[Store]) -> None:
    """Stores merge when they have one layout and the same streams, each described alike."""
    first = stores[0]
    for other in stores[1:]:
        if other.schema.layout != first.schema.layout:
            raise EditError(
                f"'{first.url}' is a {first.schema.layout} store and '{other.url}' a {other.schema.layout} one;"
                " stores merge within one layout: convert one of them again with the other's --layout"
            )
        mine = {s.name: stream_to_dict(s) for s in first.schema.streams}
        theirs = {s.name: stream_to_dict(s) for s in other.schema.streams}
        differing = []
        for name in sorted(set(mine) | set(theirs)):
            if name not in theirs or name not in mine:
                differing.append(f"'{name}' only in '{first.url if name in mine else other.url}'")
            elif mine[name] != theirs[name]:
                fields = sorted(k for k in mine[name] if mine[name][k] != theirs[name].get(k))
                differing.append(f"'{name}' differs in {', '.join(fields)}")
        if differing:
            raise EditError(
                f"'{first.url}' and '{other.url}' cannot be merged, their streams differ: {'; '.join(differing)}."
                " Remove a stream with `mmdata edit STORE remove-stream NAME`, or convert alike"
            )


def _union_schema(schemas: list[pa.Schema]) -> pa.Schema:
    """The columns of every store's manifest, in the first's order, and the origin column."""
    fields: dict[str, pa.Field] = {}
    for schema in schemas:
        for field in schema:
            if field.name in fields and fields[field.name].type != field.type:
                raise EditError(
                    f"manifest column '{field.name}' is {fields[field.name].type} in one store and {field.type} in"
                    " another (one was written by an older mmdata): convert it again, then merge"
                )
            fields.setdefault(field.name, field)
    fields.pop(ORIGIN, None)
    return pa.schema([*fields.values(), pa.field(ORIGIN, pa.string())])


def inside_path(root: str, path: str) -> bool:
    """Whether `path` lies inside `root` (both paths on one filesystem, as `resolve` gives them)."""
    return (path.rstrip("/") + "/").startswith(root.rstrip("/") + "/")


def _location(url: str) -> str:
    """Where `url` is, however it is spelled: a local path with links and `..` resolved, else the filesystem and
    its path."""
    fs, root = resolve(url)
    if isinstance(fs, LocalFileSystem):
        return f"file:{os.path.realpath(root)}"
    return f"{fs.protocol}:{posixpath.normpath(root)}"


def _hashed(numbers: np.ndarray, seed: int) -> np.ndarray:
    """A 64-bit mix (SplitMix64's finaliser) of each of `numbers` with `seed`: the same on every machine and numpy."""
    with np.errstate(over="ignore"):
        z = numbers * _MIX + np.uint64(seed) * np.uint64(0xBF58476D1CE4E5B9) + _MIX
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))
