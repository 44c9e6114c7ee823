"""Which stored video segment each sample starts in: what the "segments" order groups samples by.

Found from the manifest alone: a sample's start time maps to a frame of the spec's first camera (its
rate and first timestamp), and that frame to the segment holding it (the segments' first frames).
"""

from __future__ import annotations

import math

import numpy as np

from mmdata.planning.samples import SampleTable
from mmdata.planning.specs import Sequences, Spec
from mmdata.schema import VideoStream
from mmdata.store.handle import Store


def segment_blocks(table: SampleTable, stores: list[Store], cameras: list[str | None]) -> np.ndarray:
    """A number per sample, the same for the samples that start in the same segment of the same episode
    of the same source (`cameras[source]`: the stored camera to go by; None: every episode is one block)."""
    blocks = np.zeros(len(table), np.int64)
    offset = 0
    for source, (store, camera) in enumerate(zip(stores, cameras)):
        mine = np.flatnonzero(table.source == source)
        spec = store.schema.stream(camera) if camera is not None else None
        episodes = table.episode[mine]
        if not isinstance(spec, VideoStream):
            blocks[mine] = offset + episodes
            offset += int(episodes.max(initial=-1)) + 1
            continue
        segment = np.zeros(len(mine), np.int64)
        starts = table.start[mine]
        by_episode = np.argsort(episodes, kind="stable")  # one pass per episode, not a mask over all samples each
        bounds = np.flatnonzero(np.diff(episodes[by_episode])) + 1
        for here in np.split(by_episode, bounds) if len(mine) else ():
            row = store.manifest.row(int(episodes[here[0]]))
            firsts = np.asarray([s["first_frame"] for s in row[f"{camera}/segments"]], np.int64)
            frames = np.rint((starts[here] - row[f"{camera}/t_start"]) * spec.fps).astype(np.int64)
            segment[here] = np.searchsorted(firsts, frames, side="right") - 1
        widest = int(segment.max(initial=0)) + 1
        blocks[mine] = offset + episodes * widest + np.maximum(segment, 0)
        offset += (int(episodes.max(initial=-1)) + 1) * widest
    return blocks


def segment_life_steps(blocks: np.ndarray, open_segments: int, step_samples: int) -> int | None:
    """How many of its lane's steps a segment stays open in the "segments" order (`planning.order`): a lane draws
    one sample from each of its `open_segments` segments in turn, `step_samples` a step, so a segment of `n`
    samples is open for `n * open_segments / step_samples` of them; `n` is the 90th percentile over the
    segments (a few long ones do not set it). None without samples."""
    if len(blocks) == 0:
        return None
    _, counts = np.unique(np.asarray(blocks, dtype=np.int64), return_counts=True)
    return math.ceil(float(np.percentile(counts, 90)) * open_segments / step_samples)


# Samples per block of the "blocks" order when no camera is read (a block then only keeps an episode's
# low-dim reads together).
LOW_DIM_BLOCK = 32
_ROWS_SAMPLED = 16


def block_samples(store: Store, camera: str | None, spec: Spec) -> int:
    """Samples per block of the "blocks" order (`planning.block_order`): the windows a stored segment of
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
