"""`convert --engine ray`: episodes encoded by Ray tasks across a cluster, shards assembled by Ray tasks,
every byte written by a worker straight into the destination (a folder all nodes share, or an object
store); the driver only plans, keeps the account and writes the small files.

1. Encode: one task per episode reads its input, encodes it, saves it as an episode file under
   `<store>/.mmdata-partial/encoded/` and returns a summary (streams, moments, sizes), also saved there.
2. Plan: the driver takes the summaries in source order through the same ledger as the local engine
   (stream checks, numbering, skipped episodes, moments) and packs shards by the same rule.
3. Assemble: one task per WebDataset shard writes it from the episode files and returns its manifest
   rows (saved beside it, as the local engine saves them). A Zarr store's arrays are written in one
   ordered pass by the driver, since all its episodes share them.
4. Complete: the manifest, then `dataset.json`, as every conversion does.

So the store equals a local conversion's, whatever the number of nodes or the order tasks finish in.
A task whose worker dies is retried by Ray (`TASK_RETRIES`); an episode that kills its worker every
time is reported like any bad episode (or skipped, with `skip_bad`). A driver that dies leaves the
episode files and the complete shards; `resume=True` re-plans the same shards and does what is missing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem
from tqdm import tqdm

from mmdata.checks import dump_json, parse_json
from mmdata.conversion.completion import complete_store, source_bytes, store_bytes, store_schema
from mmdata.conversion.convert_options import ConversionReport, ConvertOptions
from mmdata.conversion.destination import (
    destination_failure,
    prepare_destination,
    prepare_remote_destination,
    refuse_overlap,
)
from mmdata.conversion.encode import EncodeOptions, encode_or_error, worker_crashed
from mmdata.conversion.ledger import ConversionLedger
from mmdata.errors import DestinationError, MmdataError, SourceError
from mmdata.importers.episode import EpisodeSource
from mmdata.moments import Moments
from mmdata.schema import Stream, stream_from_dict, stream_to_dict
from mmdata.store.encoded import EncodedEpisode
from mmdata.store.episode_file import episode_file_chunks, episode_from_bytes
from mmdata.store.filesystem import join, resolve, write_bytes_atomically, write_text_atomically, writing_atomically
from mmdata.store.hold import hold_store
from mmdata.store.layout import CONVERT_AGAIN, PARTIAL_DIR, SHARDS_DIR
from mmdata.store.manifest import episode_key
from mmdata.store.versions import NextVersion
from mmdata.store.wds_writer import (
    ShardTar,
    episode_members,
    episode_meta,
    member_disk_bytes,
    meta_member,
    read_shard_record,
    shard_name,
    shard_record,
    sidecar_name,
    starts_new_shard,
)

ENCODED_DIR = f"{PARTIAL_DIR}/encoded"
TASK_RETRIES = 3
TASKS_PER_CPU = 2
INSTALL_HINT = "install Ray with `pip install 'mmdata[ray]'` (on every node of the cluster)"


@dataclass(frozen=True)
class EpisodeSummary:
    """What an encode task returns instead of the episode: all the driver needs to account for it and
    to place it in a shard, a few KB whatever the episode's size."""

    position: int
    source: str
    task: str
    duration: float
    metadata: dict[str, Any]
    streams: list[Stream]
    moments: dict[str, Moments]
    frames: int
    members: tuple[tuple[str, int], ...]  # (name after the episode's key, bytes) of each member but its `.json`

    @classmethod
    def of(cls, episode: EncodedEpisode) -> EpisodeSummary:
        members = tuple((name, len(data)) for name, data in episode_members(episode, "", 0)[1:])
        return cls(
            position=episode.position,
            source=episode.source,
            task=episode.task,
            duration=episode.duration,
            metadata=episode.metadata,
            streams=episode.streams,
            moments=episode.moments,
            frames=sum(video.count for video in episode.videos),
            members=members,
        )

    def shard_bytes(self, index: int) -> int:
        """The tar bytes the episode takes as episode number `index` (its key is in every member's name, and its
        `.json` member holds the number)."""
        key = episode_key(index)
        meta = episode_meta(index, self.source, self.task, self.duration, self.metadata)
        data_bytes = sum(member_disk_bytes(key + name, size) for name, size in self.members)
        return member_disk_bytes(meta_member(key), len(meta)) + data_bytes

    def to_json(self) -> str:
        return dump_json(
            {
                "position": self.position,
                "source": self.source,
                "task": self.task,
                "duration": self.duration,
                "metadata": self.metadata,
                "streams": [stream_to_dict(s) for s in self.streams],
                "moments": {name: figures.to_json() for name, figures in self.moments.items()},
                "frames": self.frames,
                "members": self.members,
            }
        )

    @classmethod
    def from_json(cls, text: bytes, where: str) -> EpisodeSummary:
        try:
            saved = parse_json(text)
            return cls(
                position=int(saved["position"]),
                source=str(saved["source"]),
                task=str(saved["task"]),
                duration=float(saved["duration"]),
                metadata=dict(saved["metadata"]),
                streams=[stream_from_dict(entry) for entry in saved["streams"]],
                moments={str(name): Moments.from_json(f) for name, f in saved["moments"].items()},
                frames=int(saved["frames"]),
                members=tuple((str(name), int(size)) for name, size in saved["members"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DestinationError(f"{where}: the saved episode summary is damaged ({exc}); {CONVERT_AGAIN}") from exc


def convert_on_ray(
    sources: list[EpisodeSource],
    destination: str,
    options: ConvertOptions,
    source_root: str | None,
    source_stats: dict[str, Any] | None,
) -> ConversionReport:
    """`mmdata.conversion.pipeline.convert` with the episodes encoded on a Ray cluster (see the module)."""

    started = time.perf_counter()
    fs, root = resolve(destination)
    store = _Store(fs, root, str(destination))
    if isinstance(fs, LocalFileSystem):
        refuse_overlap(Path(root), sources, source_root)
    elif options.layout == "zarr":
        raise DestinationError(
            f"'{destination}': --engine ray writes a Zarr store into a folder every node shares, not into object"
            " storage (its arrays are written in one ordered pass); convert into a shared folder and upload it, or"
            " use the local engine, which stages and uploads"
        )
    ray = _import_ray()
    try:
        with hold_store(destination, f"mmdata convert --engine ray into {destination}") as hold:
            _prepare(store, sources, options)
            with _connected(ray, options.ray_address):
                ledger, rows = _run(ray, store, sources, options)
            created = options.creation_info(sources, ledger.skipped)
            schema = store_schema(options.layout, ledger.registry.streams, rows, created, store.url)
            with NextVersion(hold) as version:
                stats_problem = complete_store(version, rows, schema, ledger.moments, source_stats)
    except OSError as exc:
        raise destination_failure(destination, exc) from exc
    return ConversionReport(
        destination=store.url,
        layout=options.layout,
        converted=len(rows),
        skipped=ledger.skipped,
        seconds=time.perf_counter() - started,
        input_bytes=source_bytes(sources),
        output_bytes=store_bytes(fs, root),
        resumed_at=store.resumed_at,
        stats_problem=stats_problem,
    )


class _Store:
    """The destination's paths, on the filesystem every task reaches it through."""

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str, url: str):
        self.fs = fs
        self.root = root
        self.url = url
        self.resumed_at = 0

    def path(self, relative: str) -> str:
        return join(self.root, relative)

    def episode_file(self, position: int) -> str:
        return self.path(f"{ENCODED_DIR}/{position:08d}.episode")

    def summary_file(self, position: int) -> str:
        return self.path(f"{ENCODED_DIR}/{position:08d}.json")


def _prepare(store: _Store, sources: list[EpisodeSource], options: ConvertOptions) -> None:
    fingerprint = options.fingerprint(sources)
    if isinstance(store.fs, LocalFileSystem):
        prepare_destination(Path(store.root), fingerprint, options.resume, options.overwrite)
    else:
        prepare_remote_destination(store.fs, store.root, store.url, fingerprint, options.resume, options.overwrite)
    store.fs.makedirs(store.path(ENCODED_DIR), exist_ok=True)
    store.fs.makedirs(store.path(SHARDS_DIR), exist_ok=True)


def _run(
    ray: Any, store: _Store, sources: list[EpisodeSource], options: ConvertOptions
) -> tuple[ConversionLedger, list[dict[str, Any]]]:
    outcomes = _saved_summaries(store, len(sources))
    store.resumed_at = len(outcomes)
    _encode_all(ray, store, sources, options, outcomes)
    ledger = ConversionLedger(None, len(sources), store.url)
    kept: list[tuple[EpisodeSummary, int]] = []
    plan = _ShardPlan(options.shard_bytes)
    for position, source in enumerate(sources):
        outcome = outcomes[position]
        index = ledger.accept(position, source.name, outcome, options.skip_bad)
        if index is not None:
            assert isinstance(outcome, EpisodeSummary)
            kept.append((outcome, index))
            if options.layout == "wds":
                plan.add(position, index, outcome.shard_bytes(index), ledger.checkpoint())
    if options.layout == "zarr":
        return ledger, _write_zarr(store, kept, ledger.registry.streams)
    return ledger, _assemble_shards(ray, store, plan.finish(ledger.checkpoint()), options.progress)


def _saved_summaries(store: _Store, count: int) -> dict[int, EpisodeSummary | SourceError]:
    """The episodes an interrupted run already encoded (both the episode file and its summary saved)."""
    names = {Path(p).name for p in _listing(store.fs, store.path(ENCODED_DIR))}
    done = [p for p in range(count) if f"{p:08d}.json" in names and f"{p:08d}.episode" in names]
    texts = _read_all(store.fs, [store.summary_file(p) for p in done])
    return {p: EpisodeSummary.from_json(texts[store.summary_file(p)], store.summary_file(p)) for p in done}


def _encode_all(
    ray: Any,
    store: _Store,
    sources: list[EpisodeSource],
    options: ConvertOptions,
    outcomes: dict[int, EpisodeSummary | SourceError],
) -> None:
    """Encode every episode not in `outcomes` as Ray tasks, at most `options.workers` in flight (default: twice
    the cluster's CPUs); adds their outcomes.
    Without `skip_bad`, the first bad episode stops the conversion (what was encoded stays for --resume)."""
    encode = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(_encode_to_store)
    limit = options.workers or max(2, TASKS_PER_CPU * int(ray.cluster_resources().get("CPU", 1)))
    waiting = iter(p for p in range(len(sources)) if p not in outcomes)
    in_flight: dict[Any, int] = {}
    frames = 0
    started = time.perf_counter()
    with tqdm(
        total=len(sources),
        initial=len(outcomes),
        unit="episode",
        desc=f"convert -> {options.layout} (ray)",
        disable=not options.progress,
        dynamic_ncols=True,
    ) as progress:
        try:
            while True:
                while len(in_flight) < limit and (position := next(waiting, None)) is not None:
                    ref = encode.remote(sources[position], position, options.encode, store.fs, store.root)
                    in_flight[ref] = position
                if not in_flight:
                    return
                done, _ = ray.wait(list(in_flight), num_returns=1)
                position = in_flight.pop(done[0])
                outcome = _task_result(ray, done[0], sources[position].name)
                if isinstance(outcome, SourceError) and not options.skip_bad:
                    raise outcome
                outcomes[position] = outcome
                if isinstance(outcome, EpisodeSummary):
                    frames += outcome.frames
                progress.set_postfix(frames_per_s=f"{frames / max(time.perf_counter() - started, 1e-9):.0f}")
                progress.update(1)
        finally:
            for ref in in_flight:
                ray.cancel(ref, force=True)


def _task_result(ray: Any, ref: Any, episode: str) -> Any:
    """A task's return value; an episode whose worker died on every try becomes that episode's error, and
    an exception inside the task is raised here as itself."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause
        if isinstance(cause, (MmdataError, OSError)):
            raise cause from None
        raise
    except ray.exceptions.RayError:
        return worker_crashed(episode)


def _encode_to_store(
    source: EpisodeSource, position: int, options: EncodeOptions, fs: fsspec.AbstractFileSystem, root: str
) -> EpisodeSummary | SourceError:
    """In a Ray task: encode one episode and save it with its summary (summary last: it marks the episode done)."""
    store = _Store(fs, root, root)
    outcome = encode_or_error(source, position, options)
    if isinstance(outcome, SourceError):
        return outcome
    summary = EpisodeSummary.of(outcome)
    write_bytes_atomically(store.episode_file(position), episode_file_chunks(outcome, position, {}), fs)
    write_text_atomically(store.summary_file(position), summary.to_json(), fs)
    return summary


@dataclass
class _PlannedShard:
    number: int
    episodes: list[tuple[int, int]]
    checkpoint: dict[str, Any]


class _ShardPlan:
    """The local engine's shards: episodes in order, packed by `starts_new_shard`. Each shard keeps the
    checkpoint the local engine saves beside it (after its last episode; for the last shard, the final
    one), so either engine can resume the other's interrupted conversion."""

    def __init__(self, shard_bytes: int):
        self.shard_bytes = shard_bytes
        self.shards: list[_PlannedShard] = []
        self._offset = 0

    def add(self, position: int, index: int, size: int, checkpoint: dict[str, Any]) -> None:
        if not self.shards or starts_new_shard(self._offset, size, self.shard_bytes, bool(self.shards[-1].episodes)):
            self.shards.append(_PlannedShard(len(self.shards), [], {}))
            self._offset = 0
        self.shards[-1].episodes.append((position, index))
        self.shards[-1].checkpoint = checkpoint
        self._offset += size

    def finish(self, checkpoint: dict[str, Any]) -> list[_PlannedShard]:
        if self.shards:
            self.shards[-1].checkpoint = checkpoint
        return self.shards


def _assemble_shards(ray: Any, store: _Store, shards: list[_PlannedShard], progress: bool) -> list[dict[str, Any]]:
    """Every shard's manifest rows, in order: read from the sidecar of a shard an interrupted run completed
    (when it holds the planned episodes), else from a Ray task that writes the shard."""
    assemble = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(_assemble_shard)
    _remove_stale_shards(store, len(shards))
    rows = _completed_shards(store, shards)
    pending: dict[Any, int] = {}
    for shard in shards:
        if shard.number not in rows:
            ref = assemble.remote(store.fs, store.root, shard.number, shard.episodes, shard.checkpoint)
            pending[ref] = shard.number
    with tqdm(total=len(shards), initial=len(rows), unit="shard", desc="assemble shards", disable=not progress) as bar:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            number = pending.pop(done[0])
            rows[number] = _task_result(ray, done[0], shard_name(number))
            bar.update(1)
    return [row for number in range(len(shards)) for row in rows[number]]


def _completed_shards(store: _Store, shards: list[_PlannedShard]) -> dict[int, list[dict[str, Any]]]:
    """The manifest rows of each planned shard an interrupted run completed (its file and its sidecar saved,
    the sidecar naming the planned episodes)."""
    written = {Path(p).name for p in _listing(store.fs, store.path(SHARDS_DIR))}
    sidecars = {Path(p).name for p in _listing(store.fs, store.path(PARTIAL_DIR))}
    done = [s for s in shards if Path(shard_name(s.number)).name in written and sidecar_name(s.number) in sidecars]
    paths = {s.number: store.path(f"{PARTIAL_DIR}/{sidecar_name(s.number)}") for s in done}
    texts = _read_all(store.fs, list(paths.values()))
    completed = {}
    for shard in done:
        rows, _ = read_shard_record(texts[paths[shard.number]], paths[shard.number])
        if [row.get("episode_index") for row in rows] == [index for _, index in shard.episodes]:
            completed[shard.number] = rows
    return completed


def _read_all(fs: fsspec.AbstractFileSystem, paths: list[str]) -> dict[str, bytes]:
    """Small files read in one batch (concurrent requests on an object store), by the paths given."""
    if not paths:
        return {}
    found = fs.cat(paths, on_error="raise")
    return {path: found[path] if path in found else found[fs._strip_protocol(path)] for path in paths}


def _remove_stale_shards(store: _Store, count: int) -> None:
    """Shard files a dead task or an earlier run left that are not among the planned shards (`.tmp` files)."""
    planned = {Path(shard_name(number)).name for number in range(count)}
    for path in _listing(store.fs, store.path(SHARDS_DIR)):
        if Path(path).name not in planned:
            store.fs.rm(path)


def _listing(fs: fsspec.AbstractFileSystem, folder: str) -> list[str]:
    """The files in `folder`; none when it does not exist (an object store has no empty folders)."""
    try:
        return fs.ls(folder, detail=False, refresh=True)
    except FileNotFoundError:
        return []


def _assemble_shard(
    fs: fsspec.AbstractFileSystem, root: str, number: int, episodes: list[tuple[int, int]], checkpoint: dict[str, Any]
) -> list[dict[str, Any]]:
    """In a Ray task: write one shard from its episodes' files, then its sidecar; its manifest rows."""
    store = _Store(fs, root, root)
    with writing_atomically(store.path(shard_name(number)), fs) as file:
        shard = ShardTar(file, shard_name(number))
        for episode, index in _episode_files(store, episodes):
            shard.add(episode, index)
        shard.close()
    write_text_atomically(store.path(f"{PARTIAL_DIR}/{sidecar_name(number)}"), shard_record(shard.rows, checkpoint), fs)
    return shard.rows


def _episode_files(store: _Store, episodes: list[tuple[int, int]]) -> Iterator[tuple[EncodedEpisode, int]]:
    for position, index in episodes:
        where = store.episode_file(position)
        episode, _, _ = episode_from_bytes(store.fs.cat_file(where), where)
        yield episode, index


def _write_zarr(store: _Store, kept: list[tuple[EpisodeSummary, int]], streams: list[Stream]) -> list[dict[str, Any]]:
    """A Zarr store's arrays, in one ordered pass on the driver (all episodes share them)."""
    from mmdata.store.zarr_writer import ZarrWriter

    return ZarrWriter(store.root).write(streams, _episode_files(store, [(s.position, i) for s, i in kept]))


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise MmdataError(f"--engine ray needs Ray: {INSTALL_HINT}") from exc
    return ray


@contextlib.contextmanager
def _connected(ray: Any, address: str | None) -> Iterator[None]:
    """Connected to a cluster: the one this process already is, else the one at `address` (None:
    `RAY_ADDRESS`, or a cluster `ray start` made on this machine, or a new local one). A connection made
    here is closed when the conversion ends."""
    if ray.is_initialized():
        yield
        return
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    except ConnectionError as exc:
        raise MmdataError(f"cannot connect to the Ray cluster at '{address}' ({exc}); check --ray-address") from exc
    try:
        yield
    finally:
        ray.shutdown()
