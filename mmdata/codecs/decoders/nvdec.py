"""NVDEC through PyNvVideoCodec's core decoder, fed packets straight from the store: no container.

Each request's packets are sliced out of its segment by the packet index, rewritten as the
elementary stream the hardware parser reads (`mmdata.codecs.bitstream`), and decoded from the key
frame before each run of wanted frames, then flushed. Sessions come from a pool of one per decode
engine (`sessions`), reconfigured when the frame size changes; requests run on as many threads as
there are sessions. Frames leave the decoder as NV12 in device memory, become RGB there
(`mmdata.codecs.nv12`, the CPU path's arithmetic) and reach torch through DLPack without a trip
through host memory.

A test stands a PyAV session in for PyNvVideoCodec (`open_session=`), so that everything but the
hardware call runs in the CPU suite; `benchmarks/gpu/nvdec_check.py` checks the real one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import av
import numpy as np

from mmdata.codecs.bitstream import AnnexB, elementary_stream
from mmdata.codecs.decoders.availability import NVDEC_CODECS
from mmdata.codecs.decoders.base import OnError, VideoDecoder
from mmdata.codecs.decoders.packets import key_runs, probe_segment, request_rows, wanted_frames
from mmdata.codecs.decoders.requests import ClipRequest
from mmdata.codecs.decoders.sessions import DecoderSession, SessionPool, Size
from mmdata.codecs.nv12 import nv12_to_rgb
from mmdata.codecs.packet_index import PacketIndex, index_segment
from mmdata.errors import DecodeError

# NVDEC engines on an H100 or H200 (NVIDIA's Video Codec SDK support matrix): one session each.
DEFAULT_SESSIONS = 7
Packets = Sequence[tuple[bytes, int]]  # (elementary-stream bytes, frame shown), in decode order
OpenSession = Callable[[str, Size], DecoderSession]


class NvdecDecoder(VideoDecoder):
    """Frames of a batch's requests decoded by NVDEC sessions on GPU `device_id` (see the module)."""

    name = "nvdec"
    device = "gpu"
    codecs = NVDEC_CODECS

    def __init__(self, device_id: int = 0, sessions: int = DEFAULT_SESSIONS, open_session: OpenSession | None = None):
        super().__init__()
        if sessions < 1:
            raise ValueError(f"sessions is at least 1, not {sessions}")
        self.device_id = device_id
        self.sessions = sessions
        self._open_session = open_session
        self._pool: SessionPool | None = None
        self._threads: ThreadPoolExecutor | None = None
        self._streams: dict[tuple[str, bytes], AnnexB | None] = {}
        self._pid = os.getpid()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_pool": None, "_threads": None}

    def describe(self) -> str:
        counts = self._pool.counts if self._pool is not None else None
        made = f", sessions opened {counts.opened}, reconfigured {counts.reconfigured}" if counts else ""
        return f"nvdec (PyNvVideoCodec, GPU {self.device_id}, {self.sessions} session(s){made})"

    @property
    def pool(self) -> SessionPool:
        """This process's sessions (a forked worker opens its own)."""
        if self._pool is None or self._pid != os.getpid():
            opener = self._open_session or (lambda codec, size: PyNvSession(codec, size, self.device_id))
            self._pool, self._pid = SessionPool(opener, self.sessions), os.getpid()
            self._threads = ThreadPoolExecutor(self.sessions, thread_name_prefix="mmdata-nvdec")
        return self._pool

    def _decode_batch(self, requests: list[ClipRequest], on_error: OnError) -> list[Any]:
        pool, threads = self.pool, self._threads
        assert threads is not None, "made with the pool"
        outcomes = list(threads.map(lambda request: self._attempt(pool, request), requests))
        return self._settled(requests, outcomes, on_error)

    def _attempt(self, pool: SessionPool, request: ClipRequest) -> tuple[Any, int, DecodeError | None]:
        try:
            return (*self._decode_one(pool, request), None)
        except DecodeError as exc:
            return None, 0, exc

    def _decode_one(self, pool: SessionPool, request: ClipRequest) -> tuple[Any, int]:
        import torch

        if not request.frames:
            return torch.empty((0, 0, 0, 3), dtype=torch.uint8, device=self._torch_device()), 0
        index = request.packets or _indexed(request)
        key_frames, key_positions = index.key_frames
        wanted = wanted_frames(request, len(index), key_frames)
        stream = self._stream(request.codec, index.codec_config)
        width, height = request.frame_size or probe_segment(request)
        row_of = {int(frame): row for row, frame in enumerate(wanted)}
        rows: list[Any] = [None] * len(wanted)
        decoded = 0
        with pool.session(request.codec, (width, height)) as session:
            for key_position, last in key_runs(wanted, key_frames, key_positions):
                packets = _run_packets(request.data, index, stream, key_position, last)
                for shown, nv12 in session.decode(packets):
                    decoded += 1
                    row = row_of.get(int(shown))
                    if row is None:
                        continue
                    if tuple(nv12.shape) != (height * 3 // 2, width):
                        raise DecodeError(f"a frame is {tuple(nv12.shape)} NV12, the store says {width}x{height}")
                    rows[row] = nv12
        missing = [int(wanted[row]) for row, frame in enumerate(rows) if frame is None]
        if missing:
            raise DecodeError(f"frames {missing} of {len(index)} did not decode")
        frames = nv12_to_rgb(torch.stack(rows), height)
        order = request_rows(wanted, request)
        return (frames if order is None else frames[torch.as_tensor(order, device=frames.device)]), decoded

    def _stream(self, codec: str, codec_config: bytes) -> AnnexB | None:
        key = (codec, codec_config)
        if key not in self._streams:
            self._streams[key] = elementary_stream(codec, codec_config)
        return self._streams[key]

    def _torch_device(self) -> str:
        return "cpu" if self._open_session is not None else f"cuda:{self.device_id}"


def _run_packets(data: bytes, index: PacketIndex, stream: AnnexB | None, key_position: int, last: int) -> Packets:
    """The packets from the key frame at `key_position` to the last one any frame up to `last` needs,
    as the hardware parser reads them. Segments are closed GOPs: no later packet shows a frame <= last."""
    shown = index.frames
    end = key_position + int(np.flatnonzero(shown[key_position:] <= last)[-1])
    view = memoryview(data)
    packets = []
    for position in range(key_position, end + 1):
        start, size = int(index.offsets[position]), int(index.sizes[position])
        payload = view[start : start + size]
        encoded = stream.packet(payload, bool(index.keys[position])) if stream is not None else bytes(payload)
        packets.append((encoded, int(shown[position])))
    return packets


def _indexed(request: ClipRequest) -> PacketIndex:
    """The packet index of a segment stored without one (demuxed once, on the host)."""
    try:
        return index_segment(request.data)
    except (av.error.FFmpegError, IndexError) as exc:
        raise DecodeError(str(exc) or type(exc).__name__) from exc


class PyNvSession:
    """One PyNvVideoCodec core decoder on GPU `device_id`, writing NV12 to device memory,
    opened for frames up to `size` (larger ones are refused by the decoder, not allocated)."""

    def __init__(self, codec: str, size: Size, device_id: int = 0):
        import PyNvVideoCodec as nvc

        self.codec, self.max_size, self.size = codec, size, size
        self._nvc = nvc
        options: dict[str, Any] = {}
        latency = getattr(nvc, "DisplayDecodeLatencyType", None)
        if latency is not None:  # frames out as soon as they are decoded, in display order
            options["latency"] = latency.LOW
        # the core decoder: `CreateDecoder` in PyNvVideoCodec 1.x, the `PyNvDecoder` class itself in 2.x
        create = getattr(nvc, "CreateDecoder", None) or nvc.PyNvDecoder
        self._decoder = create(
            gpuid=device_id,
            codec=getattr(nvc.cudaVideoCodec, {"h264": "H264", "hevc": "HEVC", "vp9": "VP9"}[codec]),
            cudacontext=0,
            cudastream=0,
            usedevicememory=True,
            maxwidth=size[0],
            maxheight=size[1],
            outputColorType=nvc.OutputColorType.NATIVE,
            **options,
        )

    def reconfigure(self, size: Size) -> None:
        self._decoder.setReconfigParams(*size)
        self.size = size

    def decode(self, packets: Packets) -> list[tuple[int, Any]]:
        """(frame shown, NV12 `[3H/2, W]` on the GPU) of every frame the packets decode to, the decoder
        flushed after the last (an empty packet ends the stream)."""
        import torch

        out = []
        try:
            for data, shown in [*packets, (b"", 0)]:
                buffer = np.frombuffer(data, np.uint8)
                packet = self._nvc.PacketData()
                packet.bsl_data, packet.bsl, packet.pts = buffer.ctypes.data, buffer.size, shown
                for frame in self._decoder.Decode(packet):
                    nv12 = torch.from_dlpack(frame)
                    out.append((int(frame.getPTS()), nv12.reshape(nv12.shape[0], -1).clone()))
        except RuntimeError as exc:  # what PyNvVideoCodec raises for a stream it cannot decode
            raise DecodeError(f"NVDEC: {exc}") from exc
        return out

    def close(self) -> None:
        self._decoder = None
