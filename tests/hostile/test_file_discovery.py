"""Every importer finds its files by the same rules (`mmdata.importers.files`): a broken link, a FIFO or a
device where a recording should be is an error naming it (or a skip with --skip-bad), never a stream
silently missing or a read that blocks for ever; and no importer reads a file linked from outside."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.errors import SourceError
from mmdata.importers import discover_episodes
from tests.conftest import run_cli
from tests.hostile.test_hostile_importers import converted, skipped_errors
from tests.mcap_logs import write_one_log
from tests.test_importers import write_aloha

RLDS = Path(__file__).resolve().parents[1] / "fixtures" / "rlds_small" / "tfds" / "robot_small" / "1.0.0"


def replace_with(path: Path, kind: str, outside: Path) -> None:
    """Put a broken link, a FIFO, a character device or a link leaving the source where `path` was."""
    content = path.read_bytes() if path.exists() else b""
    path.unlink(missing_ok=True)
    if kind == "broken-link":
        path.symlink_to(path.with_name("gone" + path.suffix))
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:
        outside.mkdir(exist_ok=True)
        (outside / path.name).write_bytes(content)
        path.symlink_to(outside / path.name)


KINDS = {
    "broken-link": "is a broken symbolic link",
    "fifo": "is a FIFO, not a regular file",
    "device": "is a character device, not a regular file",
    "link-out": "outside the source",
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_raw_camera_that_is_no_regular_file_is_named_not_dropped(raw_copy, tmp_path, kind):
    for episode in sorted(p for p in raw_copy.iterdir() if p.is_dir()):
        replace_with(episode / "cam_wrist.mp4", kind, tmp_path / "elsewhere")
    result = run_cli("convert", str(raw_copy), str(tmp_path / "out"), "--quiet", timeout=120)
    assert result.returncode == 2
    assert "cam_wrist.mp4" in result.stderr and KINDS[kind] in result.stderr


@pytest.mark.slow
def test_with_skip_bad_the_episode_with_a_broken_link_is_skipped_and_the_others_converted(raw_copy, tmp_path):
    replace_with(raw_copy / "episode_0001" / "cam_wrist.mp4", "broken-link", tmp_path)
    report = converted(raw_copy, tmp_path / "out")
    assert KINDS["broken-link"] in skipped_errors(report)["episode_0001"]
    assert report.converted == len([p for p in raw_copy.iterdir() if p.is_dir()]) - 1


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fifo", "link-out"])
def test_an_rlds_shard_that_is_a_fifo_or_links_out_is_named_without_blocking(tmp_path, kind):
    builder = tmp_path / "robot_small" / "1.0.0"
    shutil.copytree(RLDS, builder)
    replace_with(builder / "robot_small-train.tfrecord-00000-of-00002", kind, tmp_path / "elsewhere")
    if kind == "link-out":
        (tmp_path / "elsewhere" / "robot_small-train.tfrecord-00000-of-00002").write_bytes(
            (RLDS / "robot_small-train.tfrecord-00000-of-00001").read_bytes()
        )
    code = (
        "import sys; from mmdata.importers import discover_episodes\n"
        f"episodes = discover_episodes({str(builder)!r}, 'rlds', fps=10)\n"
        "print([str(e.problem) for e in episodes if e.problem])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "tfrecord-00000-of-00002" in result.stdout and KINDS[kind] in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fifo", "broken-link", "link-out"])
def test_an_mcap_log_that_is_no_regular_file_is_named(tmp_path, kind):
    logs = tmp_path / "logs"
    logs.mkdir()
    write_one_log(logs / "a.mcap")
    shutil.copy(logs / "a.mcap", logs / "b.mcap")
    replace_with(logs / "b.mcap", kind, tmp_path / "elsewhere")
    episodes = discover_episodes(str(logs), "mcap")
    problems = {e.name: str(e.problem) for e in episodes if e.problem is not None}
    assert list(problems) == ["b.mcap"] and KINDS[kind] in problems["b.mcap"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fifo", "broken-link"])
def test_an_hdf5_episode_that_is_no_regular_file_is_named(tmp_path, kind):
    source = tmp_path / "aloha"
    write_aloha(source)
    replace_with(source / "episode_1.hdf5", kind, tmp_path / "elsewhere")
    with pytest.raises(SourceError, match=f"episode_1.hdf5.*{KINDS[kind]}"):
        convert(discover_episodes(str(source), "hdf5", fps=50), tmp_path / "out", ConvertOptions(progress=False))
