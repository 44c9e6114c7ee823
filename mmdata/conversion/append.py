"""`convert --append`: add episodes to a complete store without changing anything a reader of it uses.

New episodes go into new shards (WebDataset) or new rows after the arrays' own (Zarr), numbered after the
store's episodes. The new version's manifest and statistics are written under new names
(`episodes-000001.parquet`, `stats-000001.json`), then `dataset.json`, which names them and lists the
append in its history, is replaced in one rename: a reader sees the store before the append or after it,
whole, and one that opened it before keeps reading its episodes. An interrupted append keeps its state in
`.mmdata-partial/` (the store itself stays as it was) and continues with `--resume`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fsspec

from mmdata.checks import as_int, parse_json
from mmdata.codecs.video_encode import VideoEncoding
from mmdata.conversion.convert_options import ConvertOptions
from mmdata.errors import DestinationError, MmdataError, SourceError
from mmdata.importers.episode import EpisodeSource
from mmdata.moments import Moments
from mmdata.schema import DatasetSchema, Stream, TextStream
from mmdata.store.filesystem import join, write_text_atomically
from mmdata.store.handle import Store, open_store
from mmdata.store.layout import APPEND_FILE, PARTIAL_DIR, SHARDS_DIR, give_append_up
from mmdata.store.statistics import read_stats
from mmdata.store.versions import NextVersion, utc_now
from mmdata.store.wds_writer import shard_number


@dataclass(frozen=True)
class AppendBase:
    """The store an append adds to, as it was when the append began."""

    url: str
    schema: DatasetSchema
    rows: list[dict[str, Any]]
    moments: dict[str, Moments] | None  # exact, from its statistics; None when they do not hold them

    @property
    def first_episode(self) -> int:
        return len(self.rows)

    def first_shard(self, fs: fsspec.AbstractFileSystem, root: str) -> int:
        """The number of the first new WebDataset shard: after every shard the store's rows name and every shard
        file in its folder (one no row names, left by an append that was given up, is never written over)."""
        names = [row.get("shard") or "" for row in self.rows]
        with contextlib.suppress(FileNotFoundError):  # (an object store has no empty folders)
            names += fs.ls(join(root, SHARDS_DIR), detail=False, refresh=True)
        numbers = [number for name in names if (number := shard_number(str(name))) is not None]
        return max(numbers, default=-1) + 1

    @property
    def streams(self) -> list[Stream]:
        """The store's streams an episode must match (the task text is every episode's)."""
        return [s for s in self.schema.streams if not isinstance(s, TextStream)]

    @property
    def video(self) -> VideoEncoding:
        """How the store's cameras were encoded: new episodes are encoded the same way."""
        recorded = self.schema.created.get("video")
        try:
            return VideoEncoding(**recorded) if isinstance(recorded, dict) else VideoEncoding()
        except (TypeError, MmdataError) as exc:
            raise DestinationError(
                f"'{self.url}': dataset.json's record of the video encoding cannot be read ({exc}); the store cannot"
                " be appended to: convert the episodes into a store of their own"
            ) from exc

    def fingerprint(self) -> dict[str, Any]:
        """What an interrupted append must find again to resume: the same store version."""
        return {"version": self.schema.version, "episodes": self.first_episode}


def open_base(url: str) -> AppendBase:
    """The complete store at `url`, to append to; DestinationError when it is not one."""
    try:
        store = open_store(url)
    except MmdataError as exc:
        raise DestinationError(f"cannot append to '{url}': {exc}") from exc
    if store.schema.origins:
        raise DestinationError(
            f"cannot append to '{url}': it was split or merged from other stores ({', '.join(store.schema.origins)})"
            " and holds no media of its own; convert the new episodes into a store of their own, then merge the"
            " stores with `mmdata edit ... merge`"
        )
    if store.schema.stream_origins:
        added = ", ".join(f"'{name}' from {origin}" for name, origin in store.schema.stream_origins.items())
        raise DestinationError(
            f"cannot append to '{url}': streams were added to it from other stores ({added}), which hold no new"
            f" episode's media; compact it first (`mmdata edit {url} compact --into NEW`), then append to NEW"
        )
    return AppendBase(url, store.schema, store.table.to_pylist(), _saved_moments(store))


def _saved_moments(store: Store) -> dict[str, Moments] | None:
    try:
        saved = read_stats(store).get("moments")
        if not isinstance(saved, dict):
            return None
        return {str(name): Moments.from_json(figures) for name, figures in saved.items()}
    except (MmdataError, ValueError):
        return None  # the statistics are recomputed from the values instead


def check_declared_streams(base: AppendBase, sources: list[EpisodeSource]) -> None:
    """Refuse, before anything is encoded or written, an episode whose streams are not the store's by name
    and kind. Sizes, rates and codecs are known once an episode is read; the stream registry checks those."""
    expected = {s.name: s.kind for s in base.streams}
    for source in sources:
        if source.problem is not None or source.deferred is not None:
            continue  # known when it is read, and reported then
        found = {c.name: "video" for c in source.cameras}
        found |= {a.name: "audio" for a in source.audio}
        found |= {v.name: "lowdim" for v in source.lowdim}
        if found == expected:
            continue
        missing = sorted(set(expected) - set(found))
        extra = sorted(set(found) - set(expected))
        kinds = sorted(n for n in set(found) & set(expected) if found[n] != expected[n])
        parts = [f"missing {missing}" if missing else "", f"not in the store {extra}" if extra else ""]
        parts.append(f"of another kind {kinds}" if kinds else "")
        raise SourceError(
            source.name,
            None,
            f"its streams are not the store's ({'; '.join(p for p in parts if p)}; the store has {sorted(expected)})",
            f"append episodes with the streams of '{base.url}' (see `mmdata inspect`), or convert them into a"
            " store of their own",
        )


def appended_schema(
    base: AppendBase, streams: list[Stream], new_rows: int, source: str, started: str, version: NextVersion
) -> DatasetSchema:
    """The schema of the store after the append: its files named for the new version by its writer (`version`),
    the append in its history."""
    manifest_file, stats_file = version.file_names(base.schema.version + 1)
    entry = {"time": started, "episodes": new_rows, "first_episode": base.first_episode, "source": source}
    return DatasetSchema(
        layout=base.schema.layout,
        streams=[TextStream(), *streams],
        num_episodes=base.first_episode + new_rows,
        created=base.schema.created,
        manifest_file=manifest_file,
        stats_file=stats_file,
        history=[*base.schema.history, entry],
    )


def merged_moments(base: AppendBase, added: dict[str, Moments]) -> dict[str, Moments]:
    """The moments of every low-dim stream over old and new episodes, merged exactly; none when the old ones
    are not known (the statistics then read every value again)."""
    if base.moments is None or set(base.moments) != set(added):
        return {}
    return {name: base.moments[name].merge(figures) for name, figures in added.items()}


def append_state(
    fs: fsspec.AbstractFileSystem,
    root: str,
    resume: bool,
    array_lengths: Callable[[], dict[str, int]],
    first_shard: Callable[[], int],
) -> dict[str, Any]:
    """When this append began (ISO 8601, UTC), for a Zarr store each array's length then, and for a WebDataset
    store the number of its first new shard: saved in the partial folder when it begins, so that a resumed append
    keeps them (and writes its rows and shards where the interrupted one did, its own shards counted as its own).
    `SOURCE_DATE_EPOCH` (the reproducible-builds convention) sets the time."""
    path = join(root, f"{PARTIAL_DIR}/{APPEND_FILE}")
    if resume and fs.exists(path):
        damaged = DestinationError(f"{path} is damaged; {give_append_up(PARTIAL_DIR)}")
        try:
            saved = parse_json(fs.cat_file(path))
        except ValueError as exc:
            raise damaged from exc
        lengths = saved.get("array_lengths") if isinstance(saved, dict) else None
        if not isinstance(lengths, dict) or not isinstance(saved.get("time"), str):
            raise damaged
        try:
            for count in [*lengths.values(), saved.get("first_shard")]:
                as_int(count, "a saved count", 0)
        except ValueError as exc:
            raise damaged from exc
        return saved
    state = {
        "time": utc_now(),
        "array_lengths": array_lengths(),
        "first_shard": first_shard(),
    }
    write_text_atomically(path, json.dumps(state), fs)
    return state


def append_options(options: ConvertOptions, base: AppendBase) -> ConvertOptions:
    """`options` for appending to `base`: its layout, its video encoding and its shard size, so the new
    episodes are stored as its own are."""
    shard_bytes = base.schema.created.get("shard_bytes")
    return dataclasses.replace(
        options,
        layout=base.schema.layout,
        encode=dataclasses.replace(options.encode, video=base.video),
        shard_bytes=shard_bytes if isinstance(shard_bytes, int) and shard_bytes > 0 else options.shard_bytes,
    )
