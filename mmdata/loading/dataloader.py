"""`mmdata.DataLoader`: deterministic, rank-aware, resumable batches of windows or sequences.

A thin shell over the two halves of loading: the plan (`planning.loader_plan`: samples, order, packed steps per
rank; an epoch's plan is a pure function of manifest, spec, batching, seed, epoch and world size) and the chain
that runs it (`loading.assembly`: fetch -> align -> decode -> settle -> collate -> device, in workers that live
across epochs). It keeps the run's position (`loading.state`) and the stats; each rank iterates its own steps
with no collective call, and batches come out in plan order whatever the worker count.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any, Literal

from mmdata.checks import option_int
from mmdata.errors import OptionError, SpecError
from mmdata.loading.assembly import ChainAssembly
from mmdata.loading.autotune import WorkerTuner
from mmdata.loading.feed import Feed
from mmdata.loading.loader_options import (
    TORCH_DEFAULTS,
    Batching,
    Reading,
    Runtime,
    Shuffling,
    plan_settings,
    resolve_options,
)
from mmdata.loading.loader_stats import LoaderStats
from mmdata.loading.micro_batch import OnError
from mmdata.loading.normalize import attach_normalizers
from mmdata.loading.state import MAX_EPOCH, RunPosition
from mmdata.loading.timing import Stage, enable_profiler_ranges
from mmdata.planning.episodes import Episodes
from mmdata.planning.loader_plan import plan_loader
from mmdata.planning.mixture import Mixture, as_mixture, check_sources, open_sources
from mmdata.planning.orders import Shuffle
from mmdata.planning.planner import EpochPlan
from mmdata.planning.ranks import rank_and_world
from mmdata.planning.specs import Spec
from mmdata.store.dataset import Dataset
from mmdata.store.handle import Store


class DataLoader:
    """Batches of `spec` samples from the store at `dataset` (a path, a URL, or an open `Store` or
    `Dataset`), or from several stores at once: a `Mixture` of weighted sources (see
    `mmdata.planning.mixture`). `episodes` filters a single store's episodes.

    The options `torch.utils.data.DataLoader` has are spelled as PyTorch spells them (`batch_size`, `shuffle`,
    `num_workers`, `prefetch_factor`, `drop_last`, `pin_memory`, `persistent_workers`, `timeout`; see
    `mmdata.loading.loader_options.TorchOptions`); the rest come in groups: `batching` (a `Batching`: a token
    budget instead of `batch_size`, layout, balance across ranks), `shuffling` (a `Shuffling`: how the order
    `shuffle` names deals its samples), `runtime` (a `Runtime`: device, decoder and where it decodes, rank and
    world size) and `reading` (a `Reading`: checksums, memory caches, the `ReadPolicy` of the stores it opens).
    Each rank gets the same number of steps; `len(loader)` is that number for the epoch.

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
        batch_size: int | None = None,
        shuffle: Shuffle | bool = "auto",
        *,
        num_workers: int | Literal["auto"] = "auto",
        prefetch_factor: int = 2,
        drop_last: bool = False,
        pin_memory: bool | None = None,
        persistent_workers: bool = True,
        timeout: float = 0.0,
        seed: int = 0,
        episodes: Episodes | None = None,
        batching: Batching | None = None,
        shuffling: Shuffling | None = None,
        runtime: Runtime | None = None,
        reading: Reading | None = None,
        on_error: OnError = "raise",
        **ungrouped: Any,
    ):
        torch_words = {
            "batch_size": batch_size,
            "shuffle": shuffle,
            "num_workers": num_workers,
            "prefetch_factor": prefetch_factor,
            "drop_last": drop_last,
            "pin_memory": pin_memory,
            "persistent_workers": persistent_workers,
            "timeout": timeout,
        }
        torch_given = {  # (a word left at its default, `TorchOptions`', is not given)
            name: value
            for name, value in torch_words.items()
            if value is not TORCH_DEFAULTS[name] and value != TORCH_DEFAULTS[name]
        }
        groups = {"batching": batching, "shuffling": shuffling, "runtime": runtime, "reading": reading}
        options = resolve_options(torch_given, groups, ungrouped)
        batching, shuffling, runtime, reading = options.batching, options.shuffling, options.runtime, options.reading
        if on_error not in ("raise", "skip"):
            raise OptionError(f"on_error is 'raise' or 'skip', not '{on_error}'")
        option_int(seed, "seed", 0, 1 << 62)
        self.options = options.torch
        self.batching, self.shuffling, self.runtime, self.reading = batching, shuffling, runtime, reading
        self.spec, self.on_error, self.layout = spec, on_error, batching.layout
        self.rank, self.world_size = rank_and_world(runtime.rank, runtime.world_size)
        enable_profiler_ranges(runtime.profiler_ranges)
        self.device = runtime.resolved_device()
        mixture = as_mixture(dataset, episodes)
        self.mixture = dataset if isinstance(dataset, Mixture) else None
        self.sources = open_sources(mixture, reading.verify, reading.cache_bytes, reading.policy)
        self.store, self.fillers = self.sources[0].store, check_sources(spec, self.sources)
        chain_options = (batching, runtime, reading, options.torch)
        self.chain = ChainAssembly(self.sources, spec, self.fillers, chain_options, on_error, self.device)
        self.decoder, self.decode_in_main = self.chain.decoder, self.chain.decode_in_main
        settings, mixed = plan_settings(options), self.mixture is not None
        plan = plan_loader(self.sources, spec, settings, batching.tokens_per, mixture, mixed, episodes, on_error)
        self.samples, self.planner, self.excluded = plan.samples, plan.planner, plan.excluded
        self.source_targets, self.shuffle = plan.source_targets, plan.settings.shuffle
        attach_normalizers(self.sources, spec, self.source_targets.tolist(), mixture.normalize_with)
        self._position = RunPosition(plan, seed, self.world_size)
        self._stats = LoaderStats()
        self._feed: Feed | None = None
        self._tuner: WorkerTuner | None = None  # the last closed feed's, with num_workers="auto"

    def epoch_plan(self) -> EpochPlan:
        """The plan of the current epoch at this world size, from where the state says the run is."""
        planning = time.perf_counter()
        plan, made = self._position.epoch_plan()
        if made:
            self._stats.add_main(Stage.PLAN, time.perf_counter() - planning)
        return plan

    def __len__(self) -> int:
        return self.epoch_plan().total_steps

    @property
    def num_workers(self) -> int:
        """The worker processes reading now (with `num_workers="auto"`, the tuner's latest choice)."""
        if self._feed is not None:
            return self._feed.workers
        return self.chain.workers.first

    @property
    def epoch(self) -> int:
        return self._position.state.epoch

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch` from its beginning (a no-op when already in it); epochs also advance on their own."""
        if self._position.set_epoch(option_int(epoch, "set_epoch's epoch", 0, MAX_EPOCH)):
            self.close()

    def state_dict(self) -> dict[str, Any]:
        """Where the run stands (a few hundred bytes); save it with the model checkpoint."""
        return self._position.to_dict([source.store for source in self.sources])

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state`: the same batches as the run that saved it, or, at another world size,
        the rest of its epoch with no sample repeated or left out."""
        self._position.load(state, [source.store for source in self.sources])
        self.close()
        self.epoch_plan()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        plan = self.epoch_plan()
        if plan.total_steps == 0:
            raise SpecError(
                f"an epoch has no step for {self.world_size} rank(s): the spec gives {len(self.samples)} samples,"
                f" fewer than one micro-batch per rank; use fewer ranks, a smaller batch, or more samples"
                " (a higher anchor_fps, more episodes)"
            )
        epoch, first = self._position.state.epoch, self._position.state.steps_in_epoch
        feed = self._feed_from(epoch, first, plan)
        for expected in range(first, plan.total_steps):
            waited = time.perf_counter()
            try:
                got_epoch, step, batch, record = feed.next()
            except BaseException:
                self.close()
                raise
            if (got_epoch, step) != (epoch, expected):
                self.close()
                raise RuntimeError(f"loader produced epoch {got_epoch} step {step} where {epoch}/{expected} was due")
            waited_for = time.perf_counter() - waited
            self._stats.add_step(record, waited_for, feed.queue_depth())
            self._position.advance(plan)
            if expected == plan.total_steps - 1 and not self.options.persistent_workers:
                self.close()  # (torch's persistent_workers=False: the next epoch starts its workers afresh)
            handed = time.perf_counter()
            yield batch
            loop = time.perf_counter() - handed  # (the training loop's step, between two asks)
            self._stats.add_loop(loop)
            feed.taken(record, waited_for, loop)

    def _feed_from(self, epoch: int, step: int, plan: EpochPlan) -> Feed:
        """The running feed (it stands where the state does: anything that moves the state elsewhere
        closes it); else a new one starting at (epoch, step) of this plan."""
        if self._feed is not None and not self._feed.failed:
            return self._feed
        self.close()
        planning = time.perf_counter()
        steps = self.planner.rank_steps(plan, self.rank)
        self._feed = self.chain.start(
            self.planner, self._position.state.seed, (self.rank, self.world_size), epoch, steps
        )
        self._stats.add_main(Stage.PLAN, time.perf_counter() - planning)
        return self._feed

    def close(self) -> None:
        """Stop the workers and the receiving thread (they otherwise stay up between epochs)."""
        if self._feed is not None:
            self._feed.close()
            self._tuner = self._feed.tuner or self._tuner  # (its settings stay in `stats()`)
        self._feed = None

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()

    def stats(self) -> dict[str, Any]:
        """Totals since the loader was built (or `reset_stats`): steps, samples, tokens, bytes read,
        seconds per stage in the workers and in the main process, data wait and its percentiles,
        frames decoded against delivered and the decoder's CPU per frame decoded, skipped samples, peak RSS per
        worker."""
        snapshot = self._stats.snapshot()
        snapshot["excluded_episodes"] = dict(self.excluded)
        snapshot["sources"] = self._stats.sources([source.name for source in self.sources])
        snapshot["workers"] = self.num_workers
        tuner = self._feed.tuner if self._feed is not None and self._feed.tuner else self._tuner
        if tuner is not None:
            snapshot["autotune"] = {
                "most_workers": tuner.most,
                "read_ahead": tuner.depth,
                "settings": [s.to_dict() for s in tuner.history],
            }
        snapshot.update(self.chain.stats(snapshot["decode_waste"], snapshot["frames_evicted"]))
        return snapshot

    def reset_stats(self) -> None:
        """Start the totals of `stats()` afresh (e.g. after warm-up)."""
        self._stats = LoaderStats()
