"""Fuzzing the inputs besides stores (topic maps, features.json, spec and loader options, stats.json): each is
accepted or refused with an mmdata error, in bounded time and memory (a fixed budget in CI)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.hostile.tampering import run_limited

EXAMPLES = int(os.environ.get("MMDATA_FUZZ_EXAMPLES", "30"))
RLDS = Path(__file__).resolve().parents[1] / "fixtures" / "rlds_small" / "tfds" / "robot_small" / "1.0.0"


@pytest.mark.slow
def test_fuzzed_maps_features_options_and_statistics_are_accepted_or_refused_by_name(stores):
    code = f"""
    from pathlib import Path
    from tests.hostile.fuzz_options import run
    report(outcome_of(lambda: run(Path({str(stores["wds"])!r}), Path({str(RLDS)!r}), {EXAMPLES}, None)))
    """
    result = run_limited(code, 2 << 30, timeout=900)
    assert result["outcome"] == "ok", f"{result['outcome']}\n{result['stderr'][-4000:]}"
    assert result["increase"] < 1 << 30, f"{result['increase'] >> 20} MB over the libraries"
