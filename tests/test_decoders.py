"""Every decoding backend returns the frames a full PyAV decode gives, for random clip requests."""

from __future__ import annotations

import faulthandler
import gc
import multiprocessing
import pickle

import numpy as np
import pytest

from mmdata.codecs.decoders import (
    ClipRequest,
    SegmentRef,
    availability,
    backend_available,
    frames_decoded_from_key_frames,
    make_video_decoder,
    measured,
    select,
)
from mmdata.codecs.decoders.concat import join_segments
from mmdata.codecs.decoders.pyav_decoder import decode_all_frames
from mmdata.errors import MmdataError, UnsupportedCodecError
from mmdata.synthetic import read_index_stripe
from tests.conftest import GOP, SEGMENT

# Mean absolute RGB difference allowed against the PyAV reference. PyAV and DALI convert YUV to RGB
# with exact rounding (identical pixels); decord uses FFmpeg's default conversion, which rounds
# down, and exposes no option to change it, so its frames sit about 1.25 levels lower.
RGB_TOLERANCE = {"pyav": 1.0, "spdl": 1.0, "dali-cpu": 1.0, "decord": 1.5}
PAIRS = [
    ("pyav", {}, "h264"),
    ("pyav", {}, "hevc"),
    ("pyav", {}, "vp9"),
    ("decord", {}, "h264"),
    ("decord", {}, "hevc"),
    ("decord", {}, "vp9"),
    ("spdl", {"threads": 2}, "h264"),
    ("spdl", {}, "hevc"),
    ("spdl", {}, "vp9"),
    ("dali-cpu", {"reuse_sessions": True, "pipelines": 2, "batch_size": 2}, "vp9"),
    ("dali-cpu", {"reuse_sessions": False, "pipelines": 1, "batch_size": 4}, "vp9"),
]


def random_requests(codec: str, segments: list[bytes], seed: int, count: int = 10) -> list[ClipRequest]:
    rng = np.random.default_rng(seed)
    requests = []
    for _ in range(count):
        number = int(rng.integers(len(segments)))
        length = SEGMENT if number < len(segments) - 1 else 40 - SEGMENT * number
        frames = rng.integers(0, length, size=int(rng.integers(1, 7)))
        requests.append(ClipRequest(segments[number], tuple(frames), codec, SegmentRef("ep", "cam", number), GOP))
    return requests


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "options", "codec"), PAIRS, ids=[f"{b}-{c}-{o}" for b, o, c in PAIRS])
def test_backend_frames_match_a_full_pyav_decode(backend, options, codec, segments):
    if not backend_available(backend):
        pytest.fail(f"backend {backend} is a test dependency (pip install -e '.[dev]') but is not importable")
    decoder = make_video_decoder(backend, [codec], **options)
    requests = random_requests(codec, segments[codec], seed=len(backend) + len(codec))
    reference = [decode_all_frames(data) for data in segments[codec]]
    outputs = decoder.decode(requests)
    for request, frames in zip(requests, outputs):
        number = request.where.segment
        expected = reference[number][list(request.frames)]
        assert frames.shape == expected.shape and frames.dtype == np.uint8
        difference = np.abs(frames.astype(np.int16) - expected).mean()
        assert difference < RGB_TOLERANCE[backend], f"{backend} differs from PyAV on {codec} by {difference:.2f}"
        assert [read_index_stripe(f) for f in frames] == [SEGMENT * number + i for i in request.frames]
    assert decoder.stats.requests == len(requests)
    assert decoder.stats.frames_delivered == sum(len(r.frames) for r in requests)
    assert decoder.stats.decode_waste >= 1.0


def test_pyav_decodes_from_the_key_frame_before_the_wanted_frames(segments):
    decoder = make_video_decoder("pyav", ["h264"])
    decoder.decode([ClipRequest(segments["h264"][0], (9, 10), "h264", gop=GOP)])
    assert decoder.stats.frames_decoded == 3, "frames 8, 9, 10: from the key frame at 8 to the last wanted"


def test_decode_waste_counts_runs_between_key_frames():
    assert frames_decoded_from_key_frames((9, 10), 4) == 3
    assert frames_decoded_from_key_frames((1, 13), 4) == 2 + 2
    assert frames_decoded_from_key_frames((1, 5), 4) == 2 + 2, "frame 5 starts again at key frame 4"
    assert frames_decoded_from_key_frames((1, 3), 4) == 4, "frame 3 continues the run from key frame 0"
    assert frames_decoded_from_key_frames((5,), None) == 6


# (HEVC's short last segment is encoded without B-frames, so it cannot join the others.)
@pytest.mark.parametrize("codec", ["h264", "vp9"])
def test_joined_stream_keeps_only_the_gops_holding_wanted_frames_up_to_the_last_wanted(codec, segments):
    requests = [
        ClipRequest(segments[codec][0], (1, 13), codec, gop=GOP),
        ClipRequest(segments[codec][2], (6,), codec, gop=GOP),
    ]
    joined = join_segments(requests, [0, 1])
    frames = decode_all_frames(joined.data)
    assert joined.frames_decoded == len(frames) <= 3 * GOP, "three GOPs at most: 0-3, 12-15 and 36-39"
    assert [read_index_stripe(f) for f in frames[joined.frames]] == [1, 13, 38]
    shown = [read_index_stripe(f) for f in frames]
    assert shown == sorted(shown) and {0, 12, 36} <= set(shown), "each GOP from its key frame, in order"


def test_joined_stream_stops_each_gop_at_its_last_wanted_frame_without_reordering(segments):
    """VP9 shows frames in decode order, so a GOP is cut right after its last wanted frame."""
    requests = [ClipRequest(segments["vp9"][0], (1, 13), "vp9", gop=GOP)]
    joined = join_segments(requests, [0])
    frames = decode_all_frames(joined.data)
    assert [read_index_stripe(f) for f in frames] == [0, 1, 12, 13]
    assert joined.frames_decoded == 4 and joined.frames.tolist() == [1, 3]


def test_unsupported_codec_fails_at_build_time_naming_a_backend_that_can():
    with pytest.raises(UnsupportedCodecError, match="'dali-cpu' .*cannot decode h264 video; use decoder='pyav'"):
        make_video_decoder("dali-cpu", ["h264"])


def test_unknown_backend_name_is_refused():
    with pytest.raises(MmdataError, match="unknown decoder 'ffmpeg'; choose one of auto, dali"):
        make_video_decoder("ffmpeg", ["h264"])


def test_auto_picks_a_cpu_backend_without_a_gpu():
    assert make_video_decoder("auto", ["h264", "vp9"]).device == "cpu"
    assert make_video_decoder("auto", ["h264"], device="cpu", frames_per_request=2).name in ("pyav", "decord")


def test_auto_keeps_small_frames_on_the_host_cores_where_the_measured_table_says_they_win(monkeypatch):
    monkeypatch.setattr(availability, "backend_available", lambda name: True)
    for codec in ("h264", "hevc"):
        for frames in (16, 2):
            assert select.choose_backend([codec], "cuda", frames, (224, 224), host_cores=16) == "pyav"
    assert select.choose_backend(["h264"], "cuda", 16, (640, 480), host_cores=16) == "pyav"


def test_auto_sends_large_frames_in_long_requests_to_nvdec_and_short_ones_to_the_host(monkeypatch):
    monkeypatch.setattr(availability, "backend_available", lambda name: True)
    assert select.choose_backend(["h264"], "cuda", 16, (1920, 1080), host_cores=16) == "nvdec"
    assert select.choose_backend(["hevc"], "cuda", 16, (1280, 1024), host_cores=16) == "nvdec"
    assert select.choose_backend(["h264"], "cuda", 2, (1920, 1080), host_cores=16) == "pyav"


def test_auto_counts_the_host_cores_of_this_rank_so_a_rank_with_few_takes_the_gpu(monkeypatch):
    monkeypatch.setattr(availability, "backend_available", lambda name: True)
    monkeypatch.setattr(select.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert select.host_cores_per_rank() == 16
    assert select.choose_backend(["h264"], "cuda", 16, (640, 480)) == "pyav"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert select.host_cores_per_rank() == 2
    assert select.choose_backend(["h264"], "cuda", 16, (640, 480)) == "dali", "DALI 1,509 against 2 x 213 per core"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "not a number")
    assert select.host_cores_per_rank() == 16


def test_auto_takes_a_gpu_backend_only_where_it_can_run(monkeypatch):
    monkeypatch.setattr(availability, "backend_available", lambda name: name != "nvdec")
    assert select.choose_backend(["h264"], "cuda", 16, (1920, 1080), host_cores=16) == "pyav", "DALI loses there"
    assert select.choose_backend(["h264"], "cuda", 16, (640, 480), host_cores=1) == "dali"
    monkeypatch.setattr(availability, "backend_available", lambda name: True)
    assert select.choose_backend(["hevc"], "cuda", 16, (112, 112), host_cores=1) == "pyav", "NVDEC refuses HEVC < 144"
    assert select.choose_backend(["h264"], "cpu", 16, (1920, 1080), host_cores=1) == "pyav"
    assert select.choose_backend(["vp9"], "cuda", 16, (1920, 1080), host_cores=1) == "pyav", "never measured"
    assert select.choose_backend(["h264", "av1"], "cuda", 16, (1920, 1080), host_cores=1) == "pyav"
    assert select.choose_backend(["h264"], "cuda") == "pyav", "no frame size: the host"


def test_the_measured_table_answers_with_the_nearest_frame_area_of_the_same_request_length():
    cell = measured.nearest_cell("h264", (1280, 720), 16)
    assert (cell.width, cell.height, cell.long_requests) == (1920, 1080, True)
    cell = measured.nearest_cell("hevc", (320, 240), 4)
    assert (cell.width, cell.height, cell.long_requests) == (224, 224, False)
    assert measured.nearest_cell("av1", (224, 224), 16) is None
    assert not measured.nvdec_opens("hevc", (143, 300)) and measured.nvdec_opens("hevc", (144, 144))


def _decode_in_child(decoder, request, queue):
    try:
        queue.put(decoder.decode([request])[0].shape)
    except MmdataError as exc:
        queue.put(str(exc))


def _run_in_forked_child(decoder, request):
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_decode_in_child, args=(decoder, request, queue))
    child.start()
    try:
        return queue.get(timeout=60)
    finally:  # a child that hangs must not outlive the test (later tests count live children)
        child.join(10)
        if child.is_alive():
            child.kill()
            child.join(10)


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "codec"), [("pyav", "h264"), ("decord", "h264"), ("dali-cpu", "vp9")])
def test_decoder_built_before_fork_decodes_in_a_forked_worker(backend, codec, segments):
    decoder = make_video_decoder(backend, [codec])
    request = ClipRequest(segments[codec][0], (0, 3), codec, gop=GOP)
    assert _run_in_forked_child(decoder, request) == (2, 64, 128, 3)
    assert pickle.loads(pickle.dumps(decoder)).decode([request])[0].shape == (2, 64, 128, 3)


def _collect_garbage(queue):
    faulthandler.dump_traceback_later(30, exit=True)  # a hang prints where the child is stuck, then ends it
    gc.collect()
    queue.put("collected")


@pytest.mark.slow
def test_a_dali_decoder_dropped_in_the_parent_is_never_destroyed_in_a_forked_child(segments):
    gc.collect()  # the child's collector then finds this test's garbage only
    decoder = make_video_decoder("dali-cpu", ["vp9"])
    decoder.decode([ClipRequest(segments["vp9"][0], (0,), "vp9", gop=GOP)])
    gc.disable()
    child = None
    try:
        cycle = {"decoder": decoder}
        cycle["itself"] = cycle
        del cycle, decoder  # garbage now, found by the child's collector, not the parent's
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        child = context.Process(target=_collect_garbage, args=(queue,))
        child.start()
        child.join(60)
        assert child.exitcode == 0 and queue.get(timeout=5) == "collected", f"child ended with {child.exitcode}"
    finally:
        gc.enable()
        if child is not None and child.is_alive():
            child.kill()
            child.join()
    gc.collect()


@pytest.mark.slow
def test_dali_used_before_fork_fails_clearly_in_the_child_instead_of_hanging(segments):
    decoder = make_video_decoder("dali-cpu", ["vp9"])
    request = ClipRequest(segments["vp9"][0], (0,), "vp9", gop=GOP)
    decoder.decode([request])
    assert "forked from it" in _run_in_forked_child(decoder, request)
    assert pickle.loads(pickle.dumps(decoder)).decode([request])[0].shape == (1, 64, 128, 3), (
        "spawned workers get a fresh one"
    )
