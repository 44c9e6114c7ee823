"""Text from sources and stores (file names, tasks, an append's source) reaches the terminal with its control
characters written as escapes: a folder name holding an escape sequence cannot retitle or recolour the
terminal, and a line break in it cannot split the CLI's one-line error."""

from __future__ import annotations

import json
import shutil

from mmdata.tools.cli import main
from mmdata.tools.formatting import terminal_text
from tests.hostile.tampering import edit_manifest

HOSTILE = "ep\x1b]0;pwned\x07\x1b[31m\nsecond line\x9b"


def test_control_characters_are_written_as_escapes_and_other_text_is_kept():
    assert terminal_text(HOSTILE) == "ep\\x1b]0;pwned\\x07\\x1b[31m\\nsecond line\\x9b"
    assert terminal_text("Ünïcode ✓ tab\tend") == "Ünïcode ✓ tab\\tend"


def test_a_source_folder_named_with_escape_sequences_gives_a_one_line_error(raw_dataset, tmp_path, capsys):
    root = tmp_path / "raw"
    shutil.copytree(sorted(p for p in raw_dataset.iterdir() if p.is_dir())[0], root / HOSTILE)
    (root / HOSTILE / "meta.json").write_text("{not json")
    assert main(["convert", str(root), str(tmp_path / "out"), "--workers", "1", "--quiet"]) == 2
    error = capsys.readouterr().err
    errors = [line for line in error.splitlines() if line.startswith("mmdata convert: error:")]
    assert len(errors) == 1 and "\\x1b]0;pwned" in errors[0] and "second line" in errors[0]
    assert "\x1b" not in error and "\x07" not in error


def test_verify_prints_a_damaged_episodes_source_without_its_control_characters(raw_dataset, tmp_path, capsys):
    root = tmp_path / "raw"
    shutil.copytree(sorted(p for p in raw_dataset.iterdir() if p.is_dir())[0], root / HOSTILE)
    store = tmp_path / "store.wds"
    assert main(["convert", str(root), str(store), "--workers", "1", "--quiet"]) == 0
    edit_manifest(store, lambda rows: rows[0].update(duration=float("nan")))
    capsys.readouterr()
    assert main(["verify", str(store), "--quiet"]) == 1
    shown = capsys.readouterr().out
    assert "\x1b" not in shown and "\x07" not in shown and "\\x1b]0;pwned" in shown
    assert [line for line in shown.splitlines() if line.startswith("  episode")] == [
        f"  episode 0 ({terminal_text(json.loads(json.dumps(HOSTILE)))}):"
    ]
