"""Which stored video segment each sample starts in: what the "segments" order groups samples by.

Found from the manifest alone: a sample's start time maps to a frame of the spec's first camera (its
rate and first timestamp), and that frame to the segment holding it (the segments' first frames).
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow.compute as pc

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
        segment = _segment_of(store, camera, spec.fps, episodes, table.start[mine])
        widest = int(segment.max(initial=0)) + 1
        blocks[mine] = offset + episodes * widest + np.maximum(segment, 0)
        offset += (int(episodes.max(initial=-1)) + 1) * widest
    return blocks


def _segment_of(store: Store, camera: str, fps: float, episodes: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The segment of `camera` each sample starts in (-1 before the first), from the manifest's segment lists
    read as columns: every episode's first frames in one array, keyed by (row, first frame), searched at once."""
    columns = store.columns([f"{camera}/segments", f"{camera}/t_start"])
    lists = columns.column(f"{camera}/segments").combine_chunks()
    firsts = pc.struct_field(pc.list_flatten(lists), "first_frame").to_numpy(zero_copy_only=False).astype(np.int64)
    owners = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False).astype(np.int64)
    begins = np.searchsorted(owners, np.arange(len(lists)))  # each row's first segment in the flat array
    t_start = columns.column(f"{camera}/t_start").to_numpy(zero_copy_only=False)
    frames = np.rint(np.nan_to_num((starts - t_start[episodes]) * fps)).astype(np.int64)  # (NaN: a damaged row's)
    found = np.searchsorted(owners * _ROW_SPAN + firsts, episodes * _ROW_SPAN + frames, side="right") - 1
    return found - begins[episodes]


def segment_life_steps(blocks: np.ndarray, open_segments: int, step_samples: int) -> int | None:
    """How many of its lane's steps a segment stays open in the "segments" order (`planning.order`): a lane draws
    one sample from each of its `open_segments` segments in turn, `step_samples` a step, so a segment of `n`
    samples is open for `n * open_segments / step_samples` of them; `n` is the 90th percentile over the
    segments (a few long ones do not set it). None without samples."""
    if len(blocks) == 0:
        return None
    _, counts = np.unique(np.asarray(blocks, dtype=np.int64), return_counts=True)
    return math.ceil(float(np.percentile(counts, 90)) * open_segments / step_samples)


_ROW_SPAN = 1 << 40  # more frames than an episode holds: (row, frame) as one sortable number

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
