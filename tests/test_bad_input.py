"""Bad recordings and destinations fail loudly, naming the episode and file, and leave no store."""

from __future__ import annotations

import json

import numpy as np
import pytest

import mmdata
from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.errors import DestinationError, SourceError, StoreError
from mmdata.importers.raw import discover_raw_episodes
from mmdata.store.verification import verify_dataset


def convert_raw(raw, destination, **options):
    settings = {"layout": "wds", "workers": 1, "progress": False, **options}
    return convert(discover_raw_episodes(raw), destination, ConvertOptions(**settings))


def assert_no_store(destination):
    with pytest.raises(StoreError, match="no dataset.json"):
        verify_dataset(str(destination), progress=False)


def test_missing_camera_file_names_the_episode_and_camera(raw_copy, tmp_path):
    (raw_copy / "episode_0001" / "cam_wrist.mp4").unlink()
    with pytest.raises(SourceError, match=r"episode 'episode_0001', file 'cam_wrist\.mp4': missing camera"):
        convert_raw(raw_copy, tmp_path / "out")
    assert_no_store(tmp_path / "out")


@pytest.mark.slow
def test_skip_bad_converts_the_rest_and_reports_what_it_skipped(raw_copy, tmp_path):
    (raw_copy / "episode_0001" / "cam_wrist.mp4").unlink()
    report = convert_raw(raw_copy, tmp_path / "out", skip_bad=True, layout="zarr")
    assert report.converted == 2
    assert [s["episode"] for s in report.skipped] == ["episode_0001"]
    assert "cam_wrist" in report.skipped[0]["error"]
    dataset = mmdata.open_dataset(str(tmp_path / "out"))
    assert dataset.table.column("source").to_pylist() == ["episode_0000", "episode_0002"]
    assert dataset.schema.created["skipped_episodes"][0]["episode"] == "episode_0001"
    assert verify_dataset(str(tmp_path / "out"), progress=False).ok


def test_corrupt_mp4_names_the_episode_and_file(raw_copy, tmp_path):
    video = raw_copy / "episode_0002" / "cam_high.mp4"
    video.write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 20)
    with pytest.raises(SourceError, match=r"episode 'episode_0002', file '.*cam_high\.mp4': unreadable video"):
        convert_raw(raw_copy, tmp_path / "out")
    assert_no_store(tmp_path / "out")


@pytest.mark.slow
def test_truncated_mp4_is_reported_not_silently_shortened(raw_copy, tmp_path):
    video = raw_copy / "episode_0002" / "cam_high.mp4"
    video.write_bytes(video.read_bytes()[: video.stat().st_size // 3])
    with pytest.raises(SourceError, match=r"episode 'episode_0002'.*cam_high\.mp4"):
        convert_raw(raw_copy, tmp_path / "out")


def test_npy_whose_length_disagrees_with_the_video_is_rejected(raw_copy, tmp_path):
    state = raw_copy / "episode_0000" / "state.npy"
    np.save(state, np.zeros((200, 14), np.float32))
    with pytest.raises(SourceError, match=r"episode 'episode_0000', file '.*state\.npy'.*200 rows at 50 Hz"):
        convert_raw(raw_copy, tmp_path / "out")
    assert_no_store(tmp_path / "out")


def test_npy_without_a_rate_asks_for_one_in_meta_json(raw_copy, tmp_path):
    meta_path = raw_copy / "episode_0000" / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["rates"]["action"]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(SourceError, match=r"no sampling rate for stream 'action'.*meta\.json"):
        convert_raw(raw_copy, tmp_path / "out")


@pytest.mark.slow
def test_unreadable_audio_names_the_episode_and_file(raw_copy, tmp_path):
    (raw_copy / "episode_0001" / "audio.wav").write_bytes(b"RIFF\x10\x00\x00\x00WAVEjunkjunkjunk")
    with pytest.raises(SourceError, match=r"episode 'episode_0001', file '.*audio\.wav': unreadable audio"):
        convert_raw(raw_copy, tmp_path / "out")
    assert_no_store(tmp_path / "out")


@pytest.mark.slow
def test_non_empty_destination_needs_resume_or_overwrite(raw_dataset, tmp_path):
    destination = tmp_path / "out"
    destination.mkdir()
    (destination / "precious.txt").write_text("keep me")
    with pytest.raises(DestinationError, match="not empty; pass --resume .* or --overwrite"):
        convert_raw(raw_dataset, destination)
    assert (destination / "precious.txt").read_text() == "keep me"
    with pytest.raises(DestinationError, match="not an interrupted mmdata conversion"):
        convert_raw(raw_dataset, destination, resume=True)
    convert_raw(raw_dataset, destination, overwrite=True)
    assert not (destination / "precious.txt").exists()
    assert verify_dataset(str(destination), progress=False).ok


@pytest.mark.slow
def test_resume_refuses_changed_options(raw_copy, tmp_path):
    (raw_copy / "episode_0002" / "audio.wav").write_bytes(b"not audio")
    with pytest.raises(SourceError):
        convert_raw(raw_copy, tmp_path / "out", shard_bytes=100_000)
    with pytest.raises(DestinationError, match="shard_bytes changed"):
        convert_raw(raw_copy, tmp_path / "out", resume=True, shard_bytes=200_000)


@pytest.mark.slow
def test_failed_run_resumes_with_skip_bad_into_a_complete_store(raw_copy, tmp_path):
    (raw_copy / "episode_0002" / "audio.wav").write_bytes(b"not audio")
    with pytest.raises(SourceError):
        convert_raw(raw_copy, tmp_path / "out", shard_bytes=100_000)
    report = convert_raw(raw_copy, tmp_path / "out", resume=True, skip_bad=True, shard_bytes=100_000)
    assert 0 < report.resumed_at <= 2, "complete shards are kept, the open one is redone"
    assert report.converted == 2
    assert verify_dataset(str(tmp_path / "out"), progress=False).ok


def test_verify_reports_a_corrupted_piece_per_episode(stores, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(stores["wds"], copy)
    row = mmdata.open_dataset(str(copy)).manifest.row(1)
    segment = row["cam_high/segments"][0]
    shard = copy / segment["path"]
    data = bytearray(shard.read_bytes())
    data[segment["offset"] + 100] ^= 0xFF
    shard.write_bytes(bytes(data))
    report = verify_dataset(str(copy), progress=False)
    assert [f.index for f in report.failures] == [1]
    assert any("checksum mismatch" in p for p in report.failures[0].problems)
