"""Shared fixtures: a small synthetic raw dataset and its conversions to both layouts."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.sources.raw import discover_raw_episodes
from mmdata.synthetic import SynthSpec, write_synthetic_dataset

SMALL = SynthSpec(episodes=3, min_seconds=1.5, max_seconds=3.0)
LAYOUTS = ("wds", "zarr")


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


@pytest.fixture(params=LAYOUTS)
def store(request, stores) -> Path:
    return stores[request.param]


@pytest.fixture
def raw_copy(raw_dataset, tmp_path) -> Path:
    """A private copy of the raw dataset that a test may damage."""
    copy = tmp_path / "raw"
    shutil.copytree(raw_dataset, copy)
    return copy


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mmdata", *args], capture_output=True, text=True, timeout=timeout)
