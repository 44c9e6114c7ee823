"""Stores written before the issue-28 redesign read back identically; loader states saved then (by planners that
are retired) are refused by name, saying how to go on, and going on from the next epoch works.

`tests/fixtures/pre_refactor/` was written by the tree before the change (its `make_fixture.py`
says how); nothing here regenerates it.
"""

from __future__ import annotations

import json

import pytest
import torch

import mmdata
from mmdata.errors import ResumeError
from tests.fixtures.pre_refactor.make_fixture import HERE, LOADERS, episode_digest

LAYOUTS = ("wds", "zarr")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_store_written_before_the_redesign_reads_back_identically(layout):
    dataset = mmdata.open_dataset(str(HERE / f"store.{layout}"))
    expected = json.loads((HERE / f"episodes_{layout}.json").read_text())
    assert [episode_digest(dataset.read_episode(index)) for index in range(len(dataset))] == expected


@pytest.mark.parametrize("kind", sorted(LOADERS))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_loader_state_saved_before_the_one_planner_is_refused_by_name_and_the_next_epoch_goes_on(layout, kind):
    options = dict(LOADERS[kind])
    if "batch_tokens" in options:  # (the fixture's options in the form of then)
        tokens = {"batch_tokens": options.pop("batch_tokens"), "tokens_per": options.pop("tokens_per")}
        options["batching"] = mmdata.Batching(**tokens)
    loader = mmdata.DataLoader(str(HERE / f"store.{layout}"), **options)
    state = torch.load(HERE / f"state_{kind}_{layout}.pt")
    with pytest.raises(ResumeError, match=rf"no longer makes.*loader.set_epoch\({state['epoch'] + 1}\)"):
        loader.load_state_dict(state)
    loader.set_epoch(state["epoch"] + 1)
    assert sum(len(batch["sample_index"]) for batch in loader) > 0


def test_a_loader_state_saved_while_blocks_were_dealt_across_lanes_is_refused_by_name():
    loader = mmdata.DataLoader(str(HERE / "store.wds"), LOADERS["windows"]["spec"], batch_size=4, num_workers=0)
    next(iter(loader))
    state = loader.state_dict() | {"version": 2}
    with pytest.raises(ResumeError, match=r"dealt blocks across lanes.*loader.set_epoch\(1\)"):
        loader.load_state_dict(state)
