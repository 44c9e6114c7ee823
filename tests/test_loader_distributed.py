"""Two processes under torchrun: the loader finds its rank from torch.distributed and ranks see disjoint samples."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_torchrun_ranks_train_on_disjoint_samples(stores, tmp_path):
    report = tmp_path / "ranks.json"
    script = Path(__file__).with_name("distributed_train.py")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(script),
        str(stores["wds"]),
        str(report),
    ]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr[-3000:]
    result = json.loads(report.read_text())
    first, second = (set(ids) for ids in result["ranks"])
    assert result["world_size"] == 2
    assert len(first) == len(second) == 4 * 4
    assert not first & second
    assert math.isfinite(result["loss"])
