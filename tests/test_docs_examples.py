"""The Python examples of the README and docs/loading.md run as written, against the test stores."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ("README.md", "docs/loading.md")


def examples() -> list[tuple[str, int, str]]:
    found = []
    for document in DOCUMENTS:
        text = (ROOT / document).read_text()
        for number, match in enumerate(re.finditer(r"```python\n(.*?)```", text, re.S)):
            found.append((document, number, match.group(1)))
    return found


def test_the_documents_hold_python_examples():
    assert {document for document, _, _ in examples()} == set(DOCUMENTS)


@pytest.mark.slow
@pytest.mark.parametrize(("document", "number", "code"), examples(), ids=lambda v: str(v)[:20])
def test_a_documented_example_runs_as_written(stores, document, number, code):
    code = code.replace("/tmp/out.wds", str(stores["wds"])).replace("/tmp/out.zarr", str(stores["zarr"]))
    exec(compile(code, f"{document} example {number}", "exec"), {"__name__": "docs_example"})


# a repository path as the documents write it, from a top-level folder of the repository on; one written as a
# template (`gpu_spdl_<device>/`, `*.json`) is left out
_REPOSITORY_PATH = re.compile(r"(?<![\w/.~-])((?:mmdata|benchmarks|tests|docs|\.ci)/[\w./-]*+)([<{*]?)")


def paths_in(text: str) -> set[str]:
    return {path.rstrip("./-") for path, template in _REPOSITORY_PATH.findall(text) if not template}


def named_paths() -> dict[str, set[str]]:
    documents = [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("benchmarks/**/README.md")]
    return {str(document.relative_to(ROOT)): paths_in(document.read_text()) for document in documents}


def test_every_repository_path_a_document_names_exists():
    missing = {
        document: sorted(path for path in paths if not (ROOT / path).exists())
        for document, paths in named_paths().items()
    }
    assert {document: paths for document, paths in missing.items() if paths} == {}


def test_the_path_finder_finds_paths_and_leaves_templates_out():
    text = "see `mmdata/loading/feed.py`, benchmarks/results/gpu_spdl_<device>/ and (tests/conftest.py)."
    assert paths_in(text) == {"mmdata/loading/feed.py", "tests/conftest.py"}
