"""Decode stored video segments to RGB frames on the CPU with PyAV."""

from __future__ import annotations

import io
from collections.abc import Sequence

import av
import numpy as np

from mmdata.errors import DecodeError


def decode_segment(data: bytes, frame_indices: Sequence[int] | None = None) -> np.ndarray:
    """All frames of one segment, or those at `frame_indices`, as uint8 `[F, H, W, 3]`.

    Decoding stops after the last requested frame: nothing past it is decoded.
    """
    wanted = None if frame_indices is None else sorted(set(int(i) for i in frame_indices))
    last = None if wanted is None else (wanted[-1] if wanted else -1)
    frames: dict[int, np.ndarray] = {}
    try:
        with av.open(io.BytesIO(data)) as container:
            for index, frame in enumerate(container.decode(video=0)):
                if last is not None and index > last:
                    break
                if wanted is None or index in wanted:
                    frames[index] = frame.to_ndarray(format="rgb24")
    except av.error.FFmpegError as exc:
        raise DecodeError(f"video segment does not decode: {exc}") from exc
    if wanted is None:
        if not frames:
            raise DecodeError("video segment holds no frames")
        return np.stack([frames[i] for i in range(len(frames))])
    missing = [i for i in wanted if i not in frames]
    if missing:
        raise DecodeError(f"video segment has {len(frames)} frames; frames {missing} requested")
    order = [int(i) for i in frame_indices]
    if not order:
        return np.empty((0, 0, 0, 3), dtype=np.uint8)
    return np.stack([frames[i] for i in order])
