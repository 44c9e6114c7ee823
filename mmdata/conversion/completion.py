"""The last steps of every conversion and append, whatever engine encoded it: the manifest, then the
statistics (read through the new version before it is published), then `dataset.json`, which publishes
the version in one rename, then the partial folder removed."""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

import fsspec
import pyarrow as pa

from mmdata.errors import DestinationError, MmdataError, SourceError
from mmdata.importers.episode import EpisodeSource
from mmdata.moments import Moments
from mmdata.schema import DatasetSchema, Layout, Stream, TextStream
from mmdata.store.dataset import Dataset
from mmdata.store.filesystem import join
from mmdata.store.handle import Store
from mmdata.store.layout import CONVERT_AGAIN, PARTIAL_DIR, give_append_up
from mmdata.store.manifest import write_manifest
from mmdata.store.next_version import NextVersion
from mmdata.store.statistics import compute_stats, write_stats


def complete_store(
    version: NextVersion,
    rows: list[dict[str, Any]],
    schema: DatasetSchema,
    moments: dict[str, Moments],
    source_stats: dict[str, Any] | None,
    previous: DatasetSchema | None = None,
) -> str | None:
    """Write the manifest and statistics files `schema` names (`version`'s own) into the store `version` is the
    next version of, then publish it (`dataset.json` swapped if no other writer published one since: see
    `store.next_version`; `previous`: the version it follows), then remove its partial folder; returns why the
    statistics were not written, if so. Until then a reader sees the version before, whole."""
    fs, root, url = version.hold.fs, version.hold.root, version.hold.url
    try:
        write_manifest(rows, schema.streams, join(root, schema.manifest_file), fs)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        restart = give_append_up(PARTIAL_DIR) if schema.history else CONVERT_AGAIN
        raise DestinationError(
            f"'{url}': the manifest rows saved by the interrupted run are malformed ({exc}); {restart}"
        ) from exc
    stats_problem = None
    try:
        dataset = Dataset(Store(url, schema=schema))
        figures = compute_stats(dataset, moments=moments)
        write_stats(dataset, {**figures, **(source_stats or {})})
    except (MmdataError, OSError, ValueError, MemoryError) as exc:
        why = str(exc) or type(exc).__name__
        stats_problem = f"normalization statistics were not written ({why}); run `mmdata stats {url}` to compute them"
    version.publish(schema, previous)
    if fs.exists(join(root, PARTIAL_DIR)):  # (an append into object storage keeps its state in its staging)
        fs.rm(join(root, PARTIAL_DIR), recursive=True)
    return stats_problem


def store_schema(
    layout: Layout, streams: list[Stream], rows: list[dict[str, Any]], created: dict[str, Any], url: str
) -> DatasetSchema:
    """The schema of a finished conversion; SourceError when no episode could be converted."""
    require_rows(rows, created["skipped_episodes"], url)
    return DatasetSchema(layout=layout, streams=[TextStream(), *streams], num_episodes=len(rows), created=created)


def require_rows(rows: list[dict[str, Any]], skipped: list[dict[str, str]], url: str) -> None:
    """SourceError when a conversion or an append kept no episode, with the first skipped one's error."""
    if not rows:
        first = f"; the first: {skipped[0]['error']}" if skipped else ""
        raise SourceError.for_source(
            url, None, f"no episode could be converted ({len(skipped)} skipped{first})", "fix the inputs"
        )


def creation_info(
    video: Any, layout: Layout, shard_bytes: int, sources: list[EpisodeSource], skipped: list
) -> dict[str, Any]:
    """`dataset.json`'s record of how the store was made (no times or hosts: equal inputs, equal stores)."""
    from mmdata.version import __version__

    return {
        "tool": f"mmdata {__version__}",
        "video": asdict(video),
        "shard_bytes": shard_bytes if layout == "wds" else None,
        "source_episodes": len(sources),
        "skipped_episodes": skipped,
        "checksum": "xxh64",
    }


def source_bytes(sources: list[EpisodeSource]) -> int:
    """The bytes of the files the episodes' streams read (videos, audio, data files, logs), each once; the
    source's metadata files (meta.json, info.json, episode tables) are not counted."""
    paths = {s.path for e in sources for s in (*e.cameras, *e.audio, *e.lowdim)}
    return sum(os.path.getsize(p) for p in paths if os.path.exists(p))


def store_bytes(fs: fsspec.AbstractFileSystem, root: str) -> int:
    """The bytes of every file of the store."""
    return int(sum(fs.du(root, total=False).values())) if fs.exists(root) else 0
