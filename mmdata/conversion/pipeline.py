"""`convert`: encode episodes in parallel, write them in order, finish the store atomically.

A store is complete only when `dataset.json` exists; it is written last. Until then the
destination holds `.mmdata-partial/`, from which `resume=True` continues. Each worker also
returns the moments of its episode's low-dim streams; merged exactly (and kept in the resume
checkpoint), they become the store's `stats.json` with the percentiles and camera figures
computed once the store is complete (see `mmdata.store.statistics`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Protocol

from fsspec.implementations.local import LocalFileSystem
from tqdm import tqdm

from mmdata.conversion.append import (
    AppendBase,
    append_options,
    append_state,
    appended_schema,
    check_declared_streams,
    merged_moments,
    open_base,
)
from mmdata.conversion.completion import complete_store, require_rows, source_bytes, store_bytes, store_schema
from mmdata.conversion.convert_options import ConversionReport, ConvertOptions
from mmdata.conversion.destination import (
    check_converted_sources,
    check_remote_destination,
    destination_failure,
    prepare_append,
    prepare_destination,
    refuse_overlap,
)
from mmdata.conversion.encode import EncodeOptions, encode_job, worker_crashed
from mmdata.conversion.ledger import ConversionLedger
from mmdata.conversion.workers import WorkerPool, spawned_pool
from mmdata.errors import ConcurrentWriteError, OptionError, SourceError
from mmdata.importers.episode import EpisodeSource, source_files
from mmdata.schema import Stream
from mmdata.store.encoded import EncodedEpisode
from mmdata.store.filesystem import join, resolve
from mmdata.store.handle import open_store
from mmdata.store.hold import StoreHold, hold_store
from mmdata.store.layout import DATASET_FILE, PARTIAL_DIR
from mmdata.store.staging import default_staging, is_remote, publish, remove_staging, upload_new_files
from mmdata.store.versions import NextVersion


class StoreWriter(Protocol):
    """What a layout's writer offers the pipeline; checkpoints are opaque to the writer."""

    def restore(self) -> dict[str, Any] | None:
        """Drop partial output; return the checkpoint of the last durable episode, if any."""

    def add(self, episode: EncodedEpisode, index: int, checkpoint: dict[str, Any]) -> None:
        """Append an episode; `checkpoint` is the state to resume from once it is durable."""

    def finish(self, checkpoint: dict[str, Any], streams: list[Stream]) -> list[dict[str, Any]]:
        """Make everything durable; return the manifest rows in episode order."""

    def durable(self) -> bool:
        """Whether an episode is durable: a resume would start after it."""

    def discard(self) -> None:
        """Remove what was written that is not durable (an open shard); the partial folder is the caller's."""


def convert(
    sources: list[EpisodeSource],
    destination: str | os.PathLike,
    options: ConvertOptions,
    source_root: str | os.PathLike | None = None,
    source_stats: dict[str, Any] | None = None,
) -> ConversionReport:
    """Convert `sources` into a store at `destination`: a local folder, or an object-store URL
    (`s3://bucket/store`: made in a local staging folder, then uploaded with `dataset.json` last;
    see `mmdata.store.staging`).

    `source_stats` are statistics the source format ships (LeRobot's `meta/stats.json`): kept in
    the store's `stats.json` beside the recomputed ones, under their own key.

    The destination may not hold any of the source files, nor lie inside `source_root` (the
    folder or file they were discovered in): nothing in the source is ever deleted or written.
    A write that fails (disk full, read-only, no permission) is a DestinationError; whatever
    was completed before stays, and the same call with `resume=True` continues from it.
    """
    if options.engine == "ray":
        from mmdata.conversion.ray_engine import convert_on_ray

        root = None if source_root is None else os.fspath(source_root)
        return convert_on_ray(sources, str(destination), options, root, source_stats)
    if is_remote(destination):
        return _convert_to_object_storage(sources, str(destination), options, source_root, source_stats)
    root = Path(destination)
    refuse_overlap(root, sources, source_root)
    try:
        return _convert(sources, root, options, source_stats, source_root)
    except OSError as exc:
        raise destination_failure(root, exc) from exc


def _convert_to_object_storage(
    sources: list[EpisodeSource],
    url: str,
    options: ConvertOptions,
    source_root: str | os.PathLike | None,
    source_stats: dict[str, Any] | None,
) -> ConversionReport:
    local = Path(options.staging) if options.staging else default_staging(url)
    fs, root = resolve(url)
    if options.append and fs.exists(join(root, DATASET_FILE)):
        writer = f"mmdata convert --append into {url}"
        with hold_store(local, writer), hold_store(url, writer, lease=True) as hold:
            return _append_locked(sources, hold, local, options, str(source_root or ""))
    check_remote_destination(fs, root, url, options.resume, options.overwrite)
    if options.resume and (local / DATASET_FILE).exists():
        report = ConversionReport(str(local), options.layout, 0, resumed_at=len(sources))  # staged whole before
    else:
        report = convert(sources, local, dataclasses.replace(options, staging=None), source_root, source_stats)
    started = time.perf_counter()
    publish(local, url, options.overwrite, options.progress)
    report.seconds += time.perf_counter() - started
    report.destination = url
    if not report.converted:
        report.converted = open_store(str(local)).schema.num_episodes
    remove_staging(local)
    return report


def _convert(
    sources: list[EpisodeSource],
    root: Path,
    options: ConvertOptions,
    source_stats: dict[str, Any] | None,
    source_root: str | os.PathLike | None = None,
) -> ConversionReport:
    appending = options.append and (root / DATASET_FILE).exists()
    with hold_store(root, f"mmdata convert {'--append ' if appending else ''}into {root}") as hold:
        if appending:
            return _append_locked(sources, hold, root, options, str(source_root or ""))
        return _convert_locked(sources, hold, options, source_stats)


def _convert_locked(
    sources: list[EpisodeSource], hold: StoreHold, options: ConvertOptions, source_stats: dict[str, Any] | None
) -> ConversionReport:
    started = time.perf_counter()
    root = Path(hold.root)
    prepare_destination(root, options.fingerprint(sources), options.resume, options.overwrite)
    version = NextVersion(hold)  # (after --overwrite emptied the folder)
    writer = _store_writer(options.layout, root, options.shard_bytes)
    with _workers(options) as pool:
        ledger = ConversionLedger(writer.restore(), len(sources), root)
        ledger = _run_episodes(sources, root, options, writer, ledger, pool)
        rows = writer.finish(ledger.checkpoint(), ledger.registry.streams)
        created = options.creation_info(sources, ledger.skipped)
        schema = store_schema(options.layout, ledger.registry.streams, rows, created, str(root))
        fs = LocalFileSystem()
        with version:
            stats_problem = complete_store(version, rows, schema, ledger.moments, source_stats)
    return ConversionReport(
        destination=str(root),
        layout=options.layout,
        converted=len(rows),
        skipped=ledger.skipped,
        seconds=time.perf_counter() - started,
        input_bytes=source_bytes(sources),
        output_bytes=store_bytes(fs, str(root)),
        resumed_at=ledger.resumed_at,
        stats_problem=stats_problem,
    )


def _append_locked(
    sources: list[EpisodeSource], hold: StoreHold, local: Path, options: ConvertOptions, source: str
) -> ConversionReport:
    """Add `sources` to the complete store `hold` holds: a local folder (`local`), or in object storage with `local`
    its staging folder, where new shards are made and uploaded before the new version is published (see
    `mmdata.conversion.append`)."""
    started = time.perf_counter()
    url = None if hold.local else hold.url
    fs, root = hold.fs, hold.root
    version = NextVersion(hold)
    base = open_base(url or str(local))
    if not options.skip_bad:
        check_declared_streams(base, sources)
    options = append_options(options, base)
    fingerprint = {**options.fingerprint(sources), "append_to": base.fingerprint()}
    prepare_append(local, fingerprint, options.resume)
    version.tag_by(json.dumps(fingerprint, sort_keys=True))  # (a resumed append writes what an uninterrupted one does)
    layout = base.schema.layout
    arrays = url or str(local)
    state = append_state(
        LocalFileSystem(),
        str(local),
        options.resume,
        lambda: _array_lengths(layout, arrays, base),
        lambda: base.first_shard(fs, root),
    )
    if layout == "wds":
        writer: StoreWriter = _store_writer(layout, local, options.shard_bytes, first_shard=state["first_shard"])
    else:
        writer = _store_writer(layout, local, options.shard_bytes, base.rows, state["array_lengths"], arrays_url=url)
    with _workers(options) as pool:
        ledger = ConversionLedger(writer.restore(), len(sources), local, base.streams)
        try:
            ledger = _run_episodes(sources, local, options, writer, ledger, pool, base.first_episode)
        except (SourceError, OptionError):
            _give_up_if_nothing_kept(writer, local)
            raise
        rows = writer.finish(ledger.checkpoint(), ledger.registry.streams)
        require_rows(rows, ledger.skipped, url or root)
        schema = appended_schema(base, ledger.registry.streams, len(rows), source, state["time"], version)
        moments = merged_moments(base, ledger.moments)
        try:
            with version:
                if url and layout == "wds":  # (a Zarr store's new rows were written into its arrays there)
                    upload_new_files(local, url, {row["shard"] for row in rows}, options.progress)
                stats_problem = complete_store(version, [*base.rows, *rows], schema, moments, None, base.schema)
        except ConcurrentWriteError:
            _give_up_after_conflict(writer, local, hold, {row["shard"] for row in rows if layout == "wds"})
            raise
    if url:
        remove_staging(local)
    return ConversionReport(
        destination=url or root,
        layout=layout,
        converted=len(rows),
        skipped=ledger.skipped,
        seconds=time.perf_counter() - started,
        input_bytes=source_bytes(sources),
        output_bytes=store_bytes(fs, root),
        resumed_at=ledger.resumed_at,
        stats_problem=stats_problem,
        first_episode=base.first_episode,
        stats_file=schema.stats_file,
    )


def _run_episodes(
    sources: list[EpisodeSource],
    root: Path,
    options: ConvertOptions,
    writer: StoreWriter,
    ledger: ConversionLedger,
    pool: WorkerPool,
    first_episode: int = 0,
) -> ConversionLedger:
    """Encode the episodes the ledger has not accounted for, in parallel, and write them in source order,
    numbered from `first_episode`."""
    check_converted_sources(root, [s.name for s in sources], [source_files(s) for s in sources], ledger.resumed_at)
    positions = range(ledger.resumed_at, len(sources))
    jobs = ((sources[p], p, options.encode) for p in positions)
    progress = tqdm(
        total=len(sources),
        initial=ledger.resumed_at,
        unit="episode",
        desc=f"{'append' if options.append else 'convert'} -> {options.layout}",
        disable=not options.progress,
        dynamic_ncols=True,
    )
    with progress:
        for position, outcome in _ordered(encode_job, jobs, pool):
            index = ledger.accept(position, sources[position].name, outcome, options.skip_bad)
            if index is not None:
                writer.add(outcome, first_episode + index, ledger.checkpoint())
            progress.update(1)
    return ledger


def _crashed(job: tuple[EpisodeSource, int, EncodeOptions]) -> SourceError:
    return worker_crashed(job[0].name)


def _ordered(function, jobs, pool: WorkerPool) -> Iterator[tuple[int, Any]]:
    """Results of `function(job)` in job order, with at most 2 x workers jobs in flight in `pool`.

    A worker that dies (a crash in native code) breaks the pool: the jobs that were in flight are
    then run again one at a time, each in a process of its own, so the one that crashes is named
    (as its episode's SourceError) and the others are converted; the rest continue in a new pool.
    """
    if pool.executor is None:
        for job in jobs:
            yield job[1], function(job)
        return
    jobs = iter(jobs)
    in_flight: deque = deque()
    try:
        while True:
            while len(in_flight) < 2 * pool.workers and (job := next(jobs, None)) is not None:
                in_flight.append((job, pool.executor.submit(function, job)))
            if not in_flight:
                return
            job, future = in_flight.popleft()
            try:
                result = future.result()
            except BrokenProcessPool:
                pool.restart()
                retried = [job, *(waiting for waiting, _ in in_flight)]
                in_flight.clear()
                for waiting in retried:
                    yield waiting[1], _run_alone(function, waiting)
                continue
            yield job[1], result
    finally:
        for _, future in in_flight:
            future.cancel()


def _run_alone(function, job) -> Any:
    with spawned_pool(1) as pool:
        try:
            return pool.submit(function, job).result()
        except BrokenProcessPool:
            return _crashed(job)


def _workers(options: ConvertOptions) -> WorkerPool:
    return WorkerPool(options.workers if options.workers else (os.cpu_count() or 1))


def _give_up_if_nothing_kept(writer: StoreWriter, local: Path) -> None:
    """An append refused by its input before any episode was durable has nothing to resume: its partial folder is
    removed, so that it does not refuse the next append as an interrupted one (the store was never touched)."""
    if not writer.durable():
        writer.discard()
        shutil.rmtree(local / PARTIAL_DIR, ignore_errors=True)


def _give_up_after_conflict(writer: StoreWriter, local: Path, hold: StoreHold, shards: set[str]) -> None:
    """An append that another writer's version overtook gives itself up, so that running it again appends to that
    version: its partial folder removed, and its new shards (in object storage: uploaded, each created by it
    alone; locally: linked into the store, no version naming them)."""
    writer.discard()
    shutil.rmtree(local / PARTIAL_DIR, ignore_errors=True)
    for shard in sorted(shards):
        with contextlib.suppress(OSError):
            hold.fs.rm(join(hold.root, shard))
        with contextlib.suppress(OSError):
            (local / shard).unlink()


def _store_writer(
    layout: str,
    root,
    shard_bytes: int,
    earlier_rows: list[dict[str, Any]] | None = None,
    array_lengths: dict[str, int] | None = None,
    first_shard: int = 0,
    arrays_url: str | None = None,
) -> StoreWriter:
    """The writer of a layout (an append's, given what the store holds), imported when used: a WebDataset
    conversion does not need zarr installed."""
    if layout == "wds":
        from mmdata.store.wds_writer import WdsWriter

        return WdsWriter(root, shard_bytes, first_shard)
    from mmdata.store.zarr_writer import ZarrWriter

    return ZarrWriter(root, earlier_rows, array_lengths, arrays_url)


def _array_lengths(layout: str, root: str, base: AppendBase) -> dict[str, int]:
    if layout == "wds":
        return {}
    from mmdata.store.zarr_writer import existing_lengths

    return existing_lengths(root, base.streams)
