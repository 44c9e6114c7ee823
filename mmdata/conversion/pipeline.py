"""`convert`: encode episodes in parallel, write them in order, finish the store atomically.

A store is complete only when `dataset.json` exists; it is written last. Until then the
destination holds `.mmdata-partial/`, from which `resume=True` continues.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tqdm import tqdm

from mmdata.conversion.encode import EncodedEpisode, EncodeOptions, encode_episode
from mmdata.conversion.registry import StreamRegistry
from mmdata.errors import DestinationError, SourceError
from mmdata.schema import DatasetSchema, Layout, Stream, TextStream
from mmdata.sharding.layout import DATASET_FILE, MANIFEST_FILE, PARTIAL_DIR
from mmdata.sharding.manifest import write_manifest
from mmdata.sources.episode import EpisodeSource

OPTIONS_FILE = "options.json"


class StoreWriter(Protocol):
    """What a layout's writer offers the pipeline; checkpoints are opaque to the writer."""

    def restore(self) -> dict[str, Any] | None:
        """Drop partial output; return the checkpoint of the last durable episode, if any."""

    def add(self, episode: EncodedEpisode, index: int, checkpoint: dict[str, Any]) -> None:
        """Append an episode; `checkpoint` is the state to resume from once it is durable."""

    def finish(self, checkpoint: dict[str, Any], streams: list[Stream]) -> list[dict[str, Any]]:
        """Make everything durable; return the manifest rows in episode order."""


@dataclass(frozen=True)
class ConvertOptions:
    """Everything that shapes the output; `skip_bad`, `workers` and `progress` do not."""

    layout: Layout = "wds"
    encode: EncodeOptions = EncodeOptions()
    shard_bytes: int = 1 << 30
    workers: int | None = None
    skip_bad: bool = False
    resume: bool = False
    overwrite: bool = False
    progress: bool = True

    def fingerprint(self, sources: list[EpisodeSource]) -> dict[str, Any]:
        return {
            "layout": self.layout,
            "encode": asdict(self.encode),
            "shard_bytes": self.shard_bytes if self.layout == "wds" else None,
            "episodes": [s.name for s in sources],
        }


@dataclass
class ConversionReport:
    destination: str
    layout: str
    converted: int
    skipped: list[dict[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    input_bytes: int = 0
    output_bytes: int = 0
    resumed_at: int = 0


def convert(sources: list[EpisodeSource], destination: str | os.PathLike, options: ConvertOptions) -> ConversionReport:
    """Convert `sources` into a store at `destination` (a local folder)."""
    started = time.perf_counter()
    root = Path(destination)
    _prepare_destination(root, sources, options)
    writer = _store_writer(options.layout, root, options.shard_bytes)
    checkpoint = writer.restore() or {"next_position": 0, "next_index": 0, "skipped": [], "streams": []}
    resumed_at = checkpoint["next_position"]
    registry = StreamRegistry(checkpoint["streams"])
    skipped = list(checkpoint["skipped"])
    next_index = checkpoint["next_index"]

    positions = range(resumed_at, len(sources))
    jobs = ((sources[p], p, options.encode) for p in positions)
    progress = tqdm(
        total=len(sources),
        initial=resumed_at,
        unit="episode",
        desc=f"convert -> {options.layout}",
        disable=not options.progress,
        dynamic_ncols=True,
    )
    with progress:
        for position, outcome in _ordered(_encode_job, jobs, _worker_count(options.workers)):
            if isinstance(outcome, EncodedEpisode):
                try:
                    registry.check_and_add(outcome)
                except SourceError as problem:
                    outcome = problem
            if isinstance(outcome, SourceError):
                if not options.skip_bad:
                    raise outcome
                skipped.append({"episode": sources[position].name, "error": str(outcome)})
            else:
                next_index += 1
                checkpoint = _checkpoint(position + 1, next_index, skipped, registry)
                writer.add(outcome, next_index - 1, checkpoint)
            progress.update(1)

    final = _checkpoint(len(sources), next_index, skipped, registry)
    rows = writer.finish(final, registry.streams)
    if not rows:
        raise SourceError(
            str(root),
            None,
            f"no episode could be converted ({len(skipped)} skipped)",
            "fix the errors listed above",
        )
    schema = DatasetSchema(
        layout=options.layout,
        streams=[TextStream(), *registry.streams],
        num_episodes=len(rows),
        created=_creation_info(options, sources, skipped),
    )
    write_manifest(rows, schema.streams, str(root / MANIFEST_FILE))
    _write_atomically(root / DATASET_FILE, schema.to_json())
    shutil.rmtree(root / PARTIAL_DIR)
    return ConversionReport(
        destination=str(root),
        layout=options.layout,
        converted=len(rows),
        skipped=skipped,
        seconds=time.perf_counter() - started,
        input_bytes=_source_bytes(sources),
        output_bytes=sum(p.stat().st_size for p in root.rglob("*") if p.is_file()),
        resumed_at=resumed_at,
    )


def _prepare_destination(root: Path, sources: list[EpisodeSource], options: ConvertOptions) -> None:
    fingerprint = options.fingerprint(sources)
    options_path = root / PARTIAL_DIR / OPTIONS_FILE
    if root.exists() and not root.is_dir():
        raise DestinationError(f"destination '{root}' exists and is not a folder")
    if root.exists() and any(root.iterdir()):
        if options.overwrite:
            shutil.rmtree(root)
        elif options.resume:
            if (root / DATASET_FILE).exists():
                raise DestinationError(
                    f"'{root}' is already a complete store; nothing to resume (pass --overwrite to convert again)"
                )
            if not options_path.exists():
                raise DestinationError(
                    f"'{root}' is not an interrupted mmdata conversion (no {PARTIAL_DIR}/{OPTIONS_FILE});"
                    " choose an empty destination or pass --overwrite"
                )
            saved = json.loads(options_path.read_text())
            if saved != fingerprint:
                changed = sorted(k for k in fingerprint if saved.get(k) != fingerprint[k])
                raise DestinationError(
                    f"cannot resume '{root}': {', '.join(changed)} changed since the interrupted run;"
                    " resume with the same source and options, or pass --overwrite"
                )
            return
        else:
            raise DestinationError(
                f"destination '{root}' is not empty; pass --resume to continue an interrupted"
                " conversion or --overwrite to replace it"
            )
    (root / PARTIAL_DIR).mkdir(parents=True, exist_ok=True)
    _write_atomically(options_path, json.dumps(fingerprint, indent=1))


def _encode_job(job: tuple[EpisodeSource, int, EncodeOptions]) -> EncodedEpisode | SourceError:
    source, position, options = job
    try:
        return encode_episode(source, position, options)
    except SourceError as problem:
        return problem


def _ordered(function, jobs, workers: int) -> Iterator[tuple[int, Any]]:
    """Results of `function(job)` in job order, with at most 2 x workers jobs in flight."""
    if workers <= 1:
        for job in jobs:
            yield job[1], function(job)
        return
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    try:
        in_flight: deque = deque()
        jobs = iter(jobs)
        for job in jobs:
            in_flight.append((job[1], pool.submit(function, job)))
            if len(in_flight) >= 2 * workers:
                break
        while in_flight:
            position, future = in_flight.popleft()
            result = future.result()
            job = next(jobs, None)
            if job is not None:
                in_flight.append((job[1], pool.submit(function, job)))
            yield position, result
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _worker_count(requested: int | None) -> int:
    return requested if requested else (os.cpu_count() or 1)


def _checkpoint(next_position: int, next_index: int, skipped: list, registry: StreamRegistry) -> dict[str, Any]:
    return {
        "next_position": next_position,
        "next_index": next_index,
        "skipped": list(skipped),
        "streams": registry.to_json(),
    }


def _creation_info(options: ConvertOptions, sources: list[EpisodeSource], skipped: list) -> dict[str, Any]:
    from mmdata import __version__

    return {
        "tool": f"mmdata {__version__}",
        "video": asdict(options.encode.video),
        "shard_bytes": options.shard_bytes if options.layout == "wds" else None,
        "source_episodes": len(sources),
        "skipped_episodes": skipped,
        "checksum": "xxh64",
    }


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def _source_bytes(sources: list[EpisodeSource]) -> int:
    paths = {s.path for e in sources for s in (*e.cameras, *e.audio, *e.lowdim)}
    return sum(os.path.getsize(p) for p in paths if os.path.exists(p))


def _store_writer(layout: str, root, shard_bytes: int) -> StoreWriter:
    """The writer of a layout, imported when used: a WebDataset conversion does not need zarr installed."""
    if layout == "wds":
        from mmdata.sharding.wds_writer import WdsWriter

        return WdsWriter(root, shard_bytes)
    from mmdata.sharding.zarr_writer import ZarrWriter

    return ZarrWriter(root)
