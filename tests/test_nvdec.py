"""The NVDEC backend's host side, with PyAV standing in for the hardware decoder: packets rewritten as
elementary streams, the session pool, NV12 to RGB, and whole requests against PyAV's own decoding.
The hardware call itself is checked on a GPU by benchmarks/gpu/nvdec_check.py."""

from __future__ import annotations

import threading
import time

import av
import numpy as np
import pytest
import torch

from mmdata.codecs.bitstream import AnnexB, elementary_stream
from mmdata.codecs.colour import to_rgb
from mmdata.codecs.decoders import ClipRequest, SegmentRef, backend_available, make_video_decoder
from mmdata.codecs.decoders.nvdec import NvdecDecoder
from mmdata.codecs.decoders.pyav_decoder import PyAvDecoder, decode_all_frames
from mmdata.codecs.decoders.sessions import SessionPool
from mmdata.codecs.nv12 import nv12_to_rgb
from mmdata.codecs.packet_index import index_segment
from mmdata.errors import DecodeError, MmdataError
from mmdata.synthetic import read_index_stripe
from tests.conftest import GOP, SEGMENT, camera_batches


def nv12_of(frame: av.VideoFrame) -> np.ndarray:
    """A decoded 4:2:0 frame as NV12 `[3H/2, W]`: what NVDEC writes."""
    height, width = frame.height, frame.width
    rows, columns = (height, height // 2, height // 2), (width, width // 2, width // 2)
    luma, blue, red = (
        np.frombuffer(plane, np.uint8).reshape(-1, plane.line_size)[:plane_rows, :plane_columns]
        for plane, plane_rows, plane_columns in zip(frame.planes, rows, columns)
    )
    return np.concatenate([luma, np.stack([blue, red], -1).reshape(height // 2, width)])


class PyAvSession:
    """A hardware session stood in for by an FFmpeg decoder without its container's codec configuration:
    it reads the elementary stream as NVDEC's parser does."""

    def __init__(self, codec, size, delay=0.0):
        self.codec, self.max_size, self.size = codec, size, size
        self.delay = delay
        self.context = av.CodecContext.create(codec, "r")

    def reconfigure(self, size):
        self.size = size

    def decode(self, packets):
        self.context.flush_buffers()
        time.sleep(self.delay)
        out = []
        for data, shown in [*packets, (None, 0)]:
            packet = None
            if data is not None:
                packet = av.Packet(data)
                packet.pts = shown
            out += [(frame.pts, torch.from_numpy(nv12_of(frame))) for frame in self.context.decode(packet)]
        return out

    def close(self):
        self.context = None


@pytest.mark.parametrize("codec", ["h264", "hevc", "vp9"])
def test_packets_as_elementary_streams_decode_from_any_key_frame_without_the_container(codec, segments):
    data = segments[codec][0]
    index = index_segment(data)
    stream = elementary_stream(codec, index.codec_config)
    assert (stream is None) == (codec == "vp9"), "VP9 packets are passed as stored"
    reference = decode_all_frames(data)
    for key_position in np.flatnonzero(index.keys):
        context = av.CodecContext.create(codec, "r")  # no extradata: the parameter sets travel in band
        decoded = {}
        for position in [*range(int(key_position), len(index)), None]:
            packet = None
            if position is not None:
                payload = data[index.offsets[position] : index.offsets[position] + index.sizes[position]]
                packet = av.Packet(stream.packet(payload, bool(index.keys[position])) if stream else payload)
                packet.pts = int(index.frames[position])
            decoded.update((frame.pts, to_rgb(frame)) for frame in context.decode(packet))
        first = int(index.frames[key_position])
        assert sorted(decoded) == list(range(first, len(index)))
        assert all(np.array_equal(decoded[frame], reference[frame]) for frame in decoded)


def test_malformed_packets_and_codec_configurations_are_decode_errors(segments):
    stream = AnnexB(4, b"")
    assert stream.packet(b"\x00\x00\x00\x02ab", key=False) == b"\x00\x00\x00\x01ab"
    with pytest.raises(DecodeError, match="overruns its packet"):
        stream.packet(b"\x00\x00\x01\x00ab", key=False)
    with pytest.raises(DecodeError, match="inside a NAL length"):
        stream.packet(b"\x00\x00\x00\x01a\x00\x00", key=False)
    config = index_segment(segments["h264"][0]).codec_config
    with pytest.raises(DecodeError, match="ends early"):
        elementary_stream("h264", config[:12])
    with pytest.raises(DecodeError, match="version 7"):
        elementary_stream("h264", b"\x07" + config[1:])
    with pytest.raises(DecodeError, match="no elementary stream form"):
        elementary_stream("mpeg4", b"\x01\x02")
    assert elementary_stream("h264", b"\x00\x00\x00\x01\x67").length_size == 0, "Annex B stays Annex B"


def test_nv12_converts_to_the_very_pixels_of_the_cpu_path(segments):
    with av.open(__import__("io").BytesIO(segments["h264"][1])) as container:
        frames = list(container.decode(video=0))
    nv12 = torch.stack([torch.from_numpy(nv12_of(frame)) for frame in frames])
    assert torch.equal(nv12_to_rgb(nv12, 64), torch.from_numpy(np.stack([to_rgb(frame) for frame in frames])))
    with pytest.raises(ValueError, match="even sizes"):
        nv12_to_rgb(nv12[:, :, :-1], 64)


class CountingSession:
    def __init__(self, codec, size, log):
        self.codec, self.max_size, self.size = codec, size, size
        self.log = log
        log.append(("open", codec, size))

    def reconfigure(self, size):
        self.log.append(("reconfigure", self.codec, size))
        self.size = size

    def close(self):
        self.log.append(("close", self.codec, self.size))


def test_the_pool_reuses_then_reconfigures_then_opens_and_evicts_within_its_capacity():
    log = []
    pool = SessionPool(lambda codec, size: CountingSession(codec, size, log), capacity=2)
    with pool.session("h264", (640, 480)):
        pass
    with pool.session("h264", (640, 480)):
        pass
    with pool.session("h264", (224, 224)):
        pass
    assert log == [("open", "h264", (640, 480)), ("reconfigure", "h264", (224, 224))]
    with pool.session("h264", (1280, 720)) as large:  # larger than the open session can take
        assert large.max_size == (1280, 720)
    with pool.session("hevc", (224, 224)):  # capacity reached: an idle session makes room
        pass
    assert log[2:] == [("open", "h264", (1280, 720)), ("close", "h264", (224, 224)), ("open", "hevc", (224, 224))]
    assert (pool.counts.opened, pool.counts.reused, pool.counts.reconfigured, pool.counts.closed) == (3, 1, 1, 1)
    with pytest.raises(RuntimeError), pool.session("hevc", (224, 224)):
        raise RuntimeError("the stream broke the session")
    assert log[-1] == ("close", "hevc", (224, 224)), "a session that failed is closed, not lent again"
    pool.close()
    assert log[-1][0] == "close" and pool.counts.closed == 3


def test_the_pool_makes_threads_wait_rather_than_open_more_sessions_than_engines():
    log, inside, most = [], [0], [0]
    lock = threading.Lock()
    pool = SessionPool(lambda codec, size: CountingSession(codec, size, log), capacity=2)

    def borrow():
        with pool.session("h264", (64, 64)):
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            time.sleep(0.02)
            with lock:
                inside[0] -= 1

    threads = [threading.Thread(target=borrow) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert most[0] == 2 and pool.counts.opened == 2 and pool.counts.reused == 6
    with pytest.raises(ValueError, match="at least one session"):
        SessionPool(lambda codec, size: None, capacity=0)


def _requests(segments, codec, seed, indexed=True, count=12):
    rng = np.random.default_rng(seed)
    requests = []
    for _ in range(count):
        number = int(rng.integers(len(segments)))
        length = SEGMENT if number < len(segments) - 1 else 40 - SEGMENT * number
        frames = tuple(int(f) for f in rng.integers(0, length, size=int(rng.integers(1, 7))))
        data = segments[number]
        packets = index_segment(data) if indexed else None
        requests.append(ClipRequest(data, frames, codec, SegmentRef("ep", "cam", number), GOP, (128, 64), packets))
    return requests


@pytest.mark.parametrize("codec", ["h264", "hevc", "vp9"])
def test_the_nvdec_backend_delivers_pyavs_frames_in_request_order(codec, segments):
    decoder = NvdecDecoder(sessions=3, open_session=lambda codec, size: PyAvSession(codec, size, delay=0.002))
    for indexed in (True, False):
        requests = _requests(segments[codec], codec, seed=len(codec), indexed=indexed)
        expected = PyAvDecoder().decode(requests)
        outputs = decoder.decode(requests)
        for request, got, want in zip(requests, outputs, expected):
            assert isinstance(got, torch.Tensor) and got.shape == want.shape
            assert torch.equal(got, torch.from_numpy(want)), f"frames {request.frames}"
            number = request.where.segment
            assert [read_index_stripe(frame) for frame in got.numpy()] == [SEGMENT * number + f for f in request.frames]
    assert decoder.stats.requests == 24 and decoder.stats.frames_decoded >= decoder.stats.frames_delivered
    assert decoder.pool.counts.opened <= 3 and "sessions opened" in decoder.describe()


def test_a_request_the_segment_cannot_serve_fails_alone_naming_the_segment(segments):
    decoder = NvdecDecoder(sessions=2, open_session=PyAvSession)
    good = _requests(segments["h264"], "h264", seed=1, count=2)
    beyond = ClipRequest(segments["h264"][0], (SEGMENT,), "h264", SegmentRef("ep7", "cam", 0), GOP, (128, 64))
    outputs = decoder.decode([good[0], beyond, good[1]], on_error="skip")
    assert outputs[1] is None and outputs[0] is not None and outputs[2] is not None
    assert decoder.stats.skipped == 1 and "ep7" in decoder.stats.skipped_where[0]
    with pytest.raises(DecodeError, match=f"segment has {SEGMENT} frames"):
        decoder.decode([beyond])


def test_decoder_nvdec_needs_pynvvideocodec_and_a_gpu_and_says_which_is_missing():
    from mmdata.codecs.decoders.availability import cuda_available

    if cuda_available():
        pytest.skip("a CUDA GPU is visible: benchmarks/gpu/nvdec_check.py covers decoder='nvdec' there")
    assert not backend_available("nvdec")
    with pytest.raises(MmdataError, match="decoder 'nvdec' needs"):
        make_video_decoder("nvdec", ["h264"])


@pytest.mark.slow
def test_the_dataloader_with_the_nvdec_backend_delivers_pyavs_batches(stores):
    single = camera_batches(stores["wds"], "pyav", seed=3)
    nvdec = camera_batches(stores["wds"], NvdecDecoder(sessions=2, open_session=PyAvSession), seed=3)
    assert len(single) == len(nvdec)
    for (ids, frames), (nvdec_ids, nvdec_frames) in zip(single, nvdec):
        assert torch.equal(ids, nvdec_ids) and torch.equal(frames, nvdec_frames)
