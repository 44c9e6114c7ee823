"""The loading chain as a DataLoader runs it: the decoder and where it decodes, then per run of steps a reader
(fetch -> align -> decode -> settle -> collate, `loading/chain.py`), the source of its steps and the feed that
runs them in workers, with frame caches sized by the frame budget; and the chain's last stage, device.

`DataLoader` keeps the plan and the state and asks this for a feed wherever the state stands (`start`).
"""

from __future__ import annotations

from typing import Any

import torch

from mmdata.loading.chain import BatchReader
from mmdata.loading.decoding import loader_decoder
from mmdata.loading.feed import Feed, Item, StepSource, ring_bytes
from mmdata.loading.frame_budget import (
    FrameBudget,
    delivered_frame_sizes,
    frame_bytes_per_batch,
    horizon_for,
    loader_frame_budget,
    waste_cause,
)
from mmdata.loading.loader_options import Batching, Reading, Runtime, TorchOptions, WorkerCount, worker_count
from mmdata.loading.micro_batch import MicroBatch, OnError
from mmdata.loading.timing import Stage, timed
from mmdata.planning.mixture import Filler, OpenSource
from mmdata.planning.planner import Planner, RankSteps
from mmdata.planning.specs import Spec

# Micro-batches a worker reads ahead of the main process when their video is decoded there.
MAIN_DECODE_AHEAD = 2


class ChainAssembly:
    """What a loader reads and decodes with (its open `sources`, `spec`, the `fillers` of streams a source lacks,
    the options), and how it starts a feed over a rank's steps and finishes the items that feed yields."""

    def __init__(
        self,
        sources: list[OpenSource],
        spec: Spec,
        fillers: dict[str, Filler],
        options: tuple[Batching, Runtime, Reading, TorchOptions],
        on_error: OnError,
        device: torch.device,
    ):
        self.sources, self.spec, self.fillers, self.on_error, self.device = sources, spec, fillers, on_error, device
        self.batching, self.runtime, self.reading, self.torch_options = options
        self.workers = worker_count(self.torch_options.num_workers, self.runtime.cpu_budget)
        self.decoder = loader_decoder(self.runtime.decoder, spec, sources, device, self.workers.most)
        decode_in = self.runtime.decode_in
        self.decode_in_main = decode_in == "main" if decode_in else self.decoder.device == "gpu"
        if self.decode_in_main and self.workers.auto:  # (a main-process decoder follows each worker's frame cache)
            self.workers = WorkerCount(self.workers.first, self.workers.first, False)
        self.frame_budget: FrameBudget | None = None  # the running feed's frame caches' bound and horizon
        self._reader: BatchReader | None = None  # the running feed's; it also ends main-process batches
        self._reads_ahead: int | None = None  # of this loader's plan: the same for every feed it starts

    def start(self, planner: Planner, seed: int, ranks: tuple[int, int], epoch: int, steps: RankSteps) -> Feed:
        """A feed of `steps` (the rest of `epoch` for rank `ranks[0]` of `ranks[1]`), then of the epochs after it."""
        rank, world_size = ranks
        batching, pin = self.batching, self.torch_options.pin_memory
        collate_options = {
            "layout": batching.layout,
            "attention_mask": batching.attention_mask,
            "pad_to_multiple": batching.pad_to_multiple,
        }
        read_bytes = frame_bytes_per_batch(self.spec, self.fillers, batching.batch_size)
        if self._reads_ahead is None:  # a pass over every sample's segment: once, not at every epoch or resume
            self._reads_ahead = reads_ahead(planner, world_size, self.workers.first)
        budget = self.frame_budget = self._frame_budget(read_bytes, self._reads_ahead)
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
        return Feed(
            StepSource(reader, planner, seed, rank, world_size, epoch, steps),
            self.finish,
            self.workers,
            self.torch_options.prefetch_factor,
            pin_memory=(self.device.type == "cuda" if pin is None else pin) and torch.cuda.is_available(),
            background=self.decode_in_main,
            ahead=MAIN_DECODE_AHEAD,
            frame_bytes=read_bytes,
            timeout=self.torch_options.timeout,
            lanes=planner.lanes,
        )

    def finish(self, item: Item) -> Item:
        """Decode what the workers left pending (main-process decoding), collate, and move to the device."""
        epoch, step, output, record = item
        main: dict[str, float] = {}
        if isinstance(output, MicroBatch):
            assert self._reader is not None, "a micro-batch came from a feed this assembly did not start"
            output = self._reader.finish_counted(output, record, main)
        if self.device.type != "cpu":
            with timed(main, Stage.H2D):
                output = {
                    key: value.to(self.device, non_blocking=True) if isinstance(value, torch.Tensor) else value
                    for key, value in output.items()
                }
        record.main_seconds = main
        return epoch, step, output, record

    def stats(self, decode_waste: float, frames_evicted: int) -> dict[str, Any]:
        """The decoder's and the frame caches' part of `DataLoader.stats()`."""
        budget = self.frame_budget
        cause = waste_cause(decode_waste, frames_evicted, budget, delivered_frame_sizes(self.spec, self.fillers))
        figures = {
            "decoder": self.decoder.describe(),
            "frame_cache": budget.snapshot() if budget is not None else None,
            "decode_waste_cause": cause,
        }
        if self.decode_in_main:
            figures["main_process_decode"] = self.decoder.stats.snapshot()
        return figures

    def _frame_budget(self, read_bytes: int | None, longest: int) -> FrameBudget:
        """Each frame cache's bound and horizon for reads of `read_bytes`, planning `longest` reads ahead where the
        memory holds them (see `frame_budget.loader_frame_budget`)."""
        workers = self.workers.most  # (sized for the most workers there may be: memory holds whatever the count)
        rings = ring_bytes(read_bytes, self.torch_options.prefetch_factor, MAIN_DECODE_AHEAD) if workers else 0
        on_gpu = self.decode_in_main and self.decoder.device == "gpu" and self.device.type == "cuda"
        gpu = self.device if on_gpu else None
        given = self.reading.frame_cache_bytes
        return loader_frame_budget(read_bytes, workers, rings, given, gpu, longest)


def reads_ahead(planner: Planner, world_size: int, num_workers: int) -> int:
    """The reads a frame cache plans ahead when its memory allows: a segment's life in one cache's reads in the
    "blocks" order (`frame_budget.horizon_for`), so that each segment is decoded in one pass."""
    return horizon_for(planner.segment_life_steps(world_size), planner.batching.lanes, num_workers)
