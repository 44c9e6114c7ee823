"""The loader's plan, made once when a loader is built and before anything is read: its samples and their
costs, each source's share, the order resolved, the planner that orders and packs any epoch for any world
size, and the fingerprint a saved state is checked against. Every epoch's steps follow from it, the seed and
the epoch alone (`LoaderPlanner`)."""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import xxhash

from mmdata.errors import OptionError, SpecError, StoreError
from mmdata.planning.block_order import BLOCK_ORDER_VERSION
from mmdata.planning.block_planner import BlockPlanner, BlockSource
from mmdata.planning.episodes import Episodes
from mmdata.planning.mixed_order import MIXED_ORDER_VERSION
from mmdata.planning.mixture import (
    MAX_ORDERED_SLOTS,
    Mixture,
    OpenSource,
    describe_sources,
    epoch_composition,
    source_targets,
)
from mmdata.planning.order import SEGMENT_ORDER_VERSION, resolve_shuffle
from mmdata.planning.packed_windows import WINDOW_PACKING_VERSION
from mmdata.planning.planner import LoaderPlanner, PlanSettings
from mmdata.planning.sample_index import SampleIndex, SourceSampleIndexes
from mmdata.planning.samples import SampleTable, TokensPer, concatenate_samples, enumerate_samples
from mmdata.planning.segments import block_samples, segment_blocks
from mmdata.planning.specs import Frames, Spec, Windows


@dataclass(frozen=True)
class LoaderPlan:
    """What `plan_loader` made. `excluded` names the damaged episodes left out (with `on_error="skip"`), and
    besides this plan's fingerprint are the fingerprints of the plans whose saved states it still takes by name:
    the loader's before "auto" became the default order ("locality" was), and the "segments" order's before its
    lanes were cut to their steps' samples."""

    samples: SampleTable | SampleIndex | SourceSampleIndexes
    costs: np.ndarray | None  # per sample; None in the "blocks" order, whose costs are worked out per step
    source_targets: np.ndarray
    settings: PlanSettings
    planner: LoaderPlanner
    excluded: dict[Any, str]
    fingerprint: str
    locality_fingerprint: str
    earlier_segments_fingerprint: str


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
    """Plan a loader of `spec` over the opened `sources` of `mixture` (a single store is a mixture of one
    that is not `mixed`: no source names, no composition), batched and ordered by `settings` (its order may be
    "auto", resolved here); `episodes` is a single store's filter, for the fingerprint. A damaged episode is
    refused, or with `on_error="skip"` left out; a sample costlier than the token budget, or the "segments"
    order with a token budget, is refused with what to change."""
    counts_samples = settings.batch_size is not None
    if settings.shuffle == "segments" and not counts_samples:
        raise OptionError(
            "the 'segments' order keeps its steps in order, which token-budgeted packing does not:"
            " give Batching(batch_size=...) with Shuffling(mode='segments')"
        )
    planning = [source.store.columns(["duration", "shard"]) for source in sources]  # what every order plans from
    excluded: dict[Any, str] = {}
    rows = [_selected_rows(source, mixed, on_error, excluded) for source in sources]  # (damage the columns showed)
    indexes, slots = None, None
    if settings.shuffle in ("auto", "blocks"):
        indexes = [
            _indexed(source, table, chosen, spec, tokens_per, mixed)
            for source, table, chosen in zip(sources, planning, rows)
        ]
        slots = _index_targets(mixture, indexes) if mixed else np.array([len(indexes[0])], np.int64)
    cameras = [name for name, stream in spec.streams.items() if isinstance(stream, Frames)]
    epoch_samples = int(slots.sum()) if slots is not None else 0
    shuffle = resolve_shuffle(settings.shuffle, counts_samples, bool(cameras), epoch_samples)
    settings = dataclasses.replace(settings, shuffle=shuffle)
    if shuffle == "blocks":
        assert indexes is not None and slots is not None, "the 'blocks' order was resolved without sample indexes"
        blocks = _BlocksInput(sources, planning, indexes, slots, mixture if mixed else None)
        return _blocks_plan(blocks, spec, settings, tokens_per, episodes, excluded)
    if mixed and (mixture.epoch_samples or 0) > MAX_ORDERED_SLOTS:
        raise OptionError(
            f"Mixture(epoch_samples={mixture.epoch_samples:,}) is more than the '{shuffle}' order holds"
            f" ({MAX_ORDERED_SLOTS:,}): order it in 'blocks' (Shuffling(mode='blocks'), or the 'auto' default),"
            " or give epoch_samples no larger"
        )
    samples = concatenate_samples(
        [_enumerated(source, table, chosen, spec, mixed) for source, table, chosen in zip(sources, planning, rows)]
    )
    costs = samples.costs(tokens_per)
    if settings.batch_tokens is not None and costs.max() > settings.batch_tokens:
        worst = int(np.argmax(costs))
        raise SpecError(
            f"batch_tokens={settings.batch_tokens} is smaller than one sample: sample {worst} (episode"
            f" {int(samples.episode[worst])}) costs {int(costs[worst])} tokens; raise batch_tokens"
            " to at least that, lower tokens_per, or shorten the samples (Sequences(max_seconds=...))"
        )
    counts = np.bincount(samples.source, minlength=len(sources))
    mean_costs = [float(costs[samples.source == n].mean()) if c else 0.0 for n, c in enumerate(counts)]
    targets = source_targets(mixture, counts, mean_costs)
    composition = functools.partial(epoch_composition, samples.source, targets) if mixed else None
    blocks = None
    if shuffle == "segments":
        stored = [s.streams.get(cameras[0]) if cameras else None for s in sources]
        blocks = segment_blocks(samples, [s.store for s in sources], stored)
    keys = [s.store.columns(["key"]).column("key").to_pylist() for s in sources]
    shards = [table.column("shard").to_pylist() for table in planning]
    planner = LoaderPlanner(samples, costs, keys, shards, settings, composition, blocks)
    if mixed:
        data = [describe_sources(sources), mixture.describe()]
    else:
        data = [keys[0], planning[0].column("duration").to_pylist()]
    data_text = [_json(part) for part in data]  # the manifest's part, written once for the three fingerprints

    def fingerprint_in(order: str, segments_version: str = SEGMENT_ORDER_VERSION) -> str:
        planned = _planned(spec, episodes, tokens_per, settings, order)
        if order == "segments":  # (the other orders' states stay as they were before it existed)
            planned.append([settings.lanes, settings.open_segments, segments_version])
        return _hash_of_list([*data_text, *(_json(part) for part in planned)])

    return LoaderPlan(
        samples,
        costs,
        targets,
        settings,
        planner,
        excluded,
        fingerprint_in(shuffle),
        fingerprint_in("locality"),
        fingerprint_in(shuffle, "time order"),
    )


@dataclass(frozen=True)
class _BlocksInput:
    """What the "blocks" order plans from: the sources, their manifests' duration and shard columns, their sample
    indexes and slots per epoch, and the mixture (None for a single store)."""

    sources: list[OpenSource]
    planning: list[pa.Table]
    indexes: list[SampleIndex]
    slots: np.ndarray
    mixture: Mixture | None


def _blocks_plan(
    given: _BlocksInput,
    spec: Spec,
    settings: PlanSettings,
    tokens_per: TokensPer | None,
    episodes: Episodes | None,
    excluded: dict[Any, str],
) -> LoaderPlan:
    """The plan of a single store or a mixture in the "blocks" order from the manifests' duration and shard columns:
    nothing of the size of the epoch is made, and the fingerprint hashes the durations as bytes rather than as a
    JSON list (the keys are the rows' numbers)."""
    cameras = [name for name, stream in spec.streams.items() if isinstance(stream, Frames)]
    sources = [
        BlockSource(index, table.column("shard"), block_samples(source.store, _stored_camera(source, cameras), spec))
        for source, table, index in zip(given.sources, given.planning, given.indexes)
    ]
    mixed = given.mixture is not None
    dealt = _dealt(settings, given.indexes)
    planner = BlockPlanner(sources, dealt, given.slots if mixed else None)
    planned = _planned(spec, episodes, tokens_per, settings, "blocks")
    if dealt.batch_size is None:
        planned.append(WINDOW_PACKING_VERSION)
    if not mixed:
        planned.append([settings.lanes, settings.open_segments, sources[0].block, BLOCK_ORDER_VERSION])
        table = given.planning[0]
        data = json.dumps([table.num_rows, _durations_digest(table)])
        samples: SampleIndex | SourceSampleIndexes = given.indexes[0]
    else:
        blocks = [source.block for source in sources]
        planned.append([settings.lanes, settings.open_segments, blocks, MIXED_ORDER_VERSION])
        described = [
            {"name": s.name, "rows": table.num_rows, "durations": _durations_digest(table), "streams": s.streams}
            for s, table in zip(given.sources, given.planning)
        ]
        data = _json([described, given.mixture.describe()])
        samples = planner.samples
    fingerprint = _hash_of_list([data, *(_json(p) for p in planned)])
    return LoaderPlan(samples, None, given.slots, settings, planner, excluded, fingerprint, fingerprint, fingerprint)


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
    yields no sample of a source is refused naming it, as the other orders' sample tables refuse it."""
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


def _planned(
    spec: Spec, episodes: Episodes | None, tokens_per: TokensPer | None, settings: PlanSettings, order: str
) -> list:
    """What a plan depends on besides the data, seed, epoch and world size, in the fingerprint's form."""
    return [
        spec.describe(),
        episodes.describe() if episodes is not None else None,
        dict(tokens_per or {}),
        [
            settings.batch_tokens,
            settings.batch_size,
            settings.balance,
            order,
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
    list of the parts written as `texts` (as `json.dumps` writes the list itself, so states saved before keep
    their fingerprints)."""
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


def _enumerated(source: OpenSource, table: pa.Table, rows: np.ndarray, spec: Spec, labelled: bool) -> SampleTable:
    """The samples of one source's manifest `rows` (`table`: its duration and shard columns), each its own row."""
    try:
        return enumerate_samples(table, spec, rows)
    except SpecError as exc:
        raise SpecError(f"source '{source.name}': {exc}" if labelled else str(exc)) from None
