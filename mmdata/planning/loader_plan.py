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
import xxhash

from mmdata.errors import OptionError, SpecError, StoreError
from mmdata.planning.episodes import Episodes
from mmdata.planning.mixture import Mixture, OpenSource, describe_sources, epoch_composition, source_targets
from mmdata.planning.order import SEGMENT_ORDER_VERSION, resolve_shuffle
from mmdata.planning.planner import LoaderPlanner, PlanSettings
from mmdata.planning.samples import SampleTable, TokensPer, concatenate_samples, enumerate_samples
from mmdata.planning.segments import segment_blocks
from mmdata.planning.specs import Frames, Spec


@dataclass(frozen=True)
class LoaderPlan:
    """What `plan_loader` made. `excluded` names the damaged episodes left out (with `on_error="skip"`), and
    besides this plan's fingerprint are the fingerprints of the plans whose saved states it still takes by name:
    the loader's before "auto" became the default order ("locality" was), and the "segments" order's before its
    lanes were cut to their steps' samples."""

    samples: SampleTable
    costs: np.ndarray
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
    excluded: dict[Any, str] = {}
    samples = concatenate_samples([_source_samples(s, spec, mixed, on_error, excluded) for s in sources])
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
    cameras = [name for name, stream in spec.streams.items() if isinstance(stream, Frames)]
    shuffle = resolve_shuffle(settings.shuffle, settings.batch_size is not None, bool(cameras))
    settings = dataclasses.replace(settings, shuffle=shuffle)
    blocks = None
    if shuffle == "segments":
        if settings.batch_tokens is not None:
            raise OptionError(
                "the 'segments' order keeps its steps in order, which token-budgeted packing does not:"
                " give Batching(batch_size=...) with Shuffling(mode='segments')"
            )
        stored = [s.streams.get(cameras[0]) if cameras else None for s in sources]
        blocks = segment_blocks(samples, [s.store for s in sources], stored)
    keys = [s.store.table.column("key").to_pylist() for s in sources]
    shards = [s.store.table.column("shard").to_pylist() for s in sources]
    planner = LoaderPlanner(samples, costs, keys, shards, settings, composition, blocks)
    if mixed:
        data = [describe_sources(sources), mixture.describe()]
    else:
        data = [keys[0], sources[0].store.table.column("duration").to_pylist()]
    data_text = [_json(part) for part in data]  # the manifest's part, written once for the three fingerprints

    def fingerprint_in(order: str, segments_version: str = SEGMENT_ORDER_VERSION) -> str:
        planned = [
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


def _json(part: Any) -> str:
    return json.dumps(part, sort_keys=True, default=repr)


def _hash_of_list(texts: list[str]) -> str:
    """A short hash of everything the plan of an epoch depends on besides seed, epoch and world size: the JSON
    list of the parts written as `texts` (as `json.dumps` writes the list itself, so states saved before keep
    their fingerprints)."""
    return xxhash.xxh64_hexdigest(("[" + ", ".join(texts) + "]").encode())


def _source_samples(
    source: OpenSource, spec: Spec, labelled: bool, on_error: str, excluded: dict[Any, str]
) -> SampleTable:
    """The samples of one source's selected, undamaged episodes; damaged ones are refused, or left out and
    named in `excluded` (by row, or `source/row` in a mixture: `labelled`)."""
    table = source.store.table
    selected = source.episodes.select(table) if source.episodes is not None else np.arange(table.num_rows)
    damaged = {int(i): source.store.damaged[int(i)] for i in selected if int(i) in source.store.damaged}
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
    selected = np.asarray([i for i in selected if int(i) not in damaged], dtype=np.int64)
    try:
        return enumerate_samples(table, spec, selected)
    except SpecError as exc:
        raise SpecError(f"{label}{exc}") from None
