"""A conversion killed mid-way resumes to a store identical to an uninterrupted one."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pyarrow.parquet as pq
import pytest
import zarr

from mmdata.errors import StoreError
from mmdata.synthetic import SynthSpec, write_synthetic_dataset
from mmdata.verify import verify_dataset
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


def zarr_arrays(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        group = zarr.open_group(str(path), mode="r")
        return {name: array[:] for name, array in group.arrays()} | {
            f"{g}/{n}": a[:] for g, sub in group.groups() for n, a in sub.arrays()
        }


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
            return len(list((partial / "episodes").glob("*.pkl"))) >= 2

    kill_when([sys.executable, "-m", "mmdata", "convert", str(raw_six), str(resumed), "--to", layout, *ARGS], ready)
    assert not (resumed / "dataset.json").exists(), "the run finished before it could be killed"
    with pytest.raises(StoreError, match="unfinished conversion"):
        verify_dataset(str(resumed), progress=False)

    finished = run_cli("convert", str(raw_six), str(resumed), "--to", layout, "--resume", *ARGS)
    assert finished.returncode == 0, finished.stderr
    assert "resumed at episode" in finished.stdout
    assert not partial.exists()
    assert verify_dataset(str(resumed), progress=False).ok
    assert pq.read_table(resumed / "episodes.parquet").equals(pq.read_table(reference / "episodes.parquet"))
    assert (resumed / "dataset.json").read_text() == (reference / "dataset.json").read_text()
    if layout == "wds":
        shards = sorted(p.name for p in (reference / "shards").iterdir())
        assert shards == sorted(p.name for p in (resumed / "shards").iterdir()) and len(shards) > 2
        for name in shards:
            assert (resumed / "shards" / name).read_bytes() == (reference / "shards" / name).read_bytes()
    else:
        expected, actual = zarr_arrays(reference), zarr_arrays(resumed)
        assert expected.keys() == actual.keys()
        for name in expected:
            assert np.array_equal(expected[name], actual[name]), name
