"""Decoding from stored packet indexes: exact frames without a container, checked indexes, YUV to RGB."""

from __future__ import annotations

import os
from fractions import Fraction

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from av.video.reformatter import VideoReformatter

import mmdata
from mmdata.codecs.colour import RGB_CONVERSION, rgb_into, to_rgb
from mmdata.codecs.decoders import ClipRequest, SegmentRef, make_video_decoder
from mmdata.codecs.nv12 import nv12_to_rgb
from mmdata.codecs.packet_index import PacketIndex, index_describes, index_segment
from mmdata.codecs.video_encode import VideoEncoding, encode_segments, encoding_for_access
from mmdata.errors import DecodeError, IntegrityError, SampleError
from mmdata.store.manifest import LEGACY_PACKET_INDEX, packets_column
from mmdata.store.verification import verify_dataset
from mmdata.synthetic import read_index_stripe, synthetic_frame

SEGMENT = 16


@pytest.fixture(scope="module")
def encoded() -> dict[tuple[str, int], list[bytes]]:
    """Segments of 40 frames per codec and key-frame interval; H.264 and HEVC with B-frames."""
    frames = [synthetic_frame(i, 0, 64, 128) for i in range(40)]
    return {
        (codec, gop): [d for _, d in encode_segments(frames, Fraction(30), 128, 64, VideoEncoding(codec, SEGMENT, gop))]
        for codec in ("h264", "hevc", "vp9")
        for gop in (1, 8)
    }


def indexed(data: bytes, frames: int) -> PacketIndex:
    return PacketIndex.from_record(index_segment(data).to_record(), len(data), frames)


@pytest.mark.slow
@pytest.mark.parametrize("codec", ["h264", "hevc", "vp9"])
@pytest.mark.parametrize("gop", [1, 8])
def test_packet_path_gives_the_container_paths_frames_and_the_nearest_frame_by_stripe(codec, gop, encoded):
    segments = encoded[(codec, gop)]
    rng = np.random.default_rng(gop)
    by_packets, by_container = make_video_decoder("pyav", [codec]), make_video_decoder("pyav", [codec])
    for _ in range(12):
        number = int(rng.integers(len(segments)))
        length = min(SEGMENT, 40 - SEGMENT * number)
        wanted = tuple(int(i) for i in rng.integers(0, length, size=int(rng.integers(1, 5))))
        where = SegmentRef("ep", "cam", number)
        data = segments[number]
        fast = by_packets.decode([ClipRequest(data, wanted, codec, where, gop, (128, 64), indexed(data, length))])[0]
        slow = by_container.decode([ClipRequest(data, wanted, codec, where, gop, (128, 64))])[0]
        assert np.array_equal(fast, slow)
        assert [read_index_stripe(f) for f in fast] == [SEGMENT * number + i for i in wanted]
    assert by_packets.stats.frames_decoded == by_container.stats.frames_decoded


def test_b_frames_are_in_the_h264_and_hevc_segments_the_packet_path_reorders(encoded):
    for codec in ("h264", "hevc"):
        index = index_segment(encoded[(codec, 8)][0])
        assert not np.array_equal(index.frames, np.arange(len(index))), f"{codec}: decode order is presentation order"


def test_a_packet_index_pointing_outside_its_segment_is_refused():
    data = [
        d
        for _, d in encode_segments(
            [synthetic_frame(i, 0, 64, 128) for i in range(4)], Fraction(30), 128, 64, VideoEncoding("h264", 4, 4)
        )
    ][0]
    record = index_segment(data).to_record()
    with pytest.raises(DecodeError, match="outside the segment's"):
        PacketIndex.from_record(record, 10, 4)
    with pytest.raises(DecodeError, match="lists 4 packets for 5 frames"):
        PacketIndex.from_record(record, len(data), 5)
    table = np.frombuffer(record["packets"], "<i4").reshape(4, 4).copy()
    table[1, 2] = 0
    with pytest.raises(DecodeError, match="each frame once"):
        PacketIndex.from_record({**record, "packets": table.tobytes()}, len(data), 4)


def test_index_describes_only_the_bytes_it_was_made_from(encoded):
    first, second = encoded[("h264", 8)][:2]
    assert index_describes(index_segment(first), first)
    assert not index_describes(index_segment(first), second)


def store_with_manifest(original, copy, table):
    """A store sharing `original`'s shards, with `table` as its manifest."""
    copy.mkdir()
    os.symlink(original / "shards", copy / "shards", target_is_directory=True)
    (copy / "dataset.json").write_bytes((original / "dataset.json").read_bytes())
    pq.write_table(table, copy / "episodes.parquet")
    return copy


def test_stores_hold_a_packet_index_per_segment_and_read_without_it_too(stores, tmp_path):
    dataset = mmdata.open_dataset(str(stores["wds"]))
    row = dataset.manifest.row(0)
    assert len(row["cam_high/packets"]) == len(row["cam_high/segments"])
    times = [0.0, 0.4, 1.3]
    expected = dataset.frames_at(0, "cam_high", times).values
    # a store written before packet indexes existed: the same manifest without the column
    table = pq.read_table(stores["wds"] / "episodes.parquet")
    legacy = store_with_manifest(
        stores["wds"],
        tmp_path / "legacy.wds",
        table.drop_columns([c for c in table.column_names if c.endswith("/packets")]),
    )
    old = mmdata.open_dataset(str(legacy))
    assert np.array_equal(old.frames_at(0, "cam_high", times).values, expected)


def test_a_damaged_packet_index_makes_its_episode_damaged_or_fails_naming_the_segment(stores, tmp_path):
    table = pq.read_table(stores["wds"] / "episodes.parquet")
    rows = table.to_pylist()
    column = packets_column("cam_high")
    rows[1][column][0] = {**rows[1][column][0], "packets": rows[1][column][0]["packets"][:-16]}
    record = rows[2][column][0]
    shifted = np.frombuffer(record["packets"], "<i4").reshape(-1, 4).copy()
    shifted[:, 0] += 1 << 24
    rows[2][column][0] = {**record, "packets": shifted.tobytes()}
    store = store_with_manifest(
        stores["wds"], tmp_path / "store.wds", type(table).from_pylist(rows, schema=table.schema)
    )
    dataset = mmdata.open_dataset(str(store))
    assert "packet index of 'cam_high'" in dataset.damaged[1]
    with pytest.raises(IntegrityError, match="episode 'episode_000002', stream 'cam_high', segment 0: .*outside"):
        dataset.frames_at(2, "cam_high", [0.0])


def test_windows_access_stores_every_frame_as_a_key_frame_and_both_access_tunes_gop_8_for_decoding():
    windows = encoding_for_access("windows")
    assert (windows.gop, windows.fast_decode) == (1, True)
    assert windows.encoder_options()["tune"] == "fastdecode"
    assert encoding_for_access("windows", gop=2).gop == 2, "an explicit --gop wins"
    assert encoding_for_access("clips") == VideoEncoding(fast_decode=False)
    assert encoding_for_access("both") == VideoEncoding(), "the default access is the default encoding"


def test_colour_kernel_agrees_with_ffmpegs_exact_conversion_within_one_level():
    """Against FFmpeg 8's scaler (PyAV 16 and later): FFmpeg 7's (PyAV 15, as LeRobot pins it) interpolates
    chroma vertically another way, so there the kernel is held to the same arithmetic written with torch
    (`codecs/nv12.py`, what the GPU path runs) instead."""
    rng = np.random.default_rng(0)
    planes = rng.integers(0, 256, (64 * 3 // 2, 96), dtype=np.uint8)  # Y rows, then U and V rows
    frame = av.VideoFrame.from_ndarray(planes, format="yuv420p")
    kernel = to_rgb(frame).astype(np.int16)
    u, v = planes[64:80].reshape(32, 96 // 2, order="C"), planes[80:].reshape(32, 96 // 2, order="C")
    nv12 = np.concatenate([planes[:64], np.stack([u, v], -1).reshape(32, 96)])
    same_arithmetic = nv12_to_rgb(torch.from_numpy(nv12), 64).numpy()
    assert np.abs(kernel - same_arithmetic).max() <= 1
    if int(av.__version__.split(".")[0]) >= 16:
        exact = VideoReformatter().reformat(frame, format="rgb24", interpolation=RGB_CONVERSION).to_ndarray()
        difference = np.abs(kernel - exact)
        assert difference.max() <= 1 and (difference > 0).mean() < 0.01


def test_frames_the_kernel_does_not_cover_go_through_ffmpeg():
    rgb = synthetic_frame(3, 0, 64, 96)
    full_range = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuvj420p")
    expected = VideoReformatter().reformat(full_range, format="rgb24", interpolation=RGB_CONVERSION).to_ndarray()
    out = np.zeros((64, 96, 3), np.uint8)
    rgb_into(full_range, out)
    assert np.array_equal(out, expected)


def test_verify_reports_a_packet_index_that_does_not_describe_its_segment(stores, tmp_path):
    table = pq.read_table(stores["wds"] / "episodes.parquet")
    rows = table.to_pylist()
    column = packets_column("cam_high")
    # a segment given the index of another segment of the same length but other bytes (episodes of the
    # synthetic set begin with the same frames, so their first segments are byte-identical)
    episode = next(number for number, row in enumerate(rows) if len(row["cam_high/segments"]) > 2)
    segments = rows[episode]["cam_high/segments"]
    assert segments[0]["num_frames"] == segments[1]["num_frames"] and segments[0]["checksum"] != segments[1]["checksum"]
    rows[episode][column][0] = rows[episode][column][1]
    tampered = type(table).from_pylist(rows, schema=table.schema)
    store = store_with_manifest(stores["wds"], tmp_path / "store.wds", tampered)
    report = verify_dataset(str(store), progress=False)
    assert [failure.index for failure in report.failures] == [episode]
    assert any("packet index does not describe its bytes" in problem for problem in report.failures[0].problems)


def test_a_consistently_edited_packet_index_fails_its_checksum_instead_of_swapping_frames(stores, tmp_path):
    table = pq.read_table(stores["wds"] / "episodes.parquet")
    rows = table.to_pylist()
    column = packets_column("cam_high")
    record = rows[0][column][0]
    packets = np.frombuffer(record["packets"], "<i4").reshape(-1, 4).copy()
    first, second = [p for p in range(len(packets)) if not packets[p, 3]][:2]  # two frames that are not key frames
    packets[[first, second], 2] = packets[[second, first], 2]  # the index still shows each frame once
    rows[0][column][0] = {**record, "packets": packets.tobytes()}
    store = store_with_manifest(stores["wds"], tmp_path / "edited.wds", pa.Table.from_pylist(rows, schema=table.schema))
    dataset = mmdata.open_dataset(str(store))
    times = (np.arange(12) / 30).tolist()
    with pytest.raises(IntegrityError, match="segment 0: its packet index does not match its checksum"):
        dataset.frames_at(0, "cam_high", times)
    spec = mmdata.Windows(anchor_fps=5, streams={"cam_high": mmdata.Frames(offsets=[0.0])})
    with pytest.raises(SampleError, match="checksum"):
        list(mmdata.DataLoader(dataset, spec, batch_size=4, num_workers=0))


def test_packet_indexes_without_a_checksum_are_not_used_and_the_frames_stay_right(stores, tmp_path):
    table = pq.read_table(stores["wds"] / "episodes.parquet")
    column = packets_column("cam_high")
    rows = table.to_pylist()
    for row in rows:
        for name in [c for c in row if c.endswith("/packets")]:
            row[name] = [{k: v for k, v in r.items() if k != "checksum"} for r in row[name]]
    legacy_type = pa.list_(LEGACY_PACKET_INDEX)
    schema = pa.schema([f.with_type(legacy_type) if f.name.endswith("/packets") else f for f in table.schema])
    rows[0][column][0]["packets"] = b"\0" * len(rows[0][column][0]["packets"])  # garbage, and unchecked
    legacy = store_with_manifest(stores["wds"], tmp_path / "legacy.wds", pa.Table.from_pylist(rows, schema=schema))
    times = (np.arange(12) / 30).tolist()
    expected = mmdata.open_dataset(str(stores["wds"])).frames_at(0, "cam_high", times).values
    old = mmdata.open_dataset(str(legacy))
    assert not old.damaged
    assert np.array_equal(old.frames_at(0, "cam_high", times).values, expected)
