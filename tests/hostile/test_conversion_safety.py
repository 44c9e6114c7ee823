"""Conversion is boring and safe: the source is never touched, a failure leaves what was done
resumable, resume state is data, crashed or killed workers are handled, encoders get clean frames."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import io
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import av
import numpy as np
import pytest

import mmdata
from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.errors import DestinationError
from mmdata.importers.raw import discover_raw_episodes
from mmdata.store.verification import verify_dataset
from mmdata.synthetic import SynthSpec, synthetic_frame, write_synthetic_dataset
from tests.conftest import run_cli


def fingerprint(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    "destination",
    [lambda raw: raw, lambda raw: raw.parent, lambda raw: raw / "episode_0001", lambda raw: raw / "new-store"],
    ids=["same-folder", "folder-holding-the-source", "an-episode-folder", "a-folder-inside-the-source"],
)
def test_a_destination_overlapping_the_source_is_refused_and_the_source_is_untouched(raw_copy, destination):
    before = fingerprint(raw_copy)
    result = run_cli("convert", str(raw_copy), str(destination(raw_copy)), "--overwrite", "--quiet")
    assert result.returncode == 2, result.stdout
    assert "overlaps the source" in result.stderr or "holds source recordings" in result.stderr
    assert fingerprint(raw_copy) == before


@pytest.mark.slow
def test_a_destination_holding_the_source_files_is_refused_even_without_the_source_root(raw_copy):
    before = fingerprint(raw_copy)
    with pytest.raises(DestinationError, match="holds source recordings"):
        convert(discover_raw_episodes(raw_copy), raw_copy.parent, ConvertOptions(overwrite=True, progress=False))
    assert fingerprint(raw_copy) == before


def test_overwrite_through_a_symbolic_link_is_refused(raw_dataset, tmp_path):
    target = tmp_path / "important"
    target.mkdir()
    (target / "keep.txt").write_text("keep me")
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(DestinationError, match="is a symbolic link"):
        convert(discover_raw_episodes(raw_dataset), link, ConvertOptions(overwrite=True, progress=False, workers=1))
    assert (target / "keep.txt").read_text() == "keep me"


def test_a_read_only_destination_is_a_destination_error(raw_dataset, tmp_path, monkeypatch):
    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(DestinationError, match="cannot write .*Read-only file system; choose a writable destination"):
        convert(discover_raw_episodes(raw_dataset), tmp_path / "out", ConvertOptions(progress=False, workers=1))


@pytest.mark.slow
def test_a_full_disk_is_a_destination_error_and_resume_completes_the_store(raw_dataset, tmp_path, monkeypatch):
    from mmdata.store.wds_writer import ShardTar

    options = ConvertOptions(progress=False, workers=1, shard_bytes=150_000)
    original = ShardTar._add_member
    calls = {"n": 0}

    def fill_up(self, name, data):
        calls["n"] += 1
        if calls["n"] > 40:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "out" / "shards"))
        return original(self, name, data)

    monkeypatch.setattr(ShardTar, "_add_member", fill_up)
    with pytest.raises(DestinationError, match="the disk is full .*--resume"):
        convert(discover_raw_episodes(raw_dataset), tmp_path / "out", options)
    monkeypatch.setattr(ShardTar, "_add_member", original)
    report = convert(discover_raw_episodes(raw_dataset), tmp_path / "out", dataclasses.replace(options, resume=True))
    assert report.resumed_at > 0 and report.converted == 3
    assert verify_dataset(str(tmp_path / "out"), progress=False).ok
    fresh = convert(discover_raw_episodes(raw_dataset), tmp_path / "fresh", options)
    assert fresh.converted == 3
    assert (tmp_path / "out" / "dataset.json").read_text() == (tmp_path / "fresh" / "dataset.json").read_text()


@pytest.mark.slow
def test_resume_state_is_data_and_a_planted_pickle_runs_nothing(raw_copy, tmp_path):
    (raw_copy / "episode_0002" / "audio.wav").write_bytes(b"not audio")
    destination = tmp_path / "out"
    options = ConvertOptions(layout="zarr", progress=False, workers=1)
    with pytest.raises(mmdata.SourceError):
        convert(discover_raw_episodes(raw_copy), destination, options)
    cached = sorted((destination / ".mmdata-partial" / "episodes").iterdir())
    assert cached and all(path.suffix == ".episode" for path in cached)
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    cached[-1].write_bytes(pickle.dumps({"episode": Payload(), "checkpoint": Payload()}))
    (cached[-1].parent / "00000009.pkl").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(DestinationError, match=r"\.episode: the saved episode cannot be resumed from"):
        convert(discover_raw_episodes(raw_copy), destination, dataclasses.replace(options, resume=True, skip_bad=True))
    assert not marker.exists()


@pytest.mark.slow
def test_a_killed_conversion_leaves_no_worker_running(tmp_path):
    raw = tmp_path / "raw"
    write_synthetic_dataset(raw, SynthSpec(episodes=8, min_seconds=4, max_seconds=6))
    process = subprocess.Popen(
        [sys.executable, "-m", "mmdata", "convert", str(raw), str(tmp_path / "out"), "--workers", "2", "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    children: set[int] = set()
    deadline = time.monotonic() + 60
    while len(children) < 2 and time.monotonic() < deadline and process.poll() is None:
        children |= children_of(process.pid)
        time.sleep(0.1)
    assert len(children) >= 2, "the conversion started its workers"
    time.sleep(1.0)
    children |= children_of(process.pid)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in children if alive(pid)], "workers outlived their parent"


def children_of(parent: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == parent:
                found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_a_worker_that_crashes_is_named_and_the_other_episodes_are_converted(raw_dataset, tmp_path):
    from tests.hostile.crashing import CrashingCamera

    sources = discover_raw_episodes(raw_dataset)
    broken = sources[1]
    sources[1] = dataclasses.replace(broken, cameras=(CrashingCamera(**dataclasses.asdict(broken.cameras[0])),))
    options = ConvertOptions(progress=False, workers=2, skip_bad=True)
    report = convert(sources, tmp_path / "out", options)
    assert report.converted == 2
    assert [s["episode"] for s in report.skipped] == ["episode_0001"]
    assert "the worker process converting it crashed" in report.skipped[0]["error"]


def b_frame_recording(folder: Path, key_every: int) -> Path:
    """A libx264 recording with B-frames and a key frame every `key_every` frames."""
    folder.mkdir(parents=True)
    with av.open(str(folder / "cam.mp4"), "w") as container:
        stream = container.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = 128, 96, "yuv420p"
        stream.options = {"x264-params": f"keyint={key_every}:min-keyint={key_every}:bframes=3:b-adapt=0"}
        for index in range(96):
            frame = av.VideoFrame.from_ndarray(synthetic_frame(index, 0, 96, 128), format="rgb24")
            frame.pts = index
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    with av.open(str(folder / "cam.mp4")) as container:
        types = {str(frame.pict_type) for frame in container.decode(video=0)}
    assert "3" in types or "B" in types, "the recording has B-frames"
    return folder


@pytest.mark.slow
def test_hevc_conversion_of_a_recording_with_b_frames_succeeds(tmp_path):
    b_frame_recording(tmp_path / "raw" / "episode_0", key_every=250)
    result = run_cli("convert", str(tmp_path / "raw"), str(tmp_path / "out"), "--video-codec", "hevc", "--workers", "1")
    assert result.returncode == 0, result.stderr[-2000:]
    assert verify_dataset(str(tmp_path / "out"), progress=False).ok


def test_stored_segments_follow_their_own_key_frame_interval_not_the_recordings(tmp_path):
    b_frame_recording(tmp_path / "raw" / "episode_0", key_every=5)
    convert(discover_raw_episodes(tmp_path / "raw"), tmp_path / "out", ConvertOptions(progress=False, workers=1))
    dataset = mmdata.open_dataset(tmp_path / "out")
    segment = dataset.manifest.row(0)["cam/segments"][0]
    data = dataset.pieces.read_bytes(mmdata.store.manifest.Piece.from_dict(segment))
    with av.open(io.BytesIO(data)) as container:
        keys = [packet.is_keyframe for packet in container.demux(video=0) if packet.size]
    gop = dataset.schema.stream("cam").gop
    assert np.flatnonzero(keys).tolist() == list(range(0, len(keys), gop))


@pytest.mark.slow
def test_tampered_shard_records_are_a_destination_error_on_resume(raw_copy, tmp_path):
    import json

    (raw_copy / "episode_0002" / "audio.wav").write_bytes(b"not audio")
    destination = tmp_path / "out"
    options = ConvertOptions(progress=False, workers=1, shard_bytes=100_000)
    with pytest.raises(mmdata.SourceError):
        convert(discover_raw_episodes(raw_copy), destination, options)
    sidecar = sorted((destination / ".mmdata-partial").glob("shard-*.json"))[0]
    resume = dataclasses.replace(options, resume=True, skip_bad=True)
    sidecar.write_text('{"rows": "not rows"}')
    with pytest.raises(DestinationError, match="holds no list of manifest rows"):
        convert(discover_raw_episodes(raw_copy), destination, resume)
    sidecar.write_text(json.dumps({"rows": [], "checkpoint": {"next_position": 99, "next_index": 0}}))
    with pytest.raises(DestinationError, match="next_position is 99, outside"):
        convert(discover_raw_episodes(raw_copy), destination, resume)


@pytest.mark.slow
def test_a_second_conversion_into_a_destination_being_written_is_refused_and_the_first_completes(tmp_path):
    raw = tmp_path / "raw"
    write_synthetic_dataset(raw, SynthSpec(episodes=6, min_seconds=2, max_seconds=3))
    destination = tmp_path / "out"
    first = subprocess.Popen(
        [sys.executable, "-m", "mmdata", "convert", str(raw), str(destination), "--workers", "1", "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (destination / ".mmdata-partial").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    second = subprocess.run(
        [sys.executable, "-m", "mmdata", "convert", str(raw), str(destination), "--overwrite", "--to", "zarr"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert second.returncode == 2 and "is being written by another mmdata writer" in second.stderr
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert json.loads((destination / "dataset.json").read_text())["layout"] == "wds"
    assert verify_dataset(str(destination), progress=False).ok
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "mmdata",
            "convert",
            str(raw),
            str(destination),
            "--overwrite",
            "--to",
            "zarr",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr
    assert json.loads((destination / "dataset.json").read_text())["layout"] == "zarr", "the lock ends with the run"
