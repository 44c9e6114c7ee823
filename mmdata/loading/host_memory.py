"""Where a batch's host tensors are allocated: in shared memory inside a DataLoader worker, as torch's
own collate does, so the batch crosses to the main process without another copy; as usual elsewhere."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch.utils.data import get_worker_info


def shared_output(like: torch.Tensor, leading: tuple[int, ...]) -> torch.Tensor | None:
    """In a DataLoader worker, an uninitialised tensor of shape `leading + like.shape[1:]` in shared memory
    (`out=` for torch.cat/stack). None elsewhere (torch allocates as usual)."""
    if like.device.type != "cpu" or get_worker_info() is None:
        return None
    shape = (*leading, *like.shape[1:])
    storage = like._typed_storage()._new_shared(math.prod(shape), device=like.device)
    return like.new(storage).resize_(shape)


def host_frames(count: int, frame_shape: tuple[int, ...]) -> torch.Tensor:
    """Room for `count` uint8 frames of `frame_shape`, uninitialised: a batch's camera, decoded samples
    written straight into it (in shared memory inside a worker)."""
    like = torch.empty((0, *frame_shape), dtype=torch.uint8)
    shared = shared_output(like, (count,))
    return shared if shared is not None else torch.from_numpy(np.empty((count, *frame_shape), np.uint8))
