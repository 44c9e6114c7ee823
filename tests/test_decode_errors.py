"""Bad video input: corrupt segments name episode, stream and segment; skipping counts; codecs fail early."""

from __future__ import annotations

import shutil
from fractions import Fraction

import numpy as np
import pytest

import mmdata
from mmdata.codecs.decoders import ClipRequest, SegmentRef, make_video_decoder
from mmdata.codecs.packet_index import PacketIndex
from mmdata.codecs.video_encode import VideoEncoding, encode_segments
from mmdata.errors import DecodeError, IntegrityError, UnsupportedCodecError
from mmdata.synthetic import synthetic_frame


@pytest.fixture
def damaged_store(stores, tmp_path):
    """A WebDataset store whose cam_high segment 1 of episode 1 has its second half zeroed."""
    copy = tmp_path / "damaged.wds"
    shutil.copytree(stores["wds"], copy)
    dataset = mmdata.open_dataset(str(copy))
    segment = dataset.manifest.row(1)["cam_high/segments"][1]
    with open(copy / segment["path"], "r+b") as shard:
        shard.seek(segment["offset"] + segment["size"] // 2)
        shard.write(bytes(segment["size"] - segment["size"] // 2))
    return copy


def test_corrupt_segment_fails_its_checksum_before_it_reaches_a_decoder(damaged_store):
    dataset = mmdata.open_dataset(str(damaged_store))
    with pytest.raises(IntegrityError, match=r"shard-\d+\.tar at \d+ .*checksum mismatch"):
        dataset.frames_at(1, "cam_high", [1.1, 1.2])


def zeroed_frame_time(dataset, episode: int, stream: str, number: int) -> float:
    """The time of a frame of segment `number` whose packet lies in the segment's zeroed second half."""
    row = dataset.manifest.row(episode)
    segment = row[f"{stream}/segments"][number]
    index = PacketIndex.from_record(row[f"{stream}/packets"][number], segment["size"], segment["num_frames"])
    position = int(np.flatnonzero(index.offsets >= segment["size"] // 2)[0])
    frame = segment["first_frame"] + int(index.frames[position])
    return float(dataset.timestamps_of(row, stream)[frame])


def test_corrupt_segment_read_unverified_raises_a_decode_error_naming_episode_stream_and_segment(damaged_store):
    dataset = mmdata.open_dataset(str(damaged_store), verify=False)
    assert dataset.frames_at(1, "cam_high", [0.0, 0.5]) is not None, "segment 0 is intact"
    damaged = zeroed_frame_time(dataset, 1, "cam_high", 1)
    with pytest.raises(DecodeError, match="episode 'episode_000001', stream 'cam_high', segment 1: h264 video does"):
        dataset.frames_at(1, "cam_high", [damaged])


def test_corrupt_segment_is_skipped_and_counted_under_on_error_skip(damaged_store):
    dataset = mmdata.open_dataset(str(damaged_store), verify=False)
    assert dataset.frames_at(1, "cam_high", [zeroed_frame_time(dataset, 1, "cam_high", 1)], on_error="skip") is None
    assert dataset.frames_at(1, "cam_wrist", [1.1], on_error="skip") is not None
    assert dataset.decoder.stats.skipped == 1
    assert "segment 1" in dataset.decoder.stats.skipped_where[0]


@pytest.mark.parametrize(
    ("backend", "codec", "options"),
    [("pyav", "h264", {}), ("decord", "hevc", {}), ("dali-cpu", "vp9", {"reuse_sessions": True, "pipelines": 1})],
)
def test_truncated_segment_in_a_batch_skips_only_that_request(backend, codec, options):
    frames = [synthetic_frame(i, 0, 64, 128) for i in range(24)]
    segments = [data for _, data in encode_segments(frames, Fraction(30), 128, 64, VideoEncoding(codec, 8, 4))]
    requests = [
        ClipRequest(segments[0], (1, 2), codec, SegmentRef("ep7", "cam", 0)),
        ClipRequest(segments[1][: len(segments[1]) // 3], (0,), codec, SegmentRef("ep7", "cam", 1)),
        ClipRequest(segments[2], (7,), codec, SegmentRef("ep7", "cam", 2)),
    ]
    decoder = make_video_decoder(backend, [codec], **options)
    first, broken, last = decoder.decode(requests, on_error="skip")
    assert broken is None and decoder.stats.skipped == 1
    assert first.shape == (2, 64, 128, 3) and last.shape == (1, 64, 128, 3)
    with pytest.raises(DecodeError, match=f"episode 'ep7', stream 'cam', segment 1: {codec} video does not decode"):
        decoder.decode(requests)


def test_requesting_a_frame_past_the_segment_end_is_a_decode_error():
    frames = [synthetic_frame(i, 0, 64, 128) for i in range(8)]
    ((_, data),) = encode_segments(frames, Fraction(30), 128, 64, VideoEncoding("h264", 8, 4))
    with pytest.raises(DecodeError, match="segment has 8 frames; frame 9 requested"):
        make_video_decoder("pyav", ["h264"]).decode([ClipRequest(data, (9,), "h264")])


def test_store_codec_the_chosen_decoder_cannot_read_fails_when_opened(store):
    with pytest.raises(UnsupportedCodecError, match="decoder 'dali-cpu' .*cannot decode h264 video; use decoder='"):
        mmdata.open_dataset(str(store), decoder="dali-cpu")


def test_decoded_frames_are_plain_numpy_by_default(store):
    clip = mmdata.open_dataset(str(store)).frames_at(0, "cam_high", [0.0])
    assert isinstance(clip.values, np.ndarray) and clip.values.dtype == np.uint8
