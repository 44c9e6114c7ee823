"""The last steps of every conversion and append, whatever engine encoded it: its manifest rows and statistics
written as the store's next version (`store.versions`), and what `dataset.json` records of it."""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

import fsspec
import pyarrow as pa

from mmdata.errors import DestinationError, SourceError
from mmdata.importers.episode import EpisodeSource
from mmdata.moments import Moments
from mmdata.schema import DatasetSchema, Layout, Stream, TextStream
from mmdata.store.dataset import Dataset
from mmdata.store.layout import CONVERT_AGAIN, PARTIAL_DIR, give_append_up
from mmdata.store.manifest import write_manifest
from mmdata.store.statistics import compute_stats
from mmdata.store.versions import NextVersion, complete_version


def complete_store(
    version: NextVersion,
    rows: list[dict[str, Any]],
    schema: DatasetSchema,
    moments: dict[str, Moments],
    source_stats: dict[str, Any] | None,
    previous: DatasetSchema | None = None,
) -> str | None:
    """Write a conversion's or an append's manifest `rows` and statistics (from the encoders' `moments`, with the
    source's own `source_stats`) as the next version `version` publishes (`store.versions.complete_version`);
    returns why the statistics were not written, if so."""
    url = version.hold.url

    def write_rows(path: str) -> None:
        try:
            write_manifest(rows, schema.streams, path, version.hold.fs)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            restart = give_append_up(PARTIAL_DIR) if schema.history else CONVERT_AGAIN
            raise DestinationError(
                f"'{url}': the manifest rows saved by the interrupted run are malformed ({exc}); {restart}"
            ) from exc

    def statistics(dataset: Dataset) -> dict[str, Any]:
        return {**compute_stats(dataset, moments=moments), **(source_stats or {})}

    return complete_version(version, schema, write_rows, statistics, previous, statistics_optional=True)


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
    paths = {s.path for e in sources for s in e.streams}
    return sum(os.path.getsize(p) for p in paths if os.path.exists(p))


def store_bytes(fs: fsspec.AbstractFileSystem, root: str) -> int:
    """The bytes of every file of the store."""
    return int(sum(fs.du(root, total=False).values())) if fs.exists(root) else 0
