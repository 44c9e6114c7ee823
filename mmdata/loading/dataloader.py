"""`mmdata.DataLoader`: deterministic, rank-aware, resumable batches of windows or sequences.

The loading chain (`loading/chain.py`): plan -> fetch -> align -> decode -> settle -> collate ->
device; this module builds it, runs its last stage (device) and keeps the state. The plan of an epoch is a pure
function of (manifest, spec, batching, seed, epoch, world size); each rank iterates its own
steps with no collective call, and workers take every `num_workers`-th step, so batches come out
in plan order whatever the worker count. Workers live across epochs (see `loading/feed.py`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch

from mmdata.checks import option_int
from mmdata.errors import OptionError, SpecError
from mmdata.loading.chain import BatchReader
from mmdata.loading.decoding import loader_decoder
from mmdata.loading.feed import Feed, Item, StepSource, ring_bytes
from mmdata.loading.frame_budget import (
    FrameBudget,
    delivered_frame_sizes,
    frame_bytes_per_batch,
    loader_frame_budget,
    waste_cause,
)
from mmdata.loading.loader_options import Batching, Reading, Runtime, Shuffling, grouped_options
from mmdata.loading.loader_stats import LoaderStats
from mmdata.loading.micro_batch import MicroBatch, OnError
from mmdata.loading.normalize import attach_normalizers
from mmdata.loading.state import LoaderState, check_resumable
from mmdata.loading.timing import enable_profiler_ranges, timed
from mmdata.planning.episodes import Episodes
from mmdata.planning.epoch_plan import EpochPlan
from mmdata.planning.loader_plan import plan_loader
from mmdata.planning.mixture import (
    Mixture,
    Source,
    check_sources,
    open_sources,
)
from mmdata.planning.planner import PlanSettings
from mmdata.planning.ranks import rank_and_world
from mmdata.planning.specs import Spec
from mmdata.store.dataset import Dataset
from mmdata.store.handle import Store

MAIN_DECODE_AHEAD = 2


class DataLoader:
    """Batches of `spec` samples from the store at `dataset` (a path, a URL, or an open `Store` or
    `Dataset`), or from several stores at once: a `Mixture` of weighted sources (see
    `mmdata.planning.mixture`). `episodes` filters a single store's episodes.

    The options come in groups (see `mmdata.loading.loader_options`): `batching` (a `Batching`: batch size or
    token budget, layout, balance across ranks; required), `shuffling` (a `Shuffling`: "auto", the default,
    "segments", "locality", "global" or "none"), `runtime` (a `Runtime`: workers, device, decoder and where it
    decodes, rank and world size) and `reading` (a `Reading`: checksums, memory cache, the `ReadPolicy` of the
    stores it opens). The keywords of the ungrouped form (`batch_size=`, `num_workers=`, ...) still work
    and warn. Each rank gets the same number of steps; `len(loader)` is that number for the epoch.

    `on_error="skip"` replaces a sample that fails to read with another of its micro-batch (or,
    when the whole micro-batch fails, with one borrowed from the samples planned after it) and
    counts it in `stats()`, and leaves out of every epoch the episodes whose manifest rows fail
    the store's checks (`stats()["excluded_episodes"]`); "raise" stops with the shard, episode
    and stream named, and refuses such a store when the loader is built.
    `state_dict()` / `load_state_dict()` resume exactly, also with another world size or worker count.
    `stats()` says where the time went.
    """

    def __init__(
        self,
        dataset: str | Store | Dataset | Mixture,
        spec: Spec,
        *,
        episodes: Episodes | None = None,
        batching: Batching | None = None,
        shuffling: Shuffling | None = None,
        seed: int = 0,
        runtime: Runtime | None = None,
        reading: Reading | None = None,
        on_error: OnError = "raise",
        **ungrouped: Any,
    ):
        given = {"batching": batching, "shuffling": shuffling, "runtime": runtime, "reading": reading}
        options = grouped_options(given, ungrouped)
        batching, shuffling, runtime, reading = (options[g] for g in ("batching", "shuffling", "runtime", "reading"))
        if on_error not in ("raise", "skip"):
            raise OptionError(f"on_error is 'raise' or 'skip', not '{on_error}'")
        option_int(seed, "seed", 0, 1 << 62)
        self.batching, self.shuffling, self.runtime, self.reading = batching, shuffling, runtime, reading
        self.rank, self.world_size = rank_and_world(runtime.rank, runtime.world_size)
        enable_profiler_ranges(runtime.profiler_ranges)
        self.device = runtime.resolved_device()
        self.spec = spec
        self.layout = batching.layout
        self.num_workers = runtime.num_workers
        self.prefetch_factor = runtime.prefetch_factor
        self.on_error = on_error

        if isinstance(dataset, Mixture) and episodes is not None:
            raise OptionError("a mixture filters episodes per source: give Source(..., episodes=...) instead")
        self.mixture = dataset if isinstance(dataset, Mixture) else None
        mixture = self.mixture or Mixture([Source(dataset, episodes=episodes)])
        self.sources = open_sources(mixture, reading.verify, reading.cache_bytes, reading.policy)
        self.store = self.sources[0].store
        self.fillers = check_sources(spec, self.sources)
        self.decoder = loader_decoder(runtime.decoder, spec, self.sources, self.device, runtime.num_workers)
        decode_in = runtime.decode_in
        self.decode_in_main = decode_in == "main" if decode_in else self.decoder.device == "gpu"
        settings = PlanSettings(
            batching.batch_tokens,
            batching.batch_size,
            batching.balance,
            shuffling.mode,
            shuffling.window,
            shuffling.shards_per_group,
            shuffling.lanes or max(1, runtime.num_workers),
            shuffling.open_segments,
        )
        mixed = self.mixture is not None
        plan = plan_loader(self.sources, spec, settings, batching.tokens_per, mixture, mixed, episodes, on_error)
        self.samples, self.costs, self.planner, self.excluded = plan.samples, plan.costs, plan.planner, plan.excluded
        self.source_targets, self.shuffle = plan.source_targets, plan.settings.shuffle
        attach_normalizers(self.sources, spec, self.source_targets.tolist(), mixture.normalize_with)
        self._plan = plan
        self._state = LoaderState(seed, 0, plan.fingerprint)
        self._plan_cache: tuple[tuple, EpochPlan] | None = None
        self._stats = LoaderStats()
        self._feed: Feed | None = None
        self._reader: BatchReader | None = None  # the running feed's; it also ends main-process batches
        self.frame_budget: FrameBudget | None = None  # the running feed's frame caches' bound and horizon

    # plan

    def epoch_plan(self) -> EpochPlan:
        """The plan of the current epoch at this world size, from where the state says the run is."""
        key = (self._state.seed, self._state.epoch, tuple(self._state.stretches), self.world_size)
        if self._plan_cache is None or self._plan_cache[0] != key:
            planning = time.perf_counter()
            plan = self.planner.epoch_plan(*key)
            self._plan_cache = (key, plan)
            self._stats.add_main("plan", time.perf_counter() - planning)
        return self._plan_cache[1]

    def __len__(self) -> int:
        return self.epoch_plan().total_steps

    @property
    def epoch(self) -> int:
        return self._state.epoch

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch` from its beginning (a no-op when already in it); epochs also advance on their own."""
        if epoch != self._state.epoch:
            self._state.epoch = int(epoch)
            self._state.stretches = []
            self._state.samples_consumed = 0
            self.close()

    # state

    def state_dict(self) -> dict[str, Any]:
        """Where the run stands (a few hundred bytes); save it with the model checkpoint."""
        state = self._state.to_dict()
        if not self._state.stretches:
            state["world_size"] = self.world_size
        state["episodes"] = self._episode_counts()  # to say why a state no longer fits (an append)
        return state

    def _episode_counts(self) -> list[int]:
        return [len(source.store) for source in self.sources]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state`: the same batches as the run that saved it, or, at another world size,
        the rest of its epoch with no sample repeated or left out."""
        loaded = LoaderState.from_dict(state)
        check_resumable(loaded, state.get("episodes"), self._plan, [source.store for source in self.sources])
        self._state = loaded
        self.close()
        self.epoch_plan()

    # iteration

    def __iter__(self) -> Iterator[dict[str, Any]]:
        plan = self.epoch_plan()
        if plan.total_steps == 0:
            raise SpecError(
                f"an epoch has no step for {self.world_size} rank(s): the spec gives {len(self.samples)} samples,"
                f" fewer than one micro-batch per rank; use fewer ranks, a smaller batch, or more samples"
                " (a higher anchor_fps, more episodes)"
            )
        epoch, first = self._state.epoch, self._state.steps_in_epoch
        feed = self._feed_from(epoch, first, plan)
        for expected in range(first, plan.total_steps):
            waited = time.perf_counter()
            try:
                got_epoch, step, batch, info = feed.next()
            except BaseException:
                self.close()
                raise
            if (got_epoch, step) != (epoch, expected):
                self.close()
                raise RuntimeError(f"loader produced epoch {got_epoch} step {step} where {epoch}/{expected} was due")
            for stage, seconds in info["main_seconds"].items():
                self._stats.add_main(stage, seconds)
            self._stats.add_step(info, time.perf_counter() - waited, feed.queue_depth())
            self._advance(plan)
            yield batch

    def _feed_from(self, epoch: int, step: int, plan: EpochPlan) -> Feed:
        """The running feed (it stands where the state does: anything that moves the state elsewhere
        closes it); else a new one starting at (epoch, step) of this plan."""
        if self._feed is not None and not self._feed.failed:
            return self._feed
        self.close()
        planning = time.perf_counter()
        steps = self.planner.rank_steps(plan, self.rank)
        collate_options = {
            "layout": self.batching.layout,
            "attention_mask": self.batching.attention_mask,
            "pad_to_multiple": self.batching.pad_to_multiple,
        }
        read_bytes = frame_bytes_per_batch(self.spec, self.fillers, self.batching.batch_size)
        budget = self.frame_budget = self._plan_frame_budget(read_bytes)
        reader = self._reader = BatchReader(
            self.sources,
            self.spec,
            self.fillers,
            self.decoder,
            self.on_error,
            self.decode_in_main,
            collate_options,
            budget.bound,
            budget.horizon,
        )
        source = StepSource(reader, self.planner, self._state.seed, self.rank, self.world_size, epoch, steps)
        self._stats.add_main("plan", time.perf_counter() - planning)
        self._feed = Feed(
            source,
            self._finish,
            self.num_workers,
            self.prefetch_factor,
            pin_memory=self.device.type == "cuda",
            background=self.decode_in_main,
            ahead=MAIN_DECODE_AHEAD,
            frame_bytes=read_bytes,
        )
        return self._feed

    def _plan_frame_budget(self, read_bytes: int | None) -> FrameBudget:
        """Each frame cache's bound and horizon for reads of `read_bytes` (see `frame_budget.loader_frame_budget`)."""
        rings = ring_bytes(read_bytes, self.prefetch_factor, MAIN_DECODE_AHEAD) if self.num_workers else 0
        on_gpu = self.decode_in_main and self.decoder.device == "gpu" and self.device.type == "cuda"
        gpu = self.device if on_gpu else None
        return loader_frame_budget(read_bytes, self.num_workers, rings, self.reading.frame_cache_bytes, gpu)

    def close(self) -> None:
        """Stop the workers and the receiving thread (they otherwise stay up between epochs)."""
        if self._feed is not None:
            self._feed.close()
        self._feed = None

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()

    def _finish(self, item: Item) -> Item:
        """Decode what the workers left pending (main-process decoding), collate, and move to the device."""
        epoch, step, output, info = item
        main: dict[str, float] = {}
        if isinstance(output, MicroBatch):
            output = self._reader.finish_counted(output, info, main)
        if self.device.type != "cpu":
            with timed(main, "h2d"):
                output = self._to_device(output)
        info["main_seconds"] = main
        return epoch, step, output, info

    def _advance(self, plan: EpochPlan) -> None:
        """Count one step as consumed; the cached plan stands where the state does, so a feed started from it
        (after close()) begins at the next step, not at the step the plan was made at."""
        epoch = self._state.epoch
        self._state.advance(plan, self.world_size)
        self._plan_cache = ((self._state.seed, epoch, tuple(plan.stretches), self.world_size), plan)

    def _to_device(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {k: v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    # observability

    def stats(self) -> dict[str, Any]:
        """Totals since the loader was built (or `reset_stats`): steps, samples, tokens, bytes read,
        seconds per stage in the workers and in the main process, data wait and its percentiles,
        frames decoded against delivered, skipped samples, peak RSS per worker."""
        snapshot = self._stats.snapshot()
        snapshot["excluded_episodes"] = dict(self.excluded)
        snapshot["sources"] = self._stats.sources([source.name for source in self.sources])
        snapshot["workers"] = self.num_workers
        snapshot["decoder"] = self.decoder.describe()
        budget = self.frame_budget
        snapshot["frame_cache"] = budget.snapshot() if budget is not None else None
        snapshot["decode_waste_cause"] = waste_cause(
            snapshot["decode_waste"], snapshot["frames_evicted"], budget, delivered_frame_sizes(self.spec, self.fillers)
        )
        if self.decode_in_main:
            snapshot["main_process_decode"] = self.decoder.stats.snapshot()
        return snapshot

    def reset_stats(self) -> None:
        """Start the totals of `stats()` afresh (e.g. after warm-up)."""
        self._stats = LoaderStats()
