"""Shared fixtures: a small synthetic raw dataset and its conversions to both layouts."""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from mmdata.codecs.video_encode import VideoEncoding, encode_segments
from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.importers.raw import discover_raw_episodes
from mmdata.store import manifest_reader
from mmdata.store.scaled_store import write_scaled_store
from mmdata.synthetic import SynthSpec, synthetic_frame, write_synthetic_dataset, write_wav


def pytest_sessionfinish(session, exitstatus):
    """End any child process a test left running: Python's exit waits for every child it started, so one hung
    child would keep the run from ever finishing. Each is named, and the run fails. Loaders no test refers to
    any more, kept only by reference cycles (an exception's traceback holds the frame that holds the loader),
    are collected first: they stop their own workers."""
    gc.collect()
    leftover = multiprocessing.active_children()
    for child in leftover:
        child.kill()
        with contextlib.suppress(RuntimeError):  # torch's handler reports a DataLoader worker killed: we know
            child.join(10)
    if leftover:
        names = ", ".join(f"{child.name} (pid {child.pid})" for child in leftover)
        session.config.get_terminal_writer().line(f"child processes left running by the tests, killed: {names}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


SMALL = SynthSpec(episodes=3, min_seconds=1.5, max_seconds=3.0)
SEGMENT, GOP = 16, 4  # frames per encoded segment, key-frame interval: the decoder tests' `segments`
LAYOUTS = ("wds", "zarr")
EPISODES, GROUP_ROWS = 40, 8  # the scaled store's episodes and manifest row groups


@pytest.fixture(scope="session")
def raw_dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("raw")
    write_synthetic_dataset(root, SMALL)
    return root


@pytest.fixture(scope="session")
def stores(raw_dataset, tmp_path_factory) -> dict[str, Path]:
    """The raw dataset converted to each layout; WebDataset in several small shards."""
    converted = {}
    for layout in LAYOUTS:
        destination = tmp_path_factory.mktemp("stores") / f"out.{layout}"
        options = ConvertOptions(layout=layout, shard_bytes=150_000, workers=1, progress=False)
        convert(discover_raw_episodes(raw_dataset), destination, options)
        converted[layout] = destination
    return converted


@pytest.fixture(scope="session")
def segments() -> dict[str, list[bytes]]:
    """40 synthetic 128x64 frames encoded as segments of SEGMENT frames, per codec."""
    frames = [synthetic_frame(i, 0, 64, 128) for i in range(40)]
    return {
        codec: [data for _, data in encode_segments(frames, Fraction(30), 128, 64, VideoEncoding(codec, SEGMENT, GOP))]
        for codec in ("h264", "hevc", "vp9")
    }


@pytest.fixture(params=LAYOUTS)
def store(request, stores) -> Path:
    return stores[request.param]


VFR_TIMES = np.cumsum([0.0] + [0.02 if i % 3 else 0.05 for i in range(59)])


@pytest.fixture(scope="session")
def vfr_store(tmp_path_factory) -> Path:
    """A store converted from one camera recorded at a variable frame rate (frames 20 or 50 ms apart)."""
    root = tmp_path_factory.mktemp("vfr")
    episode = root / "raw" / "episode_0000"
    episode.mkdir(parents=True)
    with av.open(str(episode / "cam.mp4"), "w") as container:
        stream = container.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = 128, 64, "yuv420p"
        stream.codec_context.time_base = Fraction(1, 1000)
        for index, t in enumerate(VFR_TIMES):
            frame = av.VideoFrame.from_ndarray(synthetic_frame(index, 0, 64, 128), format="rgb24")
            frame.pts, frame.time_base = round(t * 1000), Fraction(1, 1000)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    write_wav(episode / "audio.wav", np.zeros(int(VFR_TIMES[-1] * 8000), np.int16), 8000)
    options = ConvertOptions(layout="wds", workers=1, progress=False)
    convert(discover_raw_episodes(root / "raw"), root / "out", options)
    return root / "out"


@pytest.fixture
def raw_copy(raw_dataset, tmp_path) -> Path:
    """A private copy of the raw dataset that a test may damage."""
    copy = tmp_path / "raw"
    shutil.copytree(raw_dataset, copy)
    return copy


def camera_batches(store: Path, decoder, seed: int) -> list:
    """(sample_index, cam_high) of every batch a 2-worker DataLoader reads as two-frame windows with `decoder`:
    what the decoder tests compare between backends."""
    import mmdata

    spec = mmdata.Windows(anchor_fps=10, streams={"cam_high": mmdata.Frames(offsets=[-0.1, 0.0])})
    loader = mmdata.DataLoader(
        str(store), spec, batch_size=4, num_workers=2, seed=seed, runtime=mmdata.Runtime(decoder=decoder)
    )
    return [(batch["sample_index"], batch["cam_high"]) for batch in loader]


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mmdata", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def scaled(stores, tmp_path_factory) -> Path:
    """40 episodes over the session's WebDataset store, in manifest row groups of 8 rows."""
    return write_scaled_store(stores["wds"], tmp_path_factory.mktemp("scaled") / "store.wds", EPISODES, GROUP_ROWS)


@pytest.fixture
def by_row_group(monkeypatch):
    """Stores opened from now on read a manifest of more than 16 rows by row group."""
    monkeypatch.setattr(manifest_reader, "EAGER_ROWS", 16)
