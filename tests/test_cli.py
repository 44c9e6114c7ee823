"""The `mmdata` command line, run as a user runs it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from tests.conftest import run_cli


@pytest.mark.slow
def test_synth_convert_verify_inspect_chain_succeeds_for_both_layouts(tmp_path):
    raw = tmp_path / "raw"
    assert run_cli("synth", str(raw), "--episodes", "3", "--min-seconds", "1", "--max-seconds", "2").returncode == 0
    for layout in ("wds", "zarr"):
        out = tmp_path / f"out.{layout}"
        converted = run_cli("convert", str(raw), str(out), "--to", layout, "--quiet")
        assert converted.returncode == 0, converted.stderr
        assert "converted 3 episodes" in converted.stdout
        verified = run_cli("verify", str(out), "--quiet")
        assert verified.returncode == 0 and verified.stdout.startswith("OK"), verified.stdout
        inspected = run_cli("inspect", str(out), "--json")
        summary = json.loads(inspected.stdout)
        assert summary["episodes"] == 3 and summary["layout"] == layout
        assert {s["name"] for s in summary["streams"]} == {"task", "cam_high", "cam_wrist", "audio", "state", "action"}


@pytest.mark.slow
def test_synth_writes_parquet_lowdim_that_converts_with_explicit_timestamps(tmp_path):
    raw = tmp_path / "raw"
    run_cli(
        "synth", str(raw), "--episodes", "2", "--min-seconds", "1", "--max-seconds", "1.5", "--lowdim-format", "parquet"
    )
    assert (raw / "episode_0000" / "lowdim.parquet").exists()
    assert run_cli("convert", str(raw), str(tmp_path / "out"), "--quiet").returncode == 0
    summary = json.loads(run_cli("inspect", str(tmp_path / "out"), "--json").stdout)
    state = next(s for s in summary["streams"] if s["name"] == "state")
    assert state["shape"] == [14] and state["rate"] is None


@pytest.mark.slow
def test_verify_exits_non_zero_and_names_the_bad_episode(stores, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(stores["zarr"], copy)
    chunk = next((copy / "video" / "cam_high" / "c").iterdir())
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    result = run_cli("verify", str(copy), "--quiet")
    assert result.returncode == 1
    assert result.stdout.startswith("FAILED") and "1 of 3 episodes bad" in result.stdout
    damage = r".*(checksum mismatch|does not decode|does not decompress)"
    assert re.search(r"episode \d \(episode_000\d\):\n    cam_high segment \d+: " + damage, result.stdout)


@pytest.mark.slow
def test_errors_print_one_line_and_exit_2(tmp_path):
    result = run_cli("convert", str(tmp_path / "missing"), str(tmp_path / "out"))
    assert result.returncode == 2
    assert "mmdata convert: error:" in result.stderr and "the source does not exist" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = run_cli("verify", str(tmp_path))
    assert result.returncode == 2 and "no dataset.json" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("command", ["synth", "convert", "inspect", "verify", "demo", "bench"])
def test_every_command_explains_itself_in_help(command):
    result = run_cli(command, "--help")
    assert result.returncode == 0 and "usage: mmdata" in result.stdout


@pytest.mark.slow
def test_demo_runs_end_to_end_and_reports_all_checks_passed(tmp_path):
    result = run_cli("demo", "--output", str(tmp_path / "demo"), "--episodes", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "verify: OK" in result.stdout and "all checks passed" in result.stdout
    assert (tmp_path / "demo" / "demo.wds" / "dataset.json").exists()


def test_a_spawned_conversion_worker_loads_neither_the_command_line_nor_numba():
    # A spawned worker imports the running script (the console script, whose entry point is mmdata.tools.entry)
    # and what its jobs need: the episode encoding and the importer. Loading the CLI or numba there costs
    # each worker ~0.6 s before its first episode.
    scripts = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["mmdata"] == "mmdata.tools.entry:main"
    code = (
        "import sys\n"
        "import mmdata.tools.entry, mmdata.conversion.encode, mmdata.importers.lerobot_folders\n"
        "heavy = ('mmdata.tools.cli', 'mmdata.conversion.pipeline', 'mmdata.store.statistics', 'numba', 'torch')\n"
        "print([name for name in heavy if name in sys.modules])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"
