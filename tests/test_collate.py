"""Collate hands a camera's decoded frames on as the decode stage wrote them, in one tensor, without copying
them again; when a sample's frames came from elsewhere (a replaced sample) it copies, with the same result."""

from __future__ import annotations

import numpy as np
import torch

from mmdata.loading.collate import collate
from mmdata.loading.micro_batch import MicroBatch
from mmdata.planning.samples import SampleRef


def micro_batch(frames_per_sample: int = 2, samples: int = 3) -> tuple[MicroBatch, torch.Tensor]:
    buffer = torch.arange(samples * frames_per_sample * 4 * 5 * 3, dtype=torch.int64).to(torch.uint8)
    buffer = buffer.reshape(samples * frames_per_sample, 4, 5, 3)
    rows = buffer.numpy()
    refs = [SampleRef(i, i, f"episode_{i}", "shard", 0.0, 1.0, 0, 1) for i in range(samples)]
    batch = MicroBatch(0, refs, ["task"] * samples)
    batch.values["cam"] = [rows[i * frames_per_sample : (i + 1) * frames_per_sample] for i in range(samples)]
    batch.is_pad["cam"] = [np.zeros(frames_per_sample, bool) for _ in range(samples)]
    batch.frame_buffers["cam"] = buffer
    return batch, buffer


def test_collate_passes_the_decoded_frame_buffer_on_without_a_copy_in_both_layouts():
    for layout, shape in (("packed", (6, 4, 5, 3)), ("padded", (3, 2, 4, 5, 3))):
        batch, buffer = micro_batch()
        out = collate(batch, layout=layout)
        assert out["cam"].data_ptr() == buffer.data_ptr() and tuple(out["cam"].shape) == shape


def test_collate_copies_when_a_samples_frames_are_not_the_buffers_own():
    batch, buffer = micro_batch()
    expected = collate(micro_batch()[0], layout="padded")["cam"].clone()
    batch.values["cam"][1] = batch.values["cam"][1].copy()  # as a replaced sample's borrowed frames
    out = collate(batch, layout="padded")
    assert out["cam"].data_ptr() != buffer.data_ptr() and torch.equal(out["cam"], expected)
