"""A conversion killed mid-way resumes to a store identical to an uninterrupted one."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import pytest

import mmdata
from mmdata.errors import StoreError
from mmdata.store.verification import verify_dataset
from mmdata.synthetic import SynthSpec, read_index_stripe, write_synthetic_dataset
from tests.conftest import run_cli

ARGS = ("--workers", "1", "--shard-size", "60KB", "--quiet")


@pytest.fixture(scope="module")
def raw_six(tmp_path_factory):
    root = tmp_path_factory.mktemp("raw6")
    write_synthetic_dataset(root, SynthSpec(episodes=6, min_seconds=1.0, max_seconds=2.0, seed=3))
    return root


def kill_when(command, ready, timeout=120.0):
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while not ready() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.wait()


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["wds", "zarr"])
def test_killed_conversion_resumes_to_an_identical_store(raw_six, tmp_path, layout):
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    assert run_cli("convert", str(raw_six), str(reference), "--to", layout, *ARGS).returncode == 0

    partial = resumed / ".mmdata-partial"
    if layout == "wds":

        def ready():
            return (partial / "shard-000001.json").exists()
    else:

        def ready():
            return len(list((partial / "episodes").glob("*.episode"))) >= 2

    kill_when([sys.executable, "-m", "mmdata", "convert", str(raw_six), str(resumed), "--to", layout, *ARGS], ready)
    assert not (resumed / "dataset.json").exists(), "the run finished before it could be killed"
    with pytest.raises(StoreError, match="unfinished conversion"):
        verify_dataset(str(resumed), progress=False)

    finished = run_cli("convert", str(raw_six), str(resumed), "--to", layout, "--resume", *ARGS)
    assert finished.returncode == 0, finished.stderr
    assert "resumed at episode" in finished.stdout
    assert not partial.exists()
    assert verify_dataset(str(resumed), progress=False).ok
    assert (resumed / "dataset.json").read_text() == (reference / "dataset.json").read_text()
    expected_rows = pq.read_table(reference / "episodes.parquet").to_pylist()
    resumed_rows = pq.read_table(resumed / "episodes.parquet").to_pylist()
    assert [without_video_bytes(r) for r in resumed_rows] == [without_video_bytes(r) for r in expected_rows]
    expected, actual = mmdata.open_dataset(str(reference)), mmdata.open_dataset(str(resumed))
    for index in range(len(expected)):
        a, b = expected.read_episode(index), actual.read_episode(index)
        for name in ("state", "action", "audio"):
            assert np.array_equal(a[name].values, b[name].values) and np.array_equal(
                a[name].timestamps, b[name].timestamps
            )
        for camera in ("cam_high", "cam_wrist"):
            assert np.array_equal(a[camera].timestamps, b[camera].timestamps)
            assert [read_index_stripe(f) for f in a[camera].values] == [read_index_stripe(f) for f in b[camera].values]
            assert np.abs(a[camera].values.astype(int) - b[camera].values.astype(int)).mean() < 1.0
    if layout == "wds":
        assert len(list((resumed / "shards").iterdir())) > 2


def without_video_bytes(row: dict) -> dict:
    """A manifest row without what depends on encoded video sizes (segment and member addresses,
    packet indexes).

    x264 output for a segment is occasionally a few bytes different between two processes
    (seen about once in ten resumed runs, root cause not yet found), which shifts byte offsets;
    every other piece keeps its checksum and every frame its content.
    """
    kept = {k: v for k, v in row.items() if not k.endswith(("/segments", "/packets")) and k != "members"}
    for key in ("cam_high", "cam_wrist"):
        kept[f"{key}/indexed"] = [r is not None and len(r["packets"]) for r in row[f"{key}/packets"]]
        kept[f"{key}/frames"] = [(s["first_frame"], s["num_frames"]) for s in row[f"{key}/segments"]]
        kept.pop(f"{key}/timestamps", None)
        kept[f"{key}/timestamps_checksum"] = row[f"{key}/timestamps"]["checksum"]
    for key in ("state", "action", "audio"):
        kept[f"{key}/data"] = row[f"{key}/data"]["checksum"]
        if f"{key}/timestamps" in row:
            kept[f"{key}/timestamps"] = row[f"{key}/timestamps"]["checksum"]
    return kept


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["wds", "zarr"])
def test_resume_refuses_when_a_converted_episode_changed_since_the_interrupted_run(raw_six, tmp_path, layout):
    import shutil

    raw = tmp_path / "raw"
    shutil.copytree(raw_six, raw)
    resumed = tmp_path / "resumed"
    partial = resumed / ".mmdata-partial"

    def ready():
        if layout == "wds":
            return (partial / "shard-000001.json").exists()
        return len(list((partial / "episodes").glob("*.episode"))) >= 2

    kill_when([sys.executable, "-m", "mmdata", "convert", str(raw), str(resumed), "--to", layout, *ARGS], ready)
    assert not (resumed / "dataset.json").exists(), "the run finished before it could be killed"
    first = sorted(p for p in raw.iterdir() if p.is_dir())[0]
    state = np.load(first / "state.npy")
    np.save(first / "state.npy", state + 1.0)  # the same size: only its content and time tell
    finished = run_cli("convert", str(raw), str(resumed), "--to", layout, "--resume", *ARGS)
    assert finished.returncode == 2
    assert f"episode '{first.name}', already converted, was read from {first / 'state.npy'}" in finished.stderr
    assert "--overwrite" in finished.stderr
    assert not (resumed / "dataset.json").exists(), "no store was completed from stale episodes"
