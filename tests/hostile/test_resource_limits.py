"""Small hostile inputs cannot make a reader or an importer allocate without bound.

Each case runs in a fresh interpreter whose address space is capped (RLIMIT_AS) and reports its
peak resident memory; the bound asserted is far below what the input declares (gigabytes).
"""

from __future__ import annotations

import json
import time
from fractions import Fraction

import numpy as np
import pytest

import mmdata
from tests.hostile.tampering import (
    copy_store,
    edit_manifest,
    flac_silence_bomb,
    replace_piece,
    run_limited,
    zstd_rle_frame,
)

ADDRESS_SPACE = 1300 << 20  # what the capped interpreter may map beyond its loaded libraries
# what a case may add to the interpreter's own size once its libraries are loaded (about 340 MB with the CPU
# torch, more with the CUDA build): reading the test store takes about 60 MB
PEAK_INCREASE = 150 << 20


def assert_bounded(result: dict, error: str) -> None:
    assert result["outcome"] is not None, result["stderr"]
    assert error in result["outcome"], result["outcome"]
    print(f"increase {result['increase'] >> 20} MB over the loaded libraries")
    assert result["increase"] < PEAK_INCREASE, f"peak RSS {result['increase'] >> 20} MB over the libraries"


def read_all(store) -> str:
    return f"""
    import mmdata
    dataset = mmdata.open_dataset({str(store)!r})
    def read():
        for episode in range(len(dataset)):
            dataset.read_episode(episode)
    report(outcome_of(read))
    """


def convert_code(source, source_format: str, fps: float, destination) -> str:
    return f"""
    from mmdata.conversion.pipeline import ConvertOptions, convert
    from mmdata.importers import discover_episodes
    def run():
        sources = discover_episodes({str(source)!r}, {source_format!r}, fps={fps})
        convert(sources, {str(destination)!r}, ConvertOptions(workers=1, progress=False))
    report(outcome_of(run))
    """


@pytest.mark.slow
def test_zstd_chunk_expanding_to_gigabytes_is_refused_from_its_header(stores, tmp_path):
    store = copy_store(stores["zarr"], tmp_path / "s.zarr")
    bomb = zstd_rle_frame(int(2.5e9))
    assert len(bomb) < 80_000
    (store / "data" / "state" / "c" / "0" / "0").write_bytes(bomb)
    assert_bounded(run_limited(read_all(store), ADDRESS_SPACE), "IntegrityError")


def test_zarr_chunk_shape_too_large_to_read_at_once_is_refused_when_opened(stores, tmp_path):
    store = copy_store(stores["zarr"], tmp_path / "s.zarr")
    meta = store / "data" / "state" / "zarr.json"
    document = json.loads(meta.read_text())
    document["chunk_grid"]["configuration"]["chunk_shape"] = [50_000_000, 14]
    meta.write_text(json.dumps(document))
    with pytest.raises(mmdata.StoreError, match="more than the 268435456 read at once"):
        mmdata.open_dataset(store)


@pytest.mark.slow
def test_segment_of_4096x4096_frames_in_a_224x224_store_is_refused_before_decoding(stores, tmp_path):
    from mmdata.codecs.video_encode import VideoEncoding, encode_segments

    store = copy_store(stores["wds"], tmp_path / "s.wds")
    frames = (np.zeros((4096, 4096, 3), np.uint8) for _ in range(16))
    ((_, data),) = encode_segments(frames, Fraction(30), 4096, 4096, VideoEncoding("h264", 16, 8, preset="ultrafast"))
    assert len(data) < 200_000
    replace_piece(store, 0, "cam_high/segments", data, segment=0)
    result = run_limited(read_all(store), ADDRESS_SPACE)
    assert_bounded(result, "DecodeError")
    assert "holds 4096x4096 frames, the store says 224x224" in result["outcome"]
    verify = run_limited(
        f"""
        from mmdata.store.verification import verify_dataset
        failures = verify_dataset({str(store)!r}, progress=False).failures
        report([problem for failure in failures for problem in failure.problems][0])
        """,
        ADDRESS_SPACE,
    )
    assert_bounded(verify, "4096x4096")


def test_audio_with_other_channels_and_rate_than_declared_is_refused_before_decoding(stores, tmp_path):
    from mmdata.codecs.audio import AudioClip, encode_flac

    store = copy_store(stores["wds"], tmp_path / "s.wds")
    replace_piece(store, 0, "audio/data", encode_flac(AudioClip(np.zeros((48000, 8), np.int16), 48000)))
    with pytest.raises(mmdata.IntegrityError, match="is 48000 Hz, the store says 16000 Hz"):
        mmdata.open_dataset(store).audio_between(0, "audio", 0.0, 0.5)


@pytest.mark.slow
def test_audio_holding_hours_more_than_declared_stops_decoding_at_the_declared_count(stores, tmp_path):
    store = copy_store(stores["wds"], tmp_path / "s.wds")
    bomb = flac_silence_bomb(2 * 3600)  # 115 M samples (230 MB) in 25 KB of valid FLAC
    assert len(bomb) < 30_000
    replace_piece(store, 0, "audio/data", bomb)
    result = run_limited(read_all(store), ADDRESS_SPACE)
    assert_bounded(result, "IntegrityError")
    assert "holds more than the" in result["outcome"]


@pytest.mark.slow
def test_manifest_durations_of_a_million_seconds_leave_a_loader_small_and_quick(stores, tmp_path):
    store = copy_store(stores["wds"], tmp_path / "s.wds")

    def stretch(rows):
        for name in ("duration", "state/t_end", "action/t_end"):
            rows[1][name] = 1e6 if name == "duration" else 1e6
        rows[2]["duration"] = 1e12

    edit_manifest(store, stretch)
    code = f"""
    import time
    import mmdata
    spec = mmdata.Windows(anchor_fps=10, streams={{"state": mmdata.Values(offsets=[0.0])}})
    started = time.perf_counter()
    def build():
        loader = mmdata.DataLoader({str(store)!r}, spec, batch_size=4, on_error="skip")
        assert sorted(loader.stats()["excluded_episodes"]) == [1, 2], loader.stats()["excluded_episodes"]
        assert len(loader.samples) < 100
        list(loader)
        assert time.perf_counter() - started < 30
    report(outcome_of(build))
    """
    result = run_limited(code, 4 << 30)
    assert result["outcome"] == "ok", result
    assert result["increase"] < 700 << 20
    with pytest.raises(mmdata.StoreError, match="2 episode.s. have inconsistent manifest rows.*on_error='skip'"):
        mmdata.DataLoader(
            store,
            mmdata.Windows(anchor_fps=10, streams={"state": mmdata.Values()}),
            batch_size=4,
            on_error="raise",
            num_workers=0,
        )


@pytest.mark.slow
def test_hdf5_dataset_declaring_gigabytes_is_refused_before_it_is_read(tmp_path):
    import h5py

    source = tmp_path / "aloha"
    source.mkdir()
    with h5py.File(source / "episode_0.hdf5", "w") as handle:
        handle.create_dataset("observations/images/top", data=np.zeros((10, 32, 32, 3), np.uint8))
        handle.create_dataset("observations/qpos", shape=(30_000_000, 28), dtype="float32", chunks=(65536, 28))
        handle.create_dataset("action", data=np.zeros((10, 14), np.float32))
    assert (source / "episode_0.hdf5").stat().st_size < 1_000_000
    result = run_limited(convert_code(source, "hdf5", 50, tmp_path / "out"), ADDRESS_SPACE)
    assert_bounded(result, "SourceError")
    assert "qpos" in result["outcome"] and "declares 30000000 rows" in result["outcome"]


@pytest.mark.slow
def test_hdf5_camera_declaring_100000_unwritten_frames_is_refused_before_a_frame_is_read(tmp_path):
    import h5py

    source = tmp_path / "aloha"
    source.mkdir()
    with h5py.File(source / "episode_0.hdf5", "w") as handle:
        handle.create_dataset(
            "observations/images/top", shape=(100_000, 64, 64, 3), dtype="uint8", chunks=(1, 64, 64, 3)
        )
        handle.create_dataset("observations/qpos", data=np.zeros((50, 14), np.float32))
        handle.create_dataset("action", data=np.zeros((50, 14), np.float32))
    assert (source / "episode_0.hdf5").stat().st_size < 1_000_000
    started = time.perf_counter()
    result = run_limited(convert_code(source, "hdf5", 50, tmp_path / "out"), ADDRESS_SPACE)
    assert_bounded(result, "SourceError")
    assert "camera 'top' declares 100000 frames at 50 Hz = 2000.000 s, but stream" in result["outcome"]
    assert time.perf_counter() - started < 60, "no frame was read or encoded"


def gif_declaring(width: int, height: int) -> bytes:
    """A 35-byte GIF whose screen and image declare `width` x `height` (one LZW block of a few codes)."""
    size = width.to_bytes(2, "little") + height.to_bytes(2, "little")
    screen = b"GIF89a" + size + b"\x80\x00\x00" + b"\x00\x00\x00\xff\xff\xff"  # 2-colour palette
    return screen + b"\x2c\x00\x00\x00\x00" + size + b"\x00\x02\x02\x44\x01\x00\x3b"


@pytest.mark.parametrize(
    "picture",
    [gif_declaring(16000, 16000), b"\xff\xd8\xff\xe0\x00\x10JFIF" + bytes(20)],
    ids=["gif-16000x16000", "jpeg-without-a-frame-header"],
)
@pytest.mark.slow
def test_an_image_in_a_format_whose_size_is_not_checked_is_refused_before_decoding(picture):
    code = f"""
    from mmdata.importers.arrays import decode_image
    report(outcome_of(lambda: decode_image({picture!r}, "episode_0", "log.mcap:/camera/compressed")))
    """
    result = run_limited(code, ADDRESS_SPACE)
    assert_bounded(result, "SourceError")
    assert "not a PNG or JPEG with a readable header" in result["outcome"]


@pytest.mark.slow
def test_converting_large_frames_holds_neither_a_segment_nor_a_block_of_them(tmp_path):
    import av
    import h5py

    side, count = 2048, 40  # 12.6 MB of RGB each: a segment of 32 held at once took 400 MB, a block of 64 800 MB
    encoder = av.CodecContext.create("mjpeg", "w")
    encoder.width = encoder.height = side
    encoder.pix_fmt = "yuvj420p"
    picture = av.VideoFrame.from_ndarray(np.full((side, side, 3), 90, np.uint8), format="rgb24")
    jpeg = b"".join(bytes(p) for p in [*encoder.encode(picture.reformat(format="yuvj420p")), *encoder.encode(None)])
    source = tmp_path / "aloha"
    source.mkdir()
    with h5py.File(source / "episode_0.hdf5", "w") as handle:
        images = handle.create_dataset("observations/images/top", (count,), dtype=h5py.vlen_dtype(np.uint8))
        for row in range(count):
            images[row] = np.frombuffer(jpeg, np.uint8)
        handle.create_dataset("observations/qpos", data=np.zeros((count, 14), np.float32))
    result = run_limited(convert_code(source, "hdf5", 10, tmp_path / "out"), 4 << 30)
    assert result["outcome"] == "ok", result
    assert result["increase"] < 700 << 20, f"{result['increase'] >> 20} MB over the libraries (1.9 GB before)"


@pytest.mark.slow
def test_replay_buffer_of_a_few_kilobytes_declaring_gigabytes_is_refused(tmp_path):
    import zarr

    path = tmp_path / "replay.zarr"
    group = zarr.open_group(str(path), mode="w", zarr_format=2)
    group.create_array("data/action", shape=(45_000_000, 14), chunks=(45_000_000, 14), dtype="float32")
    ends = group.create_array("meta/episode_ends", shape=(1,), dtype="int64")
    ends[:] = [45_000_000]
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    assert size < 8_000
    result = run_limited(convert_code(path, "zarr-replay", 10, tmp_path / "out"), ADDRESS_SPACE)
    assert_bounded(result, "SourceError")
    assert "chunks of 2520000000 bytes" in result["outcome"]


@pytest.mark.slow
def test_npy_file_declaring_1e11_rows_is_refused_without_reading(raw_copy):
    from mmdata.conversion.pipeline import ConvertOptions, convert
    from mmdata.importers.raw import discover_raw_episodes

    path = raw_copy / "episode_0001" / "state.npy"
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (100000000000, 14), }"
    header += " " * (117 - len(header)) + "\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + bytes(64))
    options = ConvertOptions(workers=1, progress=False, skip_bad=True)
    report = convert(discover_raw_episodes(raw_copy), raw_copy.parent / "out", options)
    assert [s["episode"] for s in report.skipped] == ["episode_0001"]
    assert "declares (100000000000, 14)" in report.skipped[0]["error"]
