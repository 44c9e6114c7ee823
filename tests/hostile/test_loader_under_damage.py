"""The loader under damage: with on_error="skip" every per-sample failure is counted and replaced,
a micro-batch whose samples all fail borrows from the samples planned after it, and all of it is
deterministic, so resuming gives the batches an uninterrupted run gives."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import mmdata
from tests.hostile.tampering import copy_store, flip_byte, replace_piece

SPEC = mmdata.Windows(
    anchor_fps=10,
    streams={"cam_high": mmdata.Frames(offsets=[0.0]), "state": mmdata.Values(offsets=[0.0])},
)


def damaged_camera(store, tmp_path, episode: int = 1):
    """A copy of the WebDataset store in which every cam_high segment of `episode` fails its checksum."""
    copy = copy_store(store, tmp_path / "damaged.wds")
    for segment in mmdata.open_dataset(copy).manifest.row(episode)["cam_high/segments"]:
        flip_byte(copy / segment["path"], segment["offset"] + segment["size"] // 2)
    return copy


def loader(store, **options):
    settings = {"batch_size": 2, "shuffle": "none", "on_error": "skip", "seed": 3, "num_workers": 0} | options
    return mmdata.DataLoader(store, SPEC, **settings)


def snapshot(batch) -> tuple:
    return (
        tuple(batch["sample_index"].tolist()),
        tuple(batch["episode_index"].tolist()),
        batch["cam_high"].numpy().tobytes(),
    )


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_micro_batches_whose_samples_all_fail_borrow_and_the_epoch_completes(stores, tmp_path, workers):
    store = damaged_camera(stores["wds"], tmp_path)
    run = loader(store, num_workers=workers)
    steps = len(run)
    batches = list(run)
    stats = run.stats()
    assert len(batches) == steps, "every rank keeps its step count"
    assert stats["borrowed_samples"] > 0 and stats["skipped_samples"] >= 2 * stats["borrowed_samples"] - 1
    assert all(1 not in batch["episode_index"].tolist() for batch in batches), "no damaged sample is delivered"
    assert all(len(batch["sample_index"]) >= 1 for batch in batches)


@pytest.mark.slow
def test_borrowing_is_the_same_on_every_run_and_after_resuming(stores, tmp_path):
    store = damaged_camera(stores["wds"], tmp_path)
    first = [snapshot(b) for b in loader(store)]
    assert first == [snapshot(b) for b in loader(store, num_workers=2)]
    interrupted = loader(store)
    iterator = iter(interrupted)
    for _ in range(5):
        next(iterator)
    state = interrupted.state_dict()
    resumed = loader(store)
    resumed.load_state_dict(state)
    assert [snapshot(b) for b in resumed] == first[5:]


def test_a_loader_with_raise_names_the_damaged_sample(stores, tmp_path):
    store = damaged_camera(stores["wds"], tmp_path)
    with pytest.raises(mmdata.SampleError, match=r"episode 'episode_000001', stream 'cam_high'.*checksum mismatch"):
        list(loader(store, on_error="raise"))


def test_frames_larger_than_declared_are_a_counted_skip_never_a_collate_crash(stores, tmp_path):
    from fractions import Fraction

    from mmdata.codecs.video_encode import VideoEncoding, encode_segments

    store = copy_store(stores["wds"], tmp_path / "big.wds")
    frames = (np.zeros((448, 448, 3), np.uint8) for _ in range(32))
    ((_, data),) = encode_segments(frames, Fraction(30), 448, 448, VideoEncoding("h264", 32, 8, preset="ultrafast"))
    replace_piece(store, 0, "cam_high/segments", data, segment=0)
    run = loader(store)
    batches = list(run)
    assert run.stats()["skipped_samples"] > 0
    assert all(batch["cam_high"].shape[-3:] == torch.Size([224, 224, 3]) for batch in batches)


@pytest.mark.slow
def test_import_mmdata_and_reading_a_store_never_load_torch(stores):
    code = (
        "import sys, mmdata\n"
        f"dataset = mmdata.open_dataset({str(stores['wds'])!r})\n"
        "dataset.read_episode(0)\n"
        "from mmdata.tools import cli\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    for _ in range(5):
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        assert "terminate called" not in result.stderr


def test_every_episode_damaged_with_skip_says_so_not_that_the_spec_yields_nothing(stores, tmp_path):
    from tests.hostile.tampering import edit_manifest

    store = copy_store(stores["wds"], tmp_path / "s.wds")

    def stretch(rows):
        for row in rows:
            row["duration"] = 1e12

    edit_manifest(store, stretch)
    count = len(mmdata.open_dataset(store))
    with pytest.raises(mmdata.StoreError, match=f"all {count} selected episode.s. were left out as damaged.*verify"):
        loader(store, on_error="skip")


def test_arrow_never_holds_the_python_bytes_of_a_manifest_while_it_reads_them(stores, monkeypatch):
    """The process aborted at exit ("terminate called without an active exception", rc 134) when a reader of
    Arrow's thread pool freed a buffer wrapping the manifest's Python bytes after the interpreter had begun to shut
    down: freeing such a buffer takes the interpreter lock. Arrow must read the manifest from memory it owns."""
    import pyarrow.parquet as pq

    from mmdata.store import manifest_reader

    manifest = (Path(stores["wds"]) / "episodes.parquet").read_bytes()
    baseline = {}
    seen = []
    original_read_file, original_read = manifest_reader.read_file, pq.ParquetFile.read

    def read_file(fs, path, *args):
        if path.endswith("episodes.parquet"):
            baseline["refs"] = sys.getrefcount(manifest)
            return manifest
        return original_read_file(fs, path, *args)

    def read(self, *args, **kwargs):
        seen.append(sys.getrefcount(manifest) - baseline["refs"])
        return original_read(self, *args, **kwargs)

    monkeypatch.setattr(manifest_reader, "read_file", read_file)
    monkeypatch.setattr(pq.ParquetFile, "read", read)
    mmdata.open_store(str(stores["wds"]))
    assert len(seen) == 1 and seen[0] <= 1, "at most a name of the reader's holds the bytes while Arrow parses them"


@pytest.mark.slow
def test_a_refused_second_loader_after_iterating_leaves_the_process_to_exit_cleanly(stores):
    code = (
        "import mmdata\n"
        f"store = {str(stores['wds'])!r}\n"
        "spec = mmdata.Windows(anchor_fps=10, streams={'cam_high': mmdata.Frames(offsets=[0.0])})\n"
        "for step, batch in enumerate(mmdata.DataLoader(store, spec, batch_size=4)):\n"
        "    if step == 2: break\n"
        "try:\n"
        "    other = mmdata.Windows(anchor_fps=10, streams={'nope': mmdata.Frames(offsets=[0.0])})\n"
        "    mmdata.DataLoader(store, other, batch_size=4)\n"
        "except mmdata.SpecError:\n"
        "    pass\n"
    )
    for _ in range(5):
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0 and "terminate called" not in result.stderr, result.stderr[-2000:]
