"""How many bytes of decoded frames each frame cache may hold, and how many steps ahead it plans: from the
plan's working set, within a stated share of the machine's memory.

A worker's cache keeps, from each segment it decodes, the frames its next `horizon` reads need (see
`mmdata.loading.frame_cache`), so at most `horizon + 1` reads' frames at once: reads x frames per read x
frame bytes (fewer where samples share frames). A bound of that size evicts nothing a later read needs; a
smaller one evicts frames that come back and are decoded again (at 480x640, a fixed 256 MB made every frame
decoded 5.7 times). So the bound is that working set, unless it is given.

The longer the horizon, the fewer times a segment is decoded: a segment's samples reach a worker over many
reads (in the "blocks" order a 32-frame segment's 32 anchors span 128 reads of a worker with 8 lanes over 2
workers), and each pass over it starts again from the key frame before its first wanted frame. A horizon of
`LONGEST_HORIZON` reads decodes such a segment in one pass (480x640 policy windows: 8.1 ms of CPU per sample
at 32 reads, 6.3 ms at 128). All the caches of a loader and the workers' frame rings share `MEMORY_SHARE`
of the memory available where the frames are kept (the host's, shared among the node's ranks, or the GPU's
for a GPU decoder in the main process); a working set above a cache's share shortens its horizon until it
fits, rather than letting it evict: frames needed further ahead are then decoded again when their step
comes, which `loader.stats()` names (`waste_cause`).
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import asdict, dataclass

import numpy as np
import torch

from mmdata.loading.frame_cache import HORIZON
from mmdata.planning.mixture import Filler
from mmdata.planning.specs import Frames, Spec, Windows

# Of the memory available to this rank when the loader is built: what its frame caches and frame rings may take.
MEMORY_SHARE = 0.25
# The reads a cache plans ahead when its memory allows, unless a segment stays open longer in its reads (a given
# bound keeps `frame_cache.HORIZON`); and the most it ever plans ahead.
LONGEST_HORIZON = 128
MOST_READS_AHEAD = 1024
# The bound when a read's frames are not known ahead (token budgets of unbounded sequences).
UNSIZED_BOUND = 256 << 20
# Decode waste above this is named in `loader.stats()` and `mmdata bench`, with its cause and fix.
WASTE_LIMIT = 1.5
MIB = 1 << 20


@dataclass(frozen=True)
class FrameBudget:
    """Each frame cache's byte `bound` and `horizon` (reads planned ahead); the `working_set` of one cache at
    the full horizon (None where a read's frames are unknown ahead); each cache's share of the memory
    (`share`, its frame ring taken out) and what all caches and rings may take (`total`), of `available`
    bytes of `memory` ("host" or "GPU n"); `given`: the bound was set (`Reading(frame_cache_bytes=N)`)."""

    bound: int
    horizon: int
    working_set: int | None
    share: int
    total: int
    available: int
    memory: str
    caches: int
    given: bool
    longest: int = LONGEST_HORIZON  # the horizon the plan asks for: a segment's life in a cache's reads

    def describe(self) -> str:
        """One line: the bound, where it comes from, and the budget it lies in."""
        origin = "given" if self.given else "the working set of the plan"
        if not self.given and self.working_set is None:
            origin = "a fixed bound: a read's frames are not known ahead"
        longest = HORIZON if self.given else self.longest
        shortened = f", horizon shortened to {self.horizon} of {longest} reads" if self.horizon < longest else ""
        return (
            f"{size_text(self.bound)} per cache ({origin}{shortened}) x {self.caches} in {self.memory} memory;"
            f" the budget {size_text(self.share)} per cache, {size_text(self.total)} in all with the frame"
            f" rings ({MEMORY_SHARE:.0%} of {size_text(self.available)} available)"
        )

    def snapshot(self) -> dict:
        return {**asdict(self), "describe": self.describe()}


def plan_frame_budget(
    read_bytes: int | None,
    caches: int,
    ring_bytes: int,
    given: int | None,
    available: int,
    memory: str = "host",
    longest: int = LONGEST_HORIZON,
) -> FrameBudget:
    """The budget of `caches` frame caches (one per worker, or the main process's) whose reads hold `read_bytes`
    of decoded frames (None: unknown ahead), beside `ring_bytes` of frame ring per cache, in `available` bytes
    of `memory`; `given` is the user's bound (None: derive it); `longest`, the reads to plan ahead when the
    memory holds them (`horizon_for`)."""
    caches = max(1, caches)
    total = int(available * MEMORY_SHARE)
    share = max(0, total // caches - ring_bytes)
    working = ((HORIZON if given is not None else longest) + 1) * read_bytes if read_bytes else None
    budget = functools.partial(
        FrameBudget,
        share=share,
        total=total,
        available=available,
        memory=memory,
        caches=caches,
        longest=longest,
        working_set=working,
    )
    if given is not None:
        return budget(bound=given, horizon=HORIZON, given=True)
    if not read_bytes:
        return budget(bound=min(UNSIZED_BOUND, share), horizon=HORIZON, given=False)
    horizon = min(longest, max(1, share // read_bytes - 1))
    return budget(bound=min((horizon + 1) * read_bytes, share), horizon=horizon, given=False)


def frame_bytes_per_batch(spec: Spec, fillers: dict[str, Filler], batch_size: int | None) -> int | None:
    """About what a batch's decoded frames take: frames per sample x frame bytes x samples, for windows and
    bounded sequences in batches of a size (None otherwise)."""
    if batch_size is None:
        return None
    total = 0
    for name, stream in spec.streams.items():
        if not isinstance(stream, Frames):
            continue
        if isinstance(spec, Windows):
            count = len(stream.offsets)
        elif spec.max_seconds is not None:
            count = math.ceil(spec.max_seconds * spec.rate_of(name)) + 1
        else:
            return None
        total += count * math.prod(fillers[name].shape) * np.dtype(stream.dtype).itemsize
    return total * batch_size


def delivered_frame_sizes(spec: Spec, fillers: dict[str, Filler]) -> str:
    """The cameras' delivered frame sizes, for messages: "cam_high 640x480, cam_wrist 640x480"."""
    sizes = []
    for name, stream in spec.streams.items():
        if isinstance(stream, Frames):
            shape = fillers[name].shape
            height, width = (shape[1], shape[2]) if stream.channels_first else (shape[0], shape[1])
            sizes.append(f"{name} {width}x{height}")
    return ", ".join(sizes)


def horizon_for(segment_life_steps: int | None, lanes: int, workers: int) -> int:
    """The reads a cache should plan ahead: in the "blocks" order, the reads a segment stays open for in one
    cache (`segment_life_steps` of its lane, whose steps reach a cache every `lanes / workers` reads, so a
    segment is decoded in one pass), and never fewer than `LONGEST_HORIZON` nor more than `MOST_READS_AHEAD`."""
    if segment_life_steps is None:
        return LONGEST_HORIZON
    lanes_per_cache = max(1, math.ceil(lanes / max(1, workers)))
    return min(MOST_READS_AHEAD, max(LONGEST_HORIZON, segment_life_steps * lanes_per_cache))


def loader_frame_budget(
    read_bytes: int | None,
    workers: int,
    ring_bytes: int,
    given: int | str,
    gpu: torch.device | None,
    longest: int = LONGEST_HORIZON,
) -> FrameBudget:
    """A loader's frame caches' budget: one cache per worker (or the main process's) whose reads hold `read_bytes`,
    beside `ring_bytes` of frame ring each, in the host's available memory, or in `gpu`'s free memory for a GPU
    decoder in the main process; `given` is `Reading(frame_cache_bytes=...)` ("auto": derived from the plan);
    `longest`, the reads to plan ahead when the memory holds them (`horizon_for`)."""
    bound = None if given == "auto" else int(given)
    if gpu is not None:
        free, _ = torch.cuda.mem_get_info(gpu)
        return plan_frame_budget(read_bytes, max(1, workers), 0, bound, free, f"GPU {gpu.index}", longest)
    return plan_frame_budget(read_bytes, max(1, workers), ring_bytes, bound, available_host_memory(), "host", longest)


def available_host_memory() -> int:
    """Bytes of memory this rank may count on: what the machine can give without swapping (MemAvailable, else
    half its memory), shared among the ranks of its node (torchrun's LOCAL_WORLD_SIZE)."""
    try:
        ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        ranks = 1
    return _machine_available() // ranks


def _machine_available() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (OSError, ValueError):
        return 8 << 30


def waste_cause(decode_waste: float, evicted: int, budget: FrameBudget | None, frame_sizes: str) -> str | None:
    """Why frames were decoded more than `WASTE_LIMIT` times each, and what to change; None below it."""
    if decode_waste <= WASTE_LIMIT:
        return None
    waste = f"each delivered frame ({frame_sizes}) was decoded {decode_waste:.2f} times"
    if budget is None or budget.bound == 0:
        return f"{waste}: the frame cache is off; leave Reading(frame_cache_bytes='auto') to size it from the plan"
    if evicted:
        kept = f"the frame cache's bound ({size_text(budget.bound)} per cache"
        if budget.given:
            return (
                f"{waste}: {kept}, given) is below the frames of the next {budget.horizon} reads"
                f" ({size_text(budget.working_set or 0)}), so it evicted {evicted} frames later reads needed"
                " and they were decoded again; leave Reading(frame_cache_bytes='auto') to size it from the plan"
            )
        return (
            f"{waste}: {kept}, all its memory budget allows) evicted {evicted} frames later reads needed; give it more"
            " memory (fewer workers, a smaller batch, smaller frames with Frames(resize=...))"
        )
    longest = HORIZON if budget.given else budget.longest
    if budget.horizon < longest:
        return (
            f"{waste}: the memory budget ({size_text(budget.share)} per cache) holds only {budget.horizon} of"
            f" {longest} reads' frames, so frames further ahead are decoded again; give it more memory (fewer"
            " workers, a smaller batch, smaller frames with Frames(resize=...))"
        )
    return (
        f"{waste}: decoding a wanted frame starts at the key frame before it and passes the frames the spec skips;"
        " convert with `--access windows` (every frame a key frame) where the spec asks for sparse frames"
    )


def size_text(count: int) -> str:
    """Bytes as people read them: "928 MiB", "1,000 bytes"."""
    return f"{count / MIB:,.0f} MiB" if count >= MIB else f"{count:,} bytes"
