"""The loader's plan, made once when a loader is built and before anything is read: its samples (a sample index per
source, nothing of the size of the epoch), each source's share, the order resolved, the one planner that orders and
packs any epoch for any world size (`planning.planner`), and the fingerprint a saved state is checked against."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from mmdata.errors import SpecError, StoreError
from mmdata.planning.episodes import Episodes
from mmdata.planning.mixture import Mixture, OpenSource, source_targets
from mmdata.planning.orders import ORDER_VERSION, OrderRecipe, resolve_shuffle, shard_run_starts
from mmdata.planning.packed_windows import WINDOW_PACKING_VERSION
from mmdata.planning.packing.cost import TokensPer
from mmdata.planning.planner import PlannedSource, Planner, PlanSettings
from mmdata.planning.sample_index import SampleIndex, SourceSampleIndexes
from mmdata.planning.specs import Frames, Sequences, Spec, Windows
from mmdata.schema import VideoStream
from mmdata.store.handle import Store


@dataclass(frozen=True)
class LoaderPlan:
    """What `plan_loader` made. `excluded` names the damaged episodes left out (with `on_error="skip"`)."""

    samples: SampleIndex | SourceSampleIndexes
    source_targets: np.ndarray
    settings: PlanSettings
    planner: Planner
    excluded: dict[Any, str]
    fingerprint: str


def plan_loader(
    sources: list[OpenSource],
    spec: Spec,
    settings: PlanSettings,
    tokens_per: TokensPer | None,
    mixture: Mixture,
    mixed: bool,
    episodes: Episodes | None,
    on_error: Literal["raise", "skip"],
) -> LoaderPlan:
    """Plan a loader of `spec` over the opened `sources` of `mixture` (a single store is a mixture of one that is
    not `mixed`: no source names, no composition), batched and ordered by `settings` (its order may be "auto",
    resolved here); `episodes` is a single store's filter, for the fingerprint. A damaged episode is refused, or
    with `on_error="skip"` left out; a sample costlier than the token budget is refused with what to change."""
    planning = [source.store.columns(["duration", "shard"]) for source in sources]  # what every order plans from
    excluded: dict[Any, str] = {}
    rows = [_selected_rows(source, mixed, on_error, excluded) for source in sources]  # (damage the columns showed)
    indexes = [
        _indexed(source, table, chosen, spec, tokens_per, mixed)
        for source, table, chosen in zip(sources, planning, rows)
    ]
    slots = _index_targets(mixture, indexes) if mixed else np.array([len(indexes[0])], np.int64)
    cameras = [name for name, stream in spec.streams.items() if isinstance(stream, Frames)]
    settings = dataclasses.replace(settings, shuffle=resolve_shuffle(settings.shuffle, bool(cameras)))
    recipes = [
        _recipe(source, table, index, spec, settings, cameras)
        for source, table, index in zip(sources, planning, indexes)
    ]
    planned_sources = [
        PlannedSource(index, table.column("shard"), recipe) for index, table, recipe in zip(indexes, planning, recipes)
    ]
    dealt = _dealt(settings, indexes)
    planner = Planner(planned_sources, dealt, slots if mixed else None)
    planned = _planned(spec, episodes, tokens_per, settings)
    planned.append([planner.lanes, settings.drop_last, [r.describe() for r in recipes], ORDER_VERSION])
    if dealt.batch_size is None:
        planned.append(WINDOW_PACKING_VERSION)
    if not mixed:
        table = planning[0]
        data = json.dumps([table.num_rows, _durations_digest(table)])
        samples: SampleIndex | SourceSampleIndexes = indexes[0]
    else:
        described = [
            {"name": s.name, "rows": table.num_rows, "durations": _durations_digest(table), "streams": s.streams}
            for s, table in zip(sources, planning)
        ]
        data = _json([described, mixture.describe()])
        samples = planner.samples
    fingerprint = _hash_of_list([data, *(_json(part) for part in planned)])
    return LoaderPlan(samples, slots, settings, planner, excluded, fingerprint)


def _recipe(
    source: OpenSource, table: pa.Table, index: SampleIndex, spec: Spec, settings: PlanSettings, cameras: list[str]
) -> OrderRecipe:
    """How one source's samples are ordered: the samples of a block of its first camera's segments ("blocks"), or
    its samples' runs of one shard ("locality")."""
    if settings.shuffle == "blocks":
        block = block_samples(source.store, _stored_camera(source, cameras), spec)
        return OrderRecipe("blocks", block=block, open_blocks=settings.open_segments, episode_firsts=index.firsts)
    if settings.shuffle == "locality":
        codes = pc.dictionary_encode(pc.fill_null(table.column("shard"), "")).combine_chunks().indices
        shards = codes.to_numpy(zero_copy_only=False)
        if index.rows is not None:
            shards = shards[index.rows]
        starts = shard_run_starts(shards, index.firsts)
        return OrderRecipe("locality", run_starts=starts, shards_per_group=settings.shards_per_group)
    return OrderRecipe(settings.shuffle)


# Samples per block of the "blocks" order when no camera is read (a block then only keeps an episode's
# low-dim reads together).
LOW_DIM_BLOCK = 32
_ROWS_SAMPLED = 16


def block_samples(store: Store, camera: str | None, spec: Spec) -> int:
    """Samples per block of the "blocks" order (`planning.orders`): the windows a stored segment of
    `camera` spans (the median segment of the manifest's first rows), so that a block is about one decode; one
    for sequences (a sequence reads whole segments itself); `LOW_DIM_BLOCK` without a camera."""
    if isinstance(spec, Sequences):
        return 1
    stream = store.schema.stream(camera) if camera is not None else None
    if not isinstance(stream, VideoStream):
        return LOW_DIM_BLOCK
    rows = [store.manifest.row(i) for i in range(min(_ROWS_SAMPLED, len(store))) if i not in store.damaged]
    frames = [segment["num_frames"] for row in rows for segment in row[f"{camera}/segments"] or ()]
    if not frames:
        return LOW_DIM_BLOCK
    return max(1, round(float(np.median(frames)) / stream.fps * spec.anchor_fps))


def _dealt(settings: PlanSettings, indexes: list[SampleIndex]) -> PlanSettings:
    """`settings` as the "blocks" order deals them: a token budget over windows, each of one cost, as a count of
    samples per micro-batch (as many as fit, as the packer fills it); a token budget over sequences as it is,
    packed window by window. A sample costlier than the budget is refused, naming the cost to reach."""
    if settings.batch_size is not None:
        return settings
    assert settings.batch_tokens is not None, "a plan needs a batch size or a token budget"
    having = [index for index in indexes if len(index)]
    costliest = max(index.max_cost() for index in having)
    if costliest > settings.batch_tokens:
        raise SpecError(
            f"batch_tokens={settings.batch_tokens} is smaller than one sample: the costliest sample takes"
            f" {costliest} tokens; raise batch_tokens to at least that, lower tokens_per, or shorten the samples"
            " (Sequences(max_seconds=...))"
        )
    if isinstance(having[0].spec, Windows):
        return dataclasses.replace(settings, batch_size=settings.batch_tokens // costliest)
    return settings


def _stored_camera(source: OpenSource, cameras: list[str]) -> str | None:
    """The stored name of the spec's first camera in `source` (None: it reads no camera, or the source lacks it)."""
    return source.streams.get(cameras[0]) if cameras else None


def _indexed(
    source: OpenSource, table: pa.Table, rows: np.ndarray, spec: Spec, tokens_per: TokensPer | None, labelled: bool
) -> SampleIndex:
    """The sample index of one source's manifest `rows` (`table`: its duration and shard columns); a spec that
    yields no sample of a source is refused naming it."""
    chosen = None if len(rows) == len(source.store) else rows
    try:
        return SampleIndex(table, spec, chosen, tokens_per)
    except SpecError as exc:
        raise SpecError(f"source '{source.name}': {exc}" if labelled else str(exc)) from None


def _index_targets(mixture: Mixture, indexes: list[SampleIndex]) -> np.ndarray:
    """Each source's slots in an epoch, from the sources' sample counts (and mean costs, when weighed by tokens)."""
    counts = [len(index) for index in indexes]
    by_tokens = mixture.weight_by == "tokens"
    mean_costs = [index.mean_cost() if by_tokens else 0.0 for index in indexes]
    return source_targets(mixture, counts, mean_costs)


def _planned(spec: Spec, episodes: Episodes | None, tokens_per: TokensPer | None, settings: PlanSettings) -> list:
    """What a plan depends on besides the data, seed, epoch and world size, in the fingerprint's form."""
    return [
        spec.describe(),
        episodes.describe() if episodes is not None else None,
        dict(tokens_per or {}),
        [
            settings.batch_tokens,
            settings.batch_size,
            settings.balance,
            settings.shuffle,
            settings.shuffle_window,
            settings.shards_per_group,
        ],
    ]


def _json(part: Any) -> str:
    return json.dumps(part, sort_keys=True, default=repr)


def _durations_digest(table: pa.Table) -> str:
    """A hash of the manifest's durations, read as bytes however they are chunked (ten million in well under a
    second, where their JSON text takes tens)."""
    digest = xxhash.xxh64()
    for chunk in table.column("duration").chunks:
        digest.update(np.ascontiguousarray(chunk.to_numpy(zero_copy_only=False)).tobytes())
    return digest.hexdigest()


def _hash_of_list(texts: list[str]) -> str:
    """A short hash of everything the plan of an epoch depends on besides seed, epoch and world size: the JSON
    list of the parts written as `texts`."""
    return xxhash.xxh64_hexdigest(("[" + ", ".join(texts) + "]").encode())


def _selected_rows(source: OpenSource, labelled: bool, on_error: str, excluded: dict[Any, str]) -> np.ndarray:
    """The manifest rows of one source's selected, undamaged episodes; damaged ones are refused, or left out and
    named in `excluded` (by row, or `source/row` in a mixture: `labelled`)."""
    store, episodes = source.store, source.episodes
    if episodes is None:
        selected = np.arange(len(store))
    else:
        needed = episodes.columns()
        selected = episodes.select(store.table if needed is None else store.columns(needed))
    known = np.fromiter(store.damaged, np.int64, len(store.damaged))
    damaged = {int(i): store.damaged[int(i)] for i in np.sort(known[np.isin(known, selected)])}
    label = f"source '{source.name}': " if labelled else ""
    if damaged and on_error == "raise":
        raise StoreError(
            f"{label}{len(damaged)} episode(s) have inconsistent manifest rows, the first: "
            f"{next(iter(damaged.values()))}; run `mmdata verify {source.store.url}`, or pass"
            " on_error='skip' to leave them out of every epoch (they are listed in stats()['excluded_episodes'])"
        )
    excluded.update({(f"{source.name}/{i}" if labelled else i): message for i, message in damaged.items()})
    if damaged and len(damaged) == len(selected):
        raise StoreError(
            f"{label}all {len(selected)} selected episode(s) were left out as damaged (on_error='skip'), the first:"
            f" {next(iter(damaged.values()))}; run `mmdata verify {source.store.url}` and convert the store again"
        )
    selected = np.asarray(selected, dtype=np.int64)
    return selected[~np.isin(selected, list(damaged))] if damaged else selected
