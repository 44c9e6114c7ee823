"""How many samples make a block of the "blocks" order: about a stored segment's worth, so that one decode serves a
block. Found from the manifest's first rows alone."""

from __future__ import annotations

import numpy as np

from mmdata.planning.specs import Sequences, Spec
from mmdata.schema import VideoStream
from mmdata.store.handle import Store

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
