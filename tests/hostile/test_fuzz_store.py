"""Fuzzing a store's metadata and one shard: opening, verifying and loading it either works or
raises an mmdata error, never another exception, a crash or a hang (a fixed budget in CI)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.importers.raw import discover_raw_episodes
from mmdata.synthetic import SynthSpec, write_synthetic_dataset

EXAMPLES = int(os.environ.get("MMDATA_FUZZ_EXAMPLES", "30"))


@pytest.fixture(scope="module")
def tiny_raw(tmp_path_factory) -> Path:
    raw = tmp_path_factory.mktemp("fuzz-raw")
    write_synthetic_dataset(raw, SynthSpec(episodes=2, min_seconds=1.0, max_seconds=1.3))
    return raw


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["wds", "zarr"])
def test_mutated_stores_open_verify_and_load_or_raise_mmdata_errors(tiny_raw, tmp_path, layout):
    store = tmp_path / f"tiny.{layout}"
    convert(discover_raw_episodes(tiny_raw), store, ConvertOptions(layout=layout, workers=1, progress=False))
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-m", "tests.hostile.fuzz_store", str(store), "--examples", str(EXAMPLES)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=root,
    )
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}"
