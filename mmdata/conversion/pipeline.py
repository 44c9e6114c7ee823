"""`convert`: encode episodes in parallel, write them in order, finish the store atomically.

A store is complete only when `dataset.json` exists; it is written last. Until then the
destination holds `.mmdata-partial/`, from which `resume=True` continues. Each worker also
returns the moments of its episode's low-dim streams; merged exactly (and kept in the resume
checkpoint), they become the store's `stats.json` with the percentiles and camera figures
computed once the store is complete (see `mmdata.stats`).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import json
import multiprocessing
import os
import shutil
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
from tqdm import tqdm

from mmdata.checks import as_int, parse_json
from mmdata.conversion.encode import EncodedEpisode, EncodeOptions, encode_episode
from mmdata.conversion.publish import check_remote_destination, default_staging, is_remote, publish, remove_staging
from mmdata.conversion.registry import StreamRegistry
from mmdata.dataset import open_dataset
from mmdata.errors import DestinationError, MmdataError, SourceError
from mmdata.moments import Moments
from mmdata.schema import DatasetSchema, Layout, Stream, TextStream
from mmdata.sharding.filesystem import write_text_atomically
from mmdata.sharding.layout import DATASET_FILE, MANIFEST_FILE, PARTIAL_DIR
from mmdata.sharding.manifest import write_manifest
from mmdata.sources.episode import EpisodeSource
from mmdata.stats import compute_stats, write_stats

OPTIONS_FILE = "options.json"
PR_SET_PDEATHSIG = 1


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
    """Everything that shapes the output; `skip_bad`, `workers`, `progress` and `staging` (the local
    folder a conversion into object storage is made in) do not."""

    layout: Layout = "wds"
    encode: EncodeOptions = EncodeOptions()
    shard_bytes: int = 1 << 30
    workers: int | None = None
    skip_bad: bool = False
    resume: bool = False
    overwrite: bool = False
    progress: bool = True
    staging: str | None = None

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
    stats_problem: str | None = None


def convert(
    sources: list[EpisodeSource],
    destination: str | os.PathLike,
    options: ConvertOptions,
    source_root: str | os.PathLike | None = None,
    source_stats: dict[str, Any] | None = None,
) -> ConversionReport:
    """Convert `sources` into a store at `destination`: a local folder, or an object-store URL
    (`s3://bucket/store`: made in a local staging folder, then uploaded with `dataset.json` last;
    see `mmdata.conversion.publish`).

    `source_stats` are statistics the source format ships (LeRobot's `meta/stats.json`): kept in
    the store's `stats.json` beside the recomputed ones, under their own key.

    The destination may not hold any of the source files, nor lie inside `source_root` (the
    folder or file they were discovered in): nothing in the source is ever deleted or written.
    A write that fails (disk full, read-only, no permission) is a DestinationError; whatever
    was completed before stays, and the same call with `resume=True` continues from it.
    """
    if is_remote(destination):
        return _convert_to_object_storage(sources, str(destination), options, source_root, source_stats)
    root = Path(destination)
    _refuse_overlap(root, sources, source_root)
    try:
        return _convert(sources, root, options, source_stats)
    except OSError as exc:
        raise _destination_failure(root, exc) from exc


def _convert_to_object_storage(
    sources: list[EpisodeSource],
    url: str,
    options: ConvertOptions,
    source_root: str | os.PathLike | None,
    source_stats: dict[str, Any] | None,
) -> ConversionReport:
    check_remote_destination(url, options.resume, options.overwrite)
    local = Path(options.staging) if options.staging else default_staging(url)
    if options.resume and (local / DATASET_FILE).exists():
        report = ConversionReport(str(local), options.layout, 0, resumed_at=len(sources))  # staged whole before
    else:
        report = convert(sources, local, dataclasses.replace(options, staging=None), source_root, source_stats)
    started = time.perf_counter()
    publish(local, url, options.overwrite, options.progress)
    report.seconds += time.perf_counter() - started
    report.destination = url
    if not report.converted:
        report.converted = open_dataset(str(local)).schema.num_episodes
    remove_staging(local)
    return report


def _convert(
    sources: list[EpisodeSource], root: Path, options: ConvertOptions, source_stats: dict[str, Any] | None
) -> ConversionReport:
    started = time.perf_counter()
    _prepare_destination(root, sources, options)
    writer = _store_writer(options.layout, root, options.shard_bytes)
    checkpoint = writer.restore() or {"next_position": 0, "next_index": 0, "skipped": [], "streams": []}
    resumed_at, next_index, skipped, registry = _restored(checkpoint, len(sources), root)
    moments = _restored_moments(checkpoint, root)

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
                for name, figures in outcome.moments.items():
                    moments[name] = moments.get(name, Moments()).merge(figures)
                checkpoint = _checkpoint(position + 1, next_index, skipped, registry, moments)
                writer.add(outcome, next_index - 1, checkpoint)
            progress.update(1)

    final = _checkpoint(len(sources), next_index, skipped, registry, moments)
    rows = writer.finish(final, registry.streams)
    if not rows:
        first = f"; the first: {skipped[0]['error']}" if skipped else ""
        raise SourceError.for_source(
            str(root), None, f"no episode could be converted ({len(skipped)} skipped{first})", "fix the inputs"
        )
    schema = DatasetSchema(
        layout=options.layout,
        streams=[TextStream(), *registry.streams],
        num_episodes=len(rows),
        created=_creation_info(options, sources, skipped),
    )
    try:
        write_manifest(rows, schema.streams, str(root / MANIFEST_FILE))
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise DestinationError(
            f"'{root}': the manifest rows saved by the interrupted run are malformed ({exc}); convert again with"
            " --overwrite"
        ) from exc
    write_text_atomically(str(root / DATASET_FILE), schema.to_json())
    shutil.rmtree(root / PARTIAL_DIR)
    stats_problem = _write_statistics(root, moments, source_stats)
    return ConversionReport(
        destination=str(root),
        layout=options.layout,
        converted=len(rows),
        skipped=skipped,
        seconds=time.perf_counter() - started,
        input_bytes=_source_bytes(sources),
        output_bytes=sum(p.stat().st_size for p in root.rglob("*") if p.is_file()),
        resumed_at=resumed_at,
        stats_problem=stats_problem,
    )


def _write_statistics(root: Path, moments: dict[str, Moments], source_stats: dict[str, Any] | None) -> str | None:
    """Write the complete store's stats.json; a failure there leaves the store as it is (complete) and
    is reported, with the command that computes them later."""
    try:
        dataset = open_dataset(str(root))
        write_stats(dataset, {**compute_stats(dataset, moments=moments), **(source_stats or {})})
    except (MmdataError, OSError, ValueError) as exc:
        return f"normalization statistics were not written ({exc}); run `mmdata stats {root}` to compute them"
    return None


def _refuse_overlap(root: Path, sources: list[EpisodeSource], source_root: str | os.PathLike | None) -> None:
    """Refuse a destination that is, contains or lies inside the source: converting would delete
    (--overwrite), clean up (--resume) or write over the recordings."""
    target = Path(os.path.realpath(root))
    if source_root is not None:
        origin = Path(os.path.realpath(source_root))
        if target == origin or origin in target.parents or target in origin.parents:
            raise DestinationError(
                f"destination '{root}' overlaps the source '{source_root}'; write the store to a folder outside"
                " the source (nothing in the source is ever deleted or written)"
            )
    folders = {os.path.dirname(s.path) for e in sources for s in (*e.cameras, *e.audio, *e.lowdim)}
    for folder in sorted(folders):
        resolved = Path(os.path.realpath(folder))
        if resolved == target or target in resolved.parents:
            raise DestinationError(
                f"destination '{root}' holds source recordings ({folder}); write the store to a folder outside"
                " the source (nothing in the source is ever deleted or written)"
            )


def _destination_failure(root: Path, error: OSError) -> DestinationError:
    """A DestinationError that says what failed to be written and what to do about it."""
    where = error.filename or root
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free space (or choose another disk) and run the same command with --resume"
        return DestinationError(f"the disk is full while writing '{where}'; {fix}; finished shards are kept")
    if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return DestinationError(f"cannot write '{where}': {error.strerror}; choose a writable destination")
    return DestinationError(f"writing '{where}' failed: {error.strerror or error}; fix it and run again with --resume")


def _prepare_destination(root: Path, sources: list[EpisodeSource], options: ConvertOptions) -> None:
    fingerprint = options.fingerprint(sources)
    options_path = root / PARTIAL_DIR / OPTIONS_FILE
    if root.is_symlink() and options.overwrite:
        raise DestinationError(
            f"destination '{root}' is a symbolic link (to '{os.path.realpath(root)}'); --overwrite replaces a folder,"
            " not a link's target: give the folder itself, or remove the link"
        )
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
            try:
                saved = parse_json(options_path.read_bytes())
            except ValueError as exc:
                raise DestinationError(f"{options_path} {exc}; convert again with --overwrite") from exc
            if saved != fingerprint:
                saved = saved if isinstance(saved, dict) else {}
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
    write_text_atomically(str(options_path), json.dumps(fingerprint, indent=1))


def _encode_job(job: tuple[EpisodeSource, int, EncodeOptions]) -> EncodedEpisode | SourceError:
    """One episode, or the SourceError that stops it. Any other exception is an input this code
    does not expect: it too becomes the episode's error, so that --skip-bad can go on without it."""
    source, position, options = job
    try:
        return encode_episode(source, position, options)
    except SourceError as problem:
        return problem
    except Exception as exc:  # a per-episode boundary: the rest of the conversion must survive it
        return SourceError(
            source.name,
            None,
            f"could not be converted: {type(exc).__name__}: {exc}",
            "an input mmdata did not expect: report it with the file, or pass --skip-bad to leave it out",
        )


def _crashed(job: tuple[EpisodeSource, int, EncodeOptions]) -> SourceError:
    return SourceError(
        job[0].name,
        None,
        "the worker process converting it crashed (a decoder or encoder failed on this input)",
        "re-export the recording, or pass --skip-bad to leave it out",
    )


def _ordered(function, jobs, workers: int) -> Iterator[tuple[int, Any]]:
    """Results of `function(job)` in job order, with at most 2 x workers jobs in flight.

    A worker that dies (a crash in native code) breaks the pool: the jobs that were in flight are
    then run again one at a time, each in a process of its own, so the one that crashes is named
    (as its episode's SourceError) and the others are converted; the rest continue in a new pool.
    """
    if workers <= 1:
        for job in jobs:
            yield job[1], function(job)
        return
    jobs = iter(jobs)
    pool = _worker_pool(workers)
    in_flight: deque = deque()
    try:
        while True:
            while len(in_flight) < 2 * workers and (job := next(jobs, None)) is not None:
                in_flight.append((job, pool.submit(function, job)))
            if not in_flight:
                return
            job, future = in_flight.popleft()
            try:
                result = future.result()
            except BrokenProcessPool:
                pool.shutdown(wait=False, cancel_futures=True)
                retried = [job, *(waiting for waiting, _ in in_flight)]
                in_flight.clear()
                for waiting in retried:
                    yield waiting[1], _run_alone(function, waiting)
                pool = _worker_pool(workers)
                continue
            yield job[1], result
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _run_alone(function, job) -> Any:
    with _worker_pool(1) as pool:
        try:
            return pool.submit(function, job).result()
        except BrokenProcessPool:
            return _crashed(job)


def _worker_pool(workers: int) -> ProcessPoolExecutor:
    """Spawned workers that exit when this process dies, even by SIGKILL (see `_die_with_parent`)."""
    return ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_die_with_parent,
        initargs=(os.getpid(),),
    )


def _die_with_parent(parent: int) -> None:
    """In a worker: be killed with the parent (Linux's PR_SET_PDEATHSIG), and, everywhere, exit
    within a second of the parent going away, so no encoder is left running orphaned."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="mmdata-parent-watch", daemon=True).start()


def _worker_count(requested: int | None) -> int:
    return requested if requested else (os.cpu_count() or 1)


def _restored(checkpoint: Any, sources: int, root: Path) -> tuple[int, int, list, StreamRegistry]:
    """(next source position, next episode index, skipped episodes, streams) of a saved checkpoint,
    each checked: the resume state is data someone else may have written."""
    try:
        if not isinstance(checkpoint, dict):
            raise ValueError("it is not an object")
        position = as_int(checkpoint.get("next_position"), "next_position", 0, sources)
        index = as_int(checkpoint.get("next_index"), "next_index", 0, position)
        skipped = checkpoint.get("skipped")
        if not isinstance(skipped, list) or not all(isinstance(s, dict) for s in skipped):
            raise ValueError("'skipped' is not a list of objects")
        streams = checkpoint.get("streams")
        if not isinstance(streams, list):
            raise ValueError("'streams' is not a list")
        return position, index, list(skipped), StreamRegistry(streams)
    except ValueError as exc:
        raise DestinationError(
            f"'{root}': the saved conversion state cannot be resumed from ({exc}); convert again with --overwrite"
        ) from exc


def _checkpoint(
    next_position: int, next_index: int, skipped: list, registry: StreamRegistry, moments: dict[str, Moments]
) -> dict[str, Any]:
    return {
        "next_position": next_position,
        "next_index": next_index,
        "skipped": list(skipped),
        "streams": registry.to_json(),
        "moments": {name: figures.to_json() for name, figures in moments.items()},
    }


def _restored_moments(checkpoint: dict[str, Any], root: Path) -> dict[str, Moments]:
    """The low-dim moments of the episodes a resumed conversion already wrote."""
    saved = checkpoint.get("moments", {})
    try:
        if not isinstance(saved, dict):
            raise ValueError("'moments' is not an object")
        return {str(name): Moments.from_json(figures) for name, figures in saved.items()}
    except ValueError as exc:
        raise DestinationError(
            f"'{root}': the saved conversion state cannot be resumed from ({exc}); convert again with --overwrite"
        ) from exc


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
