"""Reads that stall, fail now and then, or fail for good: deadlines, retries of transient errors
only (WebDataset and Zarr alike), and loaders that finish their epoch under on_error="skip"."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time
from collections import Counter

import fsspec
import numpy as np
import pytest
from fsspec.implementations.memory import MemoryFileSystem

import mmdata
from mmdata.errors import IntegrityError, ReadError, ReadTimeoutError
from mmdata.store.filesystem import ReadPolicy, read_range
from tests.hostile.tampering import copy_store

QUICK = ReadPolicy(timeout_s=0.3, attempts=2, backoff_s=0.01)
POLICY_SPEC = mmdata.Windows(
    anchor_fps=5,
    streams={"cam_high": mmdata.Frames(offsets=[0.0]), "state": mmdata.Values(offsets=[0.0])},
)


class FaultyFileSystem(MemoryFileSystem):
    """An in-memory filesystem whose reads of files matching `FAULTS["pattern"]` stall until released
    (`"stall"`), fail once with a reset connection (`"flaky"`), fail every time with a throttling
    error (`"throttled"`), or whose files are gone (`"missing"`). Calls are counted per path."""

    protocol = "faulty"
    root_marker = "/"
    FAULTS: dict = {"mode": None, "pattern": "", "calls": Counter(), "release": threading.Event()}

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol(path.removeprefix("faulty://"))

    def cat_file(self, path, start=None, end=None, **kwargs):
        path = self._strip_protocol(path)
        faults = self.FAULTS
        if faults["mode"] and faults["pattern"] in path:
            faults["calls"][path] += 1
            if faults["mode"] == "stall":
                faults["release"].wait()
            elif faults["mode"] == "flaky" and faults["calls"][path] % 2 == 1:
                raise ConnectionResetError(errno.ECONNRESET, "connection reset by peer")
            elif faults["mode"] == "throttled":
                raise OSError("503 SlowDown: please reduce your request rate")
            elif faults["mode"] == "missing":
                raise FileNotFoundError(errno.ENOENT, "no such object", path)
        return super().cat_file(path, start=start, end=end, **kwargs)


fsspec.register_implementation("faulty", FaultyFileSystem, clobber=True)


@pytest.fixture
def faulty(stores, request):
    """Each layout's store copied into the faulty filesystem; faults reset afterwards."""
    fs = fsspec.filesystem("faulty")
    target = "/faulty/" + "".join(c if c.isalnum() else "-" for c in request.node.name)
    for layout, path in stores.items():
        fs.put(str(path), f"{target}/{layout}", recursive=True)
    FaultyFileSystem.FAULTS.update(mode=None, pattern="", calls=Counter(), release=threading.Event())
    yield {layout: f"faulty://{target}/{layout}" for layout in stores}
    FaultyFileSystem.FAULTS["release"].set()
    FaultyFileSystem.FAULTS["mode"] = None
    fs.rm(target, recursive=True)


def fault(mode: str, pattern: str) -> None:
    FaultyFileSystem.FAULTS.update(mode=mode, pattern=pattern)


def data_file(layout: str) -> str:
    return "shards/shard-000000.tar" if layout == "wds" else "data/state/c/0/0"


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["wds", "zarr"])
def test_a_stalled_read_times_out_within_its_deadline(faulty, layout):
    dataset = mmdata.open_dataset(faulty[layout], read_policy=QUICK)
    fault("stall", data_file(layout))
    started = time.perf_counter()
    with pytest.raises(ReadTimeoutError, match=r"did not finish within 0.3 s, 2 time\(s\)"):
        dataset.values_at(0, "state", [0.0])
    assert time.perf_counter() - started < 2.0


@pytest.mark.parametrize("layout", ["wds", "zarr"])
def test_a_transient_error_is_retried_and_the_read_succeeds(faulty, stores, layout):
    expected = mmdata.open_dataset(stores[layout]).values_at(0, "state", [0.0, 0.5]).values
    dataset = mmdata.open_dataset(faulty[layout], read_policy=QUICK)
    fault("flaky", data_file(layout))
    assert np.array_equal(dataset.values_at(0, "state", [0.0, 0.5]).values, expected)
    assert max(FaultyFileSystem.FAULTS["calls"].values()) >= 2


@pytest.mark.parametrize(
    ("layout", "error", "message"),
    [("wds", ReadError, "no such object"), ("zarr", IntegrityError, "checksum mismatch")],
    ids=["wds", "zarr-chunk-reads-as-fill-value"],
)
def test_a_missing_object_is_not_retried(faulty, layout, error, message):
    dataset = mmdata.open_dataset(faulty[layout], read_policy=ReadPolicy(attempts=5, backoff_s=1.0))
    fault("missing", data_file(layout))
    started = time.perf_counter()
    with pytest.raises(error, match=message):
        dataset.values_at(0, "state", [0.0])
    assert time.perf_counter() - started < 0.5
    assert sum(FaultyFileSystem.FAULTS["calls"].values()) == 1


def test_throttling_is_retried_with_backoff_then_named(faulty):
    dataset = mmdata.open_dataset(faulty["wds"], read_policy=ReadPolicy(attempts=3, backoff_s=0.05))
    fault("throttled", "shard-000000")
    started = time.perf_counter()
    with pytest.raises(ReadError, match=r"shard-000000.tar: reading .* failed 3 time\(s\) .* 503 SlowDown"):
        dataset.values_at(0, "state", [0.0])
    assert sum(FaultyFileSystem.FAULTS["calls"].values()) == 3
    assert time.perf_counter() - started >= 0.05 * (0.5 + 1.0), "waits between tries"


@pytest.mark.slow
def test_a_loader_over_a_stalled_shard_finishes_its_epoch_with_the_samples_skipped(faulty):
    dataset = mmdata.open_dataset(faulty["wds"], read_policy=QUICK)
    shard = dataset.manifest.row(0)["shard"]
    fault("stall", shard)
    loader = mmdata.DataLoader(dataset, POLICY_SPEC, batch_size=4, on_error="skip", num_workers=0)
    started = time.perf_counter()
    batches = list(loader)
    stats = loader.stats()
    assert batches and stats["skipped_samples"] > 0
    assert any("did not finish within" in problem for problem in stats["skipped"])
    assert time.perf_counter() - started < 120


@pytest.mark.slow
def test_a_fifo_in_place_of_a_shard_fails_at_once_instead_of_blocking(stores, tmp_path):
    store = copy_store(stores["wds"], tmp_path / "s.wds")
    shard = store / mmdata.open_dataset(store).manifest.row(0)["shard"]
    shard.unlink()
    os.mkfifo(shard)
    code = f"""
import time, mmdata
from mmdata.store.verification import verify_dataset
dataset = mmdata.open_dataset({str(store)!r})
started = time.perf_counter()
try:
    dataset.frames_at(0, "cam_high", [0.0])
except mmdata.IntegrityError as exc:
    assert "not a regular file" in str(exc), exc
assert time.perf_counter() - started < 2
report = verify_dataset({str(store)!r}, progress=False)
assert 0 in [failure.index for failure in report.failures]
spec = mmdata.Windows(anchor_fps=5, streams={{"cam_high": mmdata.Frames(), "state": mmdata.Values()}})
loader = mmdata.DataLoader({str(store)!r}, spec, batch_size=4, on_error="skip", num_workers=2)
assert list(loader) and loader.stats()["skipped_samples"] > 0
print("finished")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0 and "finished" in result.stdout, result.stderr[-2000:]


def test_read_range_refuses_a_negative_range_and_names_a_short_file(tmp_path):
    path = tmp_path / "short.bin"
    path.write_bytes(b"0123456789")
    fs = fsspec.filesystem("file")
    with pytest.raises(IntegrityError, match="invalid byte range"):
        read_range(fs, str(path), -1, 4)
    with pytest.raises(IntegrityError, match="truncated"):
        read_range(fs, str(path), 5, 100)
    assert read_range(fs, str(path), 2, 3) == b"234"
