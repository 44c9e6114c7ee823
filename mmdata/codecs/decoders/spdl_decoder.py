"""Whole segments decoded by SPDL in one call each, on a pool of threads that hold no interpreter lock.

The unit of work is a stored segment: its bytes go to SPDL's demuxer and decoder in one native call that
releases the lock, so the pool's threads decode side by side, where a per-packet Python loop (PyAV, the
packet-fed `nvdec`) serialises them. On the host (`SpdlDecoder`, "spdl") FFmpeg decodes the segment up to
its last wanted frame and the compiled colour kernel (`mmdata.codecs.colour`) converts the wanted ones, in
the same thread. On the GPU (`SpdlNvdecDecoder`, "spdl-nvdec") NVDEC decodes the segment into NV12 in device
memory, one decoder per thread (one per decode engine), and the frames of the whole batch become RGB in one
conversion (`mmdata.codecs.nv12`, the CPU path's arithmetic), not one per request.

Frames are 8-bit 4:2:0 converted by BT.601 limited-range rules, as every mmdata store holds them; a segment
of another pixel format is refused by name (decode it with "pyav"). PyAV is imported first: SPDL then loads
PyAV's FFmpeg (`spdl_libraries`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import av  # noqa: F401  (loads the FFmpeg that SPDL's extension then links against)
import numpy as np

from mmdata.codecs.colour import yuv420_frames_to_rgb
from mmdata.codecs.decoders.availability import SPDL_CODECS, SPDL_NVDEC_CODECS
from mmdata.codecs.decoders.base import OnError, VideoDecoder
from mmdata.codecs.decoders.packets import (
    DECODER_NAMES,
    request_rows,
    shown_in_order,
    software_decoder,
    wanted_frames,
)
from mmdata.codecs.decoders.requests import ClipRequest
from mmdata.codecs.nv12 import nv12_to_rgb
from mmdata.errors import DecodeError, OptionError

# NVDEC engines on an H100 or H200 (NVIDIA's Video Codec SDK support matrix): one decoding thread each.
DEFAULT_GPU_THREADS = 7
# Pixel formats the colour rules cover: 8-bit 4:2:0 (the "j" form is full range, refused with the rest).
YUV420 = "yuv420p"
# Decodes a request's segment on the GPU: (request, device id) -> (NV12 `[N, 3H/2, W]` of its first N frames
# in the order they are shown, frames decoded). Tests stand the CPU in for NVDEC here.
NvdecSegment = Callable[[ClipRequest, int], tuple[Any, int]]


class SegmentDecoder(VideoDecoder):
    """What both SPDL backends share: a request's segment is one task on this process's pool of threads."""

    def __init__(self, threads: int):
        super().__init__()
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise OptionError(f"threads is a whole number of at least 1, not {threads!r}")
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_pool": None}

    def _map(self, task: Callable[[ClipRequest], Any], requests: list[ClipRequest]) -> list[Any]:
        """`task` over `requests` on this process's threads (a forked worker starts its own), in order."""
        if self.threads == 1 or len(requests) < 2:
            return [task(request) for request in requests]
        if self._pool is None or self._pid != os.getpid():
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix=f"mmdata-{self.name}")
            self._pid = os.getpid()
        return list(self._pool.map(task, requests))


class SpdlDecoder(SegmentDecoder):
    """Segments decoded by SPDL's FFmpeg on the host, `threads` at a time (see the module)."""

    name = "spdl"
    device = "cpu"
    codecs = SPDL_CODECS

    def __init__(self, threads: int = 1):
        super().__init__(threads)

    def describe(self) -> str:
        return f"spdl (CPU, FFmpeg, {self.threads} thread(s), a segment per call)"

    def _decode_batch(self, requests: list[ClipRequest], on_error: OnError) -> list[Any]:
        return self._settled(requests, self._map(self._attempt, requests), on_error)

    def _attempt(self, request: ClipRequest) -> tuple[Any, int, DecodeError | None]:
        try:
            return (*self._decode_one(request), None)
        except DecodeError as exc:
            return None, 0, exc

    def _decode_one(self, request: ClipRequest) -> tuple[np.ndarray, int]:
        import spdl.io

        if not request.frames:
            return np.empty((0, 0, 0, 3), np.uint8), 0
        packets = demuxed_segment(request)  # used up by decoding: its sizes are read first
        wanted = wanted_frames(request, len(packets))
        width, height = packets.width, packets.height
        count, last = len(packets), int(wanted[-1])
        decoder = spdl.io.decode_config(decoder=software_decoder(request.codec), decoder_options={"threads": "1"})
        try:
            frames = spdl.io.decode_packets(packets, filter_desc=None, decode_config=decoder, num_frames=last + 1)
            latest = None
            for stamp in frames.get_pts():
                latest = shown_in_order(stamp, latest)
            decoded = len(frames)
            if decoded <= last:
                raise DecodeError(f"frames {[int(f) for f in wanted if f >= decoded]} of {count} did not decode")
            planes = spdl.io.to_numpy(spdl.io.convert_frames(frames[wanted.tolist()]))
        except (RuntimeError, ValueError) as exc:  # what SPDL raises for data FFmpeg cannot decode
            raise DecodeError(str(exc)) from exc
        rgb = np.empty((len(wanted), height, width, 3), np.uint8)
        yuv420_frames_to_rgb(planes.reshape(len(wanted), -1), rgb)
        rows = request_rows(wanted, request)
        return (rgb if rows is None else rgb[rows]), decoded


class SpdlNvdecDecoder(SegmentDecoder):
    """Segments decoded by NVDEC through SPDL on GPU `device_id`, one thread per decode engine; the batch's
    frames converted to RGB in one pass (see the module). `decode_segment` replaces NVDEC (the tests)."""

    name = "spdl-nvdec"
    device = "gpu"
    codecs = SPDL_NVDEC_CODECS

    def __init__(
        self, device_id: int = 0, threads: int = DEFAULT_GPU_THREADS, decode_segment: NvdecSegment | None = None
    ):
        super().__init__(threads)
        if not isinstance(device_id, int) or isinstance(device_id, bool) or device_id < 0:
            raise OptionError(f"device_id is a GPU number (0 or more), not {device_id!r}")
        self.device_id = device_id
        self._decode_segment = decode_segment or nvdec_segment

    def describe(self) -> str:
        threads = f"{self.threads} thread(s)"
        return f"spdl-nvdec (GPU {self.device_id}, {threads}, a segment per call, one colour pass per batch)"

    def _decode_batch(self, requests: list[ClipRequest], on_error: OnError) -> list[Any]:
        import torch

        outcomes = self._map(self._attempt, requests)
        converted = batch_nv12_to_rgb([frames for frames, _, _ in outcomes])
        results = [
            (rgb if request.frames else torch.empty((0, 0, 0, 3), dtype=torch.uint8), decoded, failure)
            for request, rgb, (_, decoded, failure) in zip(requests, converted, outcomes)
        ]
        return self._settled(requests, results, on_error)

    def _attempt(self, request: ClipRequest) -> tuple[Any, int, DecodeError | None]:
        """(NV12 of the request's frames in its order, frames decoded, failure); no frames for a request of none."""
        import torch

        if not request.frames:
            return None, 0, None
        try:
            nv12, decoded = self._decode_segment(request, self.device_id)
            wanted = wanted_frames(request, len(nv12))
            rows = request_rows(wanted, request)
            picks = wanted if rows is None else wanted[rows]
            return nv12[torch.as_tensor(picks, device=nv12.device)], decoded, None
        except DecodeError as exc:
            return None, 0, exc
        except (RuntimeError, ValueError) as exc:  # what SPDL raises for a stream NVDEC cannot decode
            return None, 0, DecodeError(f"NVDEC: {exc}")


def demuxed_segment(request: ClipRequest) -> Any:
    """The segment's video packets, demuxed by SPDL, after its codec, frame size and pixel format are checked
    against what the store declares."""
    import spdl.io

    try:
        packets = spdl.io.Demuxer(request.data, name=request.place()).demux_video()
    except (RuntimeError, ValueError) as exc:
        raise DecodeError(f"does not demux: {exc}") from exc
    codec = packets.codec
    if codec is None or codec.name not in DECODER_NAMES.get(request.codec, {request.codec}):
        raise DecodeError(f"holds {codec.name if codec else 'no'} video, the store says {request.codec}")
    if request.frame_size is not None and (codec.width, codec.height) != tuple(request.frame_size):
        width, height = request.frame_size
        raise DecodeError(f"holds {codec.width}x{codec.height} frames, the store says {width}x{height}")
    if codec.pix_fmt != YUV420 or codec.width % 2 or codec.height % 2:
        size = f"{codec.width}x{codec.height}"
        raise DecodeError(f"holds {codec.pix_fmt} frames of {size}; spdl decodes even-sized {YUV420}: use 'pyav'")
    return packets


def nvdec_segment(request: ClipRequest, device_id: int) -> tuple[Any, int]:
    """NV12 `[N, 3H/2, W]` on GPU `device_id` of every frame of the request's segment, shown order, by this
    thread's NVDEC decoder (SPDL keeps one per thread and reconfigures it per stream)."""
    import spdl.io

    packets = demuxed_segment(request)
    if packets.codec.name in ("h264", "hevc"):  # NVDEC's parser reads Annex B
        packets = spdl.io.apply_bsf(packets, f"{packets.codec.name}_mp4toannexb")
    # the legacy default stream: torch's default stream waits for the frames, whichever thread decoded them
    device = spdl.io.cuda_config(device_index=device_id, stream=0)
    decoder = spdl.io.nvdec_decoder(device, packets.codec)
    count, width, height = len(packets), packets.codec.width, packets.codec.height
    nv12 = displayed_nv12(spdl.io.to_torch(decoder.decode_packets(packets)), width, height)
    if len(nv12) != count:
        raise DecodeError(f"NVDEC gave {len(nv12)} frames for a segment of {count}")
    return nv12, count


def displayed_nv12(nv12: Any, width: int, height: int) -> Any:
    """NV12 frames `[N, 3C/2, P]` of a coded size larger than the displayed one (1080p is coded 1088 rows high)
    cut to the displayed `[N, 3H/2, W]`: the luma rows, then the chroma rows, each cut alone."""
    import torch

    coded = nv12.shape[1] * 2 // 3
    if coded != height:
        nv12 = torch.cat([nv12[:, :height], nv12[:, coded : coded + height // 2]], dim=1)
    return nv12[:, :, :width] if nv12.shape[2] != width else nv12


def batch_nv12_to_rgb(frames: Sequence[Any]) -> list[Any]:
    """RGB `[F, H, W, 3]` per NV12 `[F, 3H/2, W]` (None stays None), converted in one pass per frame size."""
    import torch

    out: list[Any] = [None] * len(frames)
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for position, nv12 in enumerate(frames):
        if nv12 is not None:
            by_shape.setdefault(tuple(nv12.shape[1:]), []).append(position)
    for (rows, _), positions in by_shape.items():
        joined = torch.cat([frames[position] for position in positions])
        rgb = nv12_to_rgb(joined, rows * 2 // 3)
        for position, part in zip(positions, rgb.split([len(frames[position]) for position in positions])):
            out[position] = part
    return out
