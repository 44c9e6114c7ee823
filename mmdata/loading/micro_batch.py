"""The unit every loading stage passes on: one rank's micro-batch, from its planned samples to the
values collate turns into tensors (see `mmdata.loading.chain` for the stages)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from mmdata.codecs.decoders import ClipRequest
from mmdata.loading.frame_cache import CacheSchedule
from mmdata.planning.samples import SampleRef
from mmdata.store.handle import FrameRequests

OnError = Literal["raise", "skip"]


@dataclass
class PendingVideo:
    """One camera of a micro-batch between aligning and decoding.

    `plans` per sample (None where it failed), the segment requests merged across samples
    (`merged`, and per plan request its (merged index, frame positions) in `sources`), the
    decoder's host-side preparation of them when it has one, the shape of one delivered frame, per
    merged request the key of its decoded frames in a frame cache (None: not cacheable), whether the
    decoder delivers them channels-first already (else they are transposed when gathered), and whether they
    are delivered as float32 in [0, 1] (divided by 255 as they are gathered).
    """

    plans: list[FrameRequests | None]
    merged: list[ClipRequest]
    sources: list[tuple[int, np.ndarray]]
    prepared: Any = None
    frame_shape: tuple[int, ...] = ()
    channels_first: bool = False
    keys: list[Any] = field(default_factory=list)
    decoded_channels_first: bool = False
    unit_float: bool = False

    @property
    def transposes(self) -> bool:
        """Whether gathering turns the decoded `[H, W, 3]` frames into the `[3, H, W]` the stream delivers."""
        return self.channels_first and not self.decoded_channels_first


@dataclass
class MicroBatch:
    """One rank's micro-batch, read: per stream, each sample's values and `is_pad` mask.

    `pending` holds cameras still to decode; `failed` maps a sample's position to what went wrong;
    `replaced` lists (position, substitute position) pairs; `fallback` is the samples planned after
    this micro-batch (in plan order), of which `borrowed` maps a position to the one read in its
    place when every sample failed. `dim_is_pad` holds, per `Values(pad_to=...)` stream, each
    sample's mask of padded dimensions. `seconds` is the time each stage took on it, `cpu_seconds` the CPU time
    of the thread that ran it (a stage that runs in the main process adds there). `frame_buffers` holds,
    per camera decoded on the host, the tensor its samples' frames were written into (their values are views
    of it, in order), which collate hands on as it is when no sample was replaced. `cache_schedule` is what the
    worker's frame cache planned at this read, for the process that decodes its pending video.
    """

    step: int
    samples: list[SampleRef]
    tasks: list[str]
    values: dict[str, list[Any]] = field(default_factory=dict)
    is_pad: dict[str, list[np.ndarray | None]] = field(default_factory=dict)  # None: the sample failed
    pending: dict[str, PendingVideo] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    replaced: list[tuple[int, int]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    fallback: list[SampleRef] = field(default_factory=list)
    borrowed: dict[int, SampleRef] = field(default_factory=dict)
    dim_is_pad: dict[str, list[np.ndarray]] = field(default_factory=dict)
    failed_sources: dict[int, int] = field(default_factory=dict)
    frame_buffers: dict[str, Any] = field(default_factory=dict)
    cache_schedule: CacheSchedule | None = None


def sample_place(sample: SampleRef, stream: str) -> str:
    """Where a sample lives, for error messages: shard, episode, stream, time."""
    return (
        f"shard '{sample.shard}', episode '{sample.key}', stream '{stream}'"
        f" (sample {sample.index} at t={sample.start:.3f} s)"
    )


def source_counts(batch: MicroBatch) -> dict[int, list[int]]:
    """[samples, tokens, failed] per source of a read micro-batch (failed ones as planned)."""
    counts: dict[int, list[int]] = {}
    for sample in batch.samples:
        entry = counts.setdefault(sample.source, [0, 0, 0])
        entry[0] += 1
        entry[1] += sample.cost
    for source in batch.failed_sources.values():
        counts.setdefault(source, [0, 0, 0])[2] += 1
    return counts
