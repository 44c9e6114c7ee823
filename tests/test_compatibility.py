"""Stores and loader states written before the issue-28 redesign read back and resume identically.

`tests/fixtures/pre_refactor/` was written by the tree before the change (its `make_fixture.py`
says how); nothing here regenerates it.
"""

from __future__ import annotations

import json

import pytest
import torch

import mmdata
from tests.fixtures.pre_refactor.make_fixture import HERE, LOADERS, batch_digest, episode_digest

LAYOUTS = ("wds", "zarr")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_store_written_before_the_redesign_reads_back_identically(layout):
    dataset = mmdata.open_dataset(str(HERE / f"store.{layout}"))
    expected = json.loads((HERE / f"episodes_{layout}.json").read_text())
    assert [episode_digest(dataset.read_episode(index)) for index in range(len(dataset))] == expected


@pytest.mark.parametrize("kind", sorted(LOADERS))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_loader_state_saved_before_the_redesign_resumes_to_identical_batches(layout, kind):
    loader = mmdata.DataLoader(str(HERE / f"store.{layout}"), **LOADERS[kind])
    loader.load_state_dict(torch.load(HERE / f"state_{kind}_{layout}.pt"))
    expected = json.loads((HERE / f"batches_{kind}_{layout}.json").read_text())
    assert [batch_digest(batch) for batch in loader] == expected
