"""Segment encoding per codec, variable frame rate sources, and the dataset.json contract."""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np
import pytest

import mmdata
from mmdata.codecs.audio import AudioClip, decode_audio, encode_flac
from mmdata.codecs.decoders import ClipRequest, make_video_decoder
from mmdata.codecs.decoders.pyav_decoder import decode_all_frames
from mmdata.codecs.video_encode import VideoEncoding, encode_segments, encoding_for_access
from mmdata.errors import MmdataError, StoreError
from mmdata.schema import DatasetSchema, LowdimStream, TextStream, VideoStream
from mmdata.synthetic import read_index_stripe, synthetic_frame
from mmdata.tools.formatting import parse_size
from tests.conftest import VFR_TIMES

FRAMES = [synthetic_frame(i, 0, 64, 128) for i in range(40)]


@pytest.mark.slow
@pytest.mark.parametrize("codec", ["h264", "hevc", "vp9"])
def test_segments_hold_their_frames_with_key_frames_every_gop(codec):
    encoding = VideoEncoding(codec=codec, segment_frames=16, gop=8)
    segments = list(encode_segments(FRAMES, Fraction(30), 128, 64, encoding))
    assert [count for count, _ in segments] == [16, 16, 8]
    assert segments == list(encode_segments(FRAMES, Fraction(30), 128, 64, encoding)), "encoding is deterministic"
    for number, (count, data) in enumerate(segments):
        with av.open(io.BytesIO(data)) as container:
            keys = [p.is_keyframe for p in container.demux(video=0) if p.size]
        assert keys[0] and sum(keys) == -(-count // 8)
        frames = decode_all_frames(data)
        assert [read_index_stripe(f) for f in frames] == list(range(16 * number, 16 * number + count))
    (picked,) = make_video_decoder("pyav", [codec]).decode([ClipRequest(segments[1][1], (5, 2, 5), codec)])
    assert [read_index_stripe(f) for f in picked] == [21, 18, 21]


@pytest.mark.parametrize("count", [1, 2, 3, 8])
def test_short_hevc_segments_carry_valid_timestamps(count):
    """x265 stamps garbage DTS on streams shorter than its B-frame delay; short segments use no B-frames."""
    ((_, data),) = encode_segments(FRAMES[:count], Fraction(30), 128, 64, VideoEncoding("hevc", 32, 8))
    with av.open(io.BytesIO(data)) as container:
        packets = [p for p in container.demux(video=0) if p.size]
    assert len(packets) == count and all(p.dts == p.pts for p in packets)
    assert [read_index_stripe(f) for f in decode_all_frames(data)] == list(range(count))


def test_encoding_rejects_a_gop_longer_than_a_segment():
    with pytest.raises(MmdataError, match="--gop 64 exceeds --segment-frames 32"):
        VideoEncoding(segment_frames=32, gop=64)


def test_each_codec_encodes_with_its_default_preset_and_crf_unless_told_otherwise():
    h264, hevc, vp9 = (VideoEncoding(codec=codec) for codec in ("h264", "hevc", "vp9"))
    assert (h264.preset, h264.crf) == ("medium", 19.5)
    assert h264.encoder_options()["crf"] == "19.5" and h264.encoder_options()["preset"] == "medium"
    assert (hevc.preset, hevc.crf) == ("fast", 20) and hevc.encoder_options()["crf"] == "20"
    assert vp9.encoder_options()["crf"] == "20"
    told = VideoEncoding(preset="fast", crf=20)
    assert told.encoder_options()["preset"] == "fast" and told.encoder_options()["crf"] == "20"
    assert encoding_for_access("both", preset=None, crf=None) == h264, "options not given keep the defaults"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"preset": "fastest"}, "unknown --preset 'fastest'; choose one of ultrafast"),
        ({"crf": float("nan")}, "--crf is nan; give a number"),
        ({"crf": "20"}, "--crf is '20'; give a number"),
        ({"crf": 52}, r"--crf 52 is outside \[0, 51\] for h264"),
        ({"crf": -1}, r"--crf -1 is outside \[0, 51\] for h264"),
        ({"codec": "vp9", "crf": 19.5}, "libvpx takes a whole number for vp9; give 20"),
    ],
)
def test_encoding_options_are_refused_where_given(options, message):
    with pytest.raises(MmdataError, match=message):
        VideoEncoding(**options)


def test_a_stored_fractional_crf_reads_back_and_a_whole_one_stays_whole():
    def stored(crf):
        schema = DatasetSchema(layout="wds", streams=[VideoStream("cam", 30.0, 96, 64, "h264", 32, 8, crf=crf)])
        return DatasetSchema.from_json(schema.to_json()).stream("cam").crf

    assert stored(19.5) == 19.5 and stored(20) == 20 and isinstance(stored(20), int)
    with pytest.raises(StoreError, match=r"crf is 64, outside \[0, 63\]"):
        stored(64)


@pytest.mark.parametrize(("codec", "banner"), [("h264", b"x264 - core"), ("hevc", b"x265 (build")])
def test_segments_leave_out_the_encoders_banner_of_version_and_options(codec, banner):
    """x264 and x265 write their version and options into every stream (0.6-2 KB): a store of many short
    segments would carry it in each. The frames decode the same without it."""
    segments = list(encode_segments(FRAMES[:16], Fraction(30), 128, 64, VideoEncoding(codec, 8, 8)))
    assert len(segments) == 2 and not any(banner in data for _, data in segments)
    decoded = [frame for _, data in segments for frame in decode_all_frames(data)]
    assert [read_index_stripe(frame) for frame in decoded] == list(range(16))
    with av.open(io.BytesIO(segments[0][1])) as container:
        packets = [packet for packet in container.demux(video=0) if packet.size]
    step = packets[1].duration
    assert packets[0].is_keyframe and sorted(packet.pts for packet in packets) == [p * step for p in range(8)]


def test_flac_round_trip_is_sample_exact_for_stereo_int16():
    samples = np.random.default_rng(1).integers(-32768, 32767, size=(20000, 2)).astype(np.int16)
    clip, codec = decode_audio(encode_flac(AudioClip(samples, 44100)))
    assert codec == "flac" and clip.sample_rate == 44100
    assert np.array_equal(clip.samples, samples)


def test_variable_frame_rate_timestamps_come_from_the_container(vfr_store):
    """Frames with irregular presentation times keep those times, not index / fps."""
    dataset = mmdata.open_dataset(str(vfr_store))
    frames = dataset.read_episode(0, streams=["cam"])["cam"]
    assert np.allclose(frames.timestamps, VFR_TIMES, atol=1e-3)
    window = dataset.read_episode(0, streams=["cam"], t0=VFR_TIMES[10] - 0.005, t1=VFR_TIMES[20] - 0.005)["cam"]
    assert [read_index_stripe(f) for f in window.values] == list(range(10, 20))


def test_dataset_json_round_trips_and_rejects_other_versions():
    schema = DatasetSchema(
        layout="zarr",
        streams=[
            TextStream(),
            VideoStream("cam", 30.0, 96, 64, "h264", 32, 16, crf=20),
            LowdimStream("state", (14,), "float32", 50.0),
        ],
        num_episodes=4,
    )
    assert DatasetSchema.from_json(schema.to_json()) == schema
    with pytest.raises(StoreError, match="format version 99; this mmdata reads version 1"):
        DatasetSchema.from_json(schema.to_json().replace('"format_version": 1', '"format_version": 99'))
    with pytest.raises(StoreError, match="does not describe an mmdata store"):
        DatasetSchema.from_json("{}")


def test_sizes_parse_in_decimal_and_binary_units():
    assert parse_size("1GB") == 10**9
    assert parse_size("64MiB") == 64 * 2**20
    assert parse_size("1500") == 1500
    with pytest.raises(MmdataError, match="write it like 1GB"):
        parse_size("lots")


@pytest.mark.slow
@pytest.mark.parametrize("codec", ["h264", "hevc", "vp9"])
def test_encoding_the_same_frames_twice_gives_the_same_bytes(codec):
    from fractions import Fraction

    from mmdata.codecs.video_encode import VideoEncoding, encode_segments
    from mmdata.synthetic import synthetic_frame

    frames = [synthetic_frame(i, 0, 224, 224) for i in range(64)]
    encoding = VideoEncoding(codec=codec)
    runs = [[data for _, data in encode_segments(frames, Fraction(30), 224, 224, encoding)] for _ in range(3)]
    assert runs[0] == runs[1] == runs[2], "a store must be reproducible byte for byte"
