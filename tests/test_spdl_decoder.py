"""The SPDL backends on the CPU: whole segments decoded per call on a pool of threads ("spdl"), and the GPU
backend's scheduling and batch colour conversion ("spdl-nvdec") with SPDL's FFmpeg standing in for NVDEC.
NVDEC itself is checked on a GPU by benchmarks/gpu/spdl_check.py."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from mmdata.codecs import nv12
from mmdata.codecs.colour import yuv420_frames_to_rgb
from mmdata.codecs.decoders import ClipRequest, SegmentRef, make_video_decoder, spdl_decoder, spdl_libraries
from mmdata.codecs.decoders.pyav_decoder import PyAvDecoder
from mmdata.codecs.decoders.spdl_decoder import SpdlDecoder, SpdlNvdecDecoder, demuxed_segment
from mmdata.errors import DecodeError, MissingDependencyError, OptionError
from mmdata.synthetic import read_index_stripe
from tests.conftest import GOP, SEGMENT, camera_batches
from tests.test_decoders import random_requests

CODECS = ["h264", "hevc", "vp9"]


def cpu_nvdec(calls: list[str] | None = None):
    """NVDEC stood in for by SPDL's FFmpeg: every frame of the segment as NV12 `[N, 3H/2, W]` in a CPU tensor."""
    import spdl.io

    def decode_segment(request: ClipRequest, device_id: int):
        if calls is not None:
            calls.append(threading.current_thread().name)
        packets = demuxed_segment(request)
        count, width, height = len(packets), packets.width, packets.height
        frames = spdl.io.decode_packets(packets, filter_desc=None)
        planes = spdl.io.to_numpy(spdl.io.convert_frames(frames)).reshape(count, -1)
        luma = planes[:, : width * height].reshape(count, height, width)
        chroma = planes[:, width * height :].reshape(count, 2, height // 2, width // 2)
        interleaved = chroma.transpose(0, 2, 3, 1).reshape(count, height // 2, width)
        return torch.from_numpy(np.concatenate([luma, interleaved], axis=1)), count

    return decode_segment


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("threads", [1, 3])
def test_spdl_delivers_pyavs_very_frames_in_request_order(codec, threads, segments):
    requests = random_requests(codec, segments[codec], threads + len(codec), 12)
    expected = PyAvDecoder().decode(requests)
    decoder = make_video_decoder("spdl", [codec], threads=threads)
    for request, got, want in zip(requests, decoder.decode(requests), expected):
        assert got.dtype == np.uint8 and np.array_equal(got, want), f"frames {request.frames}"
        number = request.where.segment
        assert [read_index_stripe(frame) for frame in got] == [SEGMENT * number + f for f in request.frames]


def test_spdl_decodes_a_segment_only_up_to_its_last_wanted_frame(segments):
    decoder = SpdlDecoder()
    request = ClipRequest(segments["h264"][0], (5, 2, 5), "h264", SegmentRef("ep", "cam", 0), GOP, (128, 64))
    decoder.decode([request])
    assert decoder.stats.frames_decoded == 6 and decoder.stats.frames_delivered == 3


def test_spdl_runs_requests_on_its_pool_of_threads(segments, monkeypatch):
    names = []
    decode = spdl_decoder.SpdlDecoder._decode_one

    def recording(self, request):
        names.append(threading.current_thread().name)
        return decode(self, request)

    monkeypatch.setattr(spdl_decoder.SpdlDecoder, "_decode_one", recording)
    SpdlDecoder(threads=2).decode(random_requests("h264", segments["h264"], 4, 12))
    assert names and all(name.startswith("mmdata-spdl") for name in names)


def test_a_request_a_segment_cannot_serve_fails_alone_naming_the_segment(segments):
    decoder = SpdlDecoder(threads=2)
    good = random_requests("h264", segments["h264"], 1, 2)
    beyond = ClipRequest(segments["h264"][0], (SEGMENT,), "h264", SegmentRef("ep7", "cam", 0), GOP, (128, 64))
    outputs = decoder.decode([good[0], beyond, good[1]], on_error="skip")
    assert outputs[1] is None and outputs[0] is not None and outputs[2] is not None
    assert decoder.stats.skipped == 1 and "ep7" in decoder.stats.skipped_where[0]
    with pytest.raises(DecodeError, match=f"segment has {SEGMENT} frames"):
        decoder.decode([beyond])


@pytest.mark.parametrize(
    ("codec", "size", "data", "message"),
    [
        ("hevc", (128, 64), None, "holds h264 video, the store says hevc"),
        ("h264", (64, 64), None, "holds 128x64 frames, the store says 64x64"),
        ("h264", (128, 64), b"not a video at all", "does not demux"),
    ],
)
def test_a_segment_unlike_what_the_store_declares_is_refused_before_decoding(codec, size, data, message, segments):
    request = ClipRequest(data or segments["h264"][0], (0,), codec, SegmentRef("ep3", "cam", 0), GOP, size)
    for decoder in (SpdlDecoder(), SpdlNvdecDecoder(decode_segment=cpu_nvdec())):
        with pytest.raises(DecodeError, match=message):
            decoder.decode([request])


def test_the_batch_kernel_converts_packed_frames_as_the_cpu_path_does(segments):
    import av

    from mmdata.codecs.colour import to_rgb

    with av.open(__import__("io").BytesIO(segments["h264"][1])) as container:
        frames = list(container.decode(video=0))
    packed = np.stack([np.concatenate([np.frombuffer(p, np.uint8) for p in frame.planes]) for frame in frames])
    out = np.empty((len(frames), 64, 128, 3), np.uint8)
    yuv420_frames_to_rgb(packed, out)
    assert np.array_equal(out, np.stack([to_rgb(frame) for frame in frames]))
    with pytest.raises(ValueError, match="packed I420 frames of 128x64"):
        yuv420_frames_to_rgb(packed[:, 1:], out)


@pytest.mark.parametrize("codec", CODECS)
def test_spdl_nvdec_with_the_cpu_standing_in_delivers_pyavs_frames_in_one_colour_pass(codec, segments, monkeypatch):
    conversions = []
    convert = nv12.nv12_to_rgb

    def counting(frames, height):
        conversions.append(len(frames))
        return convert(frames, height)

    monkeypatch.setattr(spdl_decoder, "nv12_to_rgb", counting)
    calls: list[str] = []
    decoder = SpdlNvdecDecoder(threads=3, decode_segment=cpu_nvdec(calls))
    requests = random_requests(codec, segments[codec], 9, 12)
    expected = PyAvDecoder().decode(requests)
    outputs = decoder.decode(requests)
    for request, got, want in zip(requests, outputs, expected):
        assert isinstance(got, torch.Tensor) and torch.equal(got, torch.from_numpy(want)), f"frames {request.frames}"
    assert conversions == [sum(len(request.frames) for request in requests)]
    assert len(calls) == len(requests) and all(name.startswith("mmdata-spdl-nvdec") for name in calls)
    assert decoder.stats.frames_delivered == sum(len(request.frames) for request in requests)


def test_spdl_nvdec_skips_a_failing_request_and_delivers_the_rest(segments):
    decoder = SpdlNvdecDecoder(threads=2, decode_segment=cpu_nvdec())
    good = random_requests("h264", segments["h264"], 2, 3)
    broken = ClipRequest(b"\x00" * 64, (0,), "h264", SegmentRef("ep9", "cam", 1), GOP, (128, 64))
    empty = ClipRequest(segments["h264"][0], (), "h264", SegmentRef("ep", "cam", 0), GOP, (128, 64))
    outputs = decoder.decode([good[0], broken, empty, good[1]], on_error="skip")
    assert outputs[1] is None and len(outputs[2]) == 0
    assert torch.equal(outputs[0], torch.from_numpy(PyAvDecoder().decode([good[0]])[0]))
    assert decoder.stats.skipped == 1 and "ep9" in decoder.stats.skipped_where[0]


def test_spdl_options_are_checked_where_they_are_given():
    with pytest.raises(OptionError, match="threads is a whole number of at least 1"):
        SpdlDecoder(threads=0)
    with pytest.raises(OptionError, match="threads is a whole number"):
        SpdlNvdecDecoder(threads=2.5)
    with pytest.raises(OptionError, match="device_id is a GPU number"):
        SpdlNvdecDecoder(device_id=-1)


def test_spdl_nvdec_needs_a_gpu_and_says_so():
    from mmdata.codecs.decoders.availability import cuda_available

    if cuda_available():
        pytest.skip("a CUDA GPU is visible: benchmarks/gpu/spdl_check.py covers decoder='spdl-nvdec' there")
    with pytest.raises(Exception, match="decoder 'spdl-nvdec' needs a CUDA GPU"):
        make_video_decoder("spdl-nvdec", ["h264"])


def test_the_dataloader_with_spdl_delivers_pyavs_batches(stores):
    single = camera_batches(stores["wds"], "pyav", seed=5)
    spdl = camera_batches(stores["wds"], "spdl", seed=5)
    assert len(single) == len(spdl)
    for (ids, frames), (spdl_ids, spdl_frames) in zip(single, spdl):
        assert torch.equal(ids, spdl_ids) and torch.equal(frames, spdl_frames)


def test_pyavs_ffmpeg_is_linked_for_spdl_once_and_a_foreign_file_is_not_replaced(tmp_path, monkeypatch):
    monkeypatch.setattr(spdl_libraries, "spdl_library_folder", lambda: tmp_path)
    links = spdl_libraries.link_spdl_libraries()
    assert len(links) == len(spdl_libraries.FFMPEG_LIBRARIES) + (spdl_libraries.driver_nvcuvid() is not None)
    assert all(link.is_symlink() and link.resolve().is_file() for link in links)
    assert spdl_libraries.link_spdl_libraries() == links
    links[0].unlink()
    links[0].write_bytes(b"someone else's library")
    with pytest.raises(MissingDependencyError, match="is a file, not a link mmdata made"):
        spdl_libraries.link_spdl_libraries()


def test_hybrid_pairs_pyav_with_spdl_nvdec_and_delivers_pyavs_frames(segments):
    from mmdata.codecs.decoders import HybridDecoder

    hybrid = HybridDecoder(SpdlNvdecDecoder(threads=2, decode_segment=cpu_nvdec()), PyAvDecoder())
    requests = random_requests("h264", segments["h264"], 11, 12)
    expected = PyAvDecoder().decode(requests)
    for _ in range(2):  # the second batch is split by the rates the first measured
        for got, want in zip(hybrid.decode(requests), expected):
            assert np.array_equal(np.asarray(got), want)
    assert 0 < hybrid.split.first_share < 1 and "spdl-nvdec" in hybrid.describe()


def test_hybrids_gpu_side_is_checked_where_it_is_given():
    with pytest.raises(Exception, match="hybrid pairs PyAV with gpu='dali', 'nvdec' or 'spdl-nvdec'"):
        make_video_decoder("hybrid", ["h264"], gpu="cuda")
    from mmdata.codecs.decoders.availability import cuda_available

    if not cuda_available():
        with pytest.raises(Exception, match="decoder 'spdl-nvdec' needs a CUDA GPU"):
            make_video_decoder("hybrid", ["h264"], gpu="spdl-nvdec")


def test_nv12_coded_larger_than_displayed_is_cut_to_the_displayed_frames():
    frames = torch.randint(0, 256, (2, 96, 64), dtype=torch.uint8)  # 64x64 displayed: 64 luma + 32 chroma rows
    padded = torch.zeros((2, 120, 80), dtype=torch.uint8)  # coded 80x80: 80 luma rows, then 40 chroma rows
    padded[:, :64, :64], padded[:, 80:112, :64] = frames[:, :64], frames[:, 64:]
    assert torch.equal(spdl_decoder.displayed_nv12(padded, 64, 64), frames)
    assert spdl_decoder.displayed_nv12(frames, 64, 64) is frames
