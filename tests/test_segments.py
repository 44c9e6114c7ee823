"""`planning.segments.segment_blocks`: what the "segments" order groups samples by. Samples share a block exactly
when they start in the same stored segment of the same episode of the same source, as the store's own frame
alignment places them."""

from __future__ import annotations

import numpy as np

import mmdata
from mmdata.planning.samples import concatenate_samples, enumerate_samples
from mmdata.planning.segments import segment_blocks

SPEC = mmdata.Windows(anchor_fps=30, streams={"cam_high": mmdata.Frames(offsets=[0.0])})


def _table(store: mmdata.Store):
    return enumerate_samples(store.manifest.table, SPEC, np.arange(store.schema.num_episodes))


def _segment_of(store: mmdata.Store, episode: int, time: float) -> tuple[int, int]:
    plan = store.align_frames(episode, "cam_high", [time])
    return episode, plan.requests[0].where.segment


def test_samples_share_a_block_exactly_when_they_start_in_the_same_segment_of_the_same_episode(stores):
    store = mmdata.open_store(stores["wds"])
    table = _table(store)
    blocks = segment_blocks(table, [store], ["cam_high"])
    segments = [_segment_of(store, int(e), float(t)) for e, t in zip(table.episode, table.start)]
    by_block: dict[int, set] = {}
    for block, segment in zip(blocks.tolist(), segments):
        by_block.setdefault(block, set()).add(segment)
    assert all(len(found) == 1 for found in by_block.values()), "a block holds samples of one segment"
    assert len(by_block) == len(set(segments)), "and each segment's samples are one block"
    assert len(by_block) > store.schema.num_episodes, "(the store's episodes have several segments each)"


def test_without_a_camera_to_go_by_each_episode_is_one_block(stores):
    store = mmdata.open_store(stores["wds"])
    table = _table(store)
    blocks = segment_blocks(table, [store], [None])
    assert np.array_equal(blocks, table.episode)


def test_the_blocks_of_two_sources_never_meet(stores):
    first, second = mmdata.open_store(stores["wds"]), mmdata.open_store(stores["zarr"])
    one, two = _table(first), _table(second)
    both = concatenate_samples([one, two])
    blocks = segment_blocks(both, [first, second], ["cam_high", None])
    assert not set(blocks[both.source == 0].tolist()) & set(blocks[both.source == 1].tolist())
    assert len(set(blocks[both.source == 1].tolist())) == second.schema.num_episodes
