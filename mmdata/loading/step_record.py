"""What reading one step measured, carried with its batch from the process that read it to `DataLoader.stats()`."""

from __future__ import annotations

from dataclasses import dataclass, field

from mmdata.codecs.decoders import DecodeStats
from mmdata.loading.frame_cache import FrameCacheStats


@dataclass(frozen=True)
class DecodeCounters:
    """A decoder's and its frame cache's running counts at one moment, to count a step's share as a difference."""

    decoded: int
    delivered: int
    decode_cpu: float
    served: int
    ahead: int
    evicted: int

    @classmethod
    def of(cls, decoder: DecodeStats, cache: FrameCacheStats) -> DecodeCounters:
        return cls(
            decoder.frames_decoded,
            decoder.frames_delivered,
            decoder.cpu_seconds,
            cache.served,
            cache.ahead,
            cache.evicted,
        )

    def delivered_since(self, before: DecodeCounters) -> int:
        """Frames handed to the step's samples since `before`: a frame decoded for a later step counts when that
        step takes it from the cache, not when it is decoded."""
        return self.delivered - before.delivered - (self.ahead - before.ahead) + (self.served - before.served)


@dataclass(slots=True)
class StepRecord:
    """One step's figures: who read it, what it held, each stage's time (keys: `timing.Stage` values) and CPU, the
    bytes it read and the frames it decoded against those it delivered.

    `seconds`/`stage_cpu` add up the stages wherever they ran for the step (the worker's and, for video a worker left
    pending, the main process's decoding); `main_seconds` holds the main process's stages alone.
    """

    worker: int
    pid: int
    samples: int
    tokens: int
    failed: dict[int, str]
    sources: dict[int, list[int]]  # per source: [samples, tokens, failed]
    borrowed: int
    seconds: dict[str, float]
    stage_cpu: dict[str, float]
    busy: float  # wall seconds the worker spent on the step, planning included
    bytes_read: int
    read_retries: int
    frames_decoded: int = 0
    frames_delivered: int = 0
    decode_cpu: float = 0.0
    frame_cache_bytes: int = 0
    frames_evicted: int = 0
    peak_rss: int = 0
    cpu: float | None = None  # a worker's process CPU since its previous step (None: read in the main process)
    main_seconds: dict[str, float] = field(default_factory=dict)

    def add_decoding(self, before: DecodeCounters, after: DecodeCounters) -> None:
        """Count the frames decoded and delivered, the decoder's CPU and the evictions between two counts."""
        self.frames_decoded += after.decoded - before.decoded
        self.frames_delivered += after.delivered_since(before)
        self.decode_cpu += after.decode_cpu - before.decode_cpu
        self.frames_evicted += after.evicted - before.evicted
