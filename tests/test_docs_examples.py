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
