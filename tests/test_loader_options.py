"""The loader speaks one dialect: the options `torch.utils.data.DataLoader` has, spelled as PyTorch spells them as
plain keywords, and the rest in groups (Batching, Shuffling, Runtime, Reading), each checked where it is given. The
earlier spellings (PyTorch's words inside a group, the other options as plain keywords) give the same loader and
warn with the one spelling; an option said twice is refused."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

import mmdata
from mmdata.errors import OptionError
from mmdata.lerobot import LeRobotLoader
from mmdata.loading.loader_options import TORCH_DEFAULTS
from tests.test_loader import assert_same_batches

SPEC = mmdata.Windows(anchor_fps=10, streams={"cam_high": mmdata.Frames(offsets=[-0.1, 0.0]), "state": mmdata.Values()})
LOWDIM = mmdata.Windows(anchor_fps=10, streams={"state": mmdata.Values(offsets=[0.0])})


def test_pytorchs_words_are_the_loaders_keywords_with_pytorchs_names_and_no_warning(stores):
    ours = inspect.signature(mmdata.DataLoader).parameters
    theirs = inspect.signature(torch.utils.data.DataLoader).parameters
    for word in ("batch_size", "shuffle", "num_workers", "prefetch_factor", "drop_last", "pin_memory", "timeout"):
        assert word in ours and word in theirs
    assert ours["drop_last"].default == theirs["drop_last"].default and ours["num_workers"].default == "auto"
    assert {word: ours[word].default for word in TORCH_DEFAULTS} == TORCH_DEFAULTS  # (what counts as not given)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = mmdata.DataLoader(str(stores["wds"]), LOWDIM, batch_size=4, shuffle=False, num_workers=0)
    assert loader.shuffle == "none" and len(next(iter(loader))["state"]) == 4


@pytest.mark.slow
def test_the_earlier_spellings_give_the_same_batches_and_state_and_warn_with_the_one_spelling(stores):
    one = mmdata.DataLoader(
        str(stores["wds"]),
        SPEC,
        batch_size=4,
        shuffle="global",
        num_workers=1,
        seed=3,
        runtime=mmdata.Runtime(decoder="pyav"),
        reading=mmdata.Reading(cache_bytes=1 << 20),
    )
    with pytest.warns(DeprecationWarning, match=r"ungrouped form.*runtime=mmdata.Runtime"):
        ungrouped = mmdata.DataLoader(
            str(stores["wds"]), SPEC, batch_size=4, shuffle="global", num_workers=1, seed=3, decoder="pyav",
            reading=mmdata.Reading(cache_bytes=1 << 20),
        )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grouped = mmdata.DataLoader(
            str(stores["wds"]), SPEC, batching=mmdata.Batching(batch_size=4),
            shuffling=mmdata.Shuffling(mode="global"), runtime=mmdata.Runtime(num_workers=1, decoder="pyav"),
            reading=mmdata.Reading(cache_bytes=1 << 20), seed=3,
        )  # fmt: skip
    said = " | ".join(str(warning.message) for warning in caught)
    for spelled in ("Batching(batch_size=...) is spelled DataLoader(batch_size=...)", "pass shuffle='global'",
                    "Runtime(num_workers=...) is spelled DataLoader(num_workers=...)"):  # fmt: skip
        assert spelled in said
    batches = list(one)
    assert_same_batches(batches, list(ungrouped))
    assert_same_batches(batches, list(grouped))
    assert one.state_dict() == ungrouped.state_dict() == grouped.state_dict()


def test_an_option_said_twice_or_beside_its_own_group_is_refused(stores):
    with pytest.raises(OptionError, match="batch_size is given twice"):
        mmdata.DataLoader(str(stores["wds"]), SPEC, batch_size=4, batching=mmdata.Batching(batch_size=8), num_workers=0)
    with pytest.raises(OptionError, match="num_workers is given twice"):
        mmdata.DataLoader(str(stores["wds"]), SPEC, batch_size=4, num_workers=1, runtime=mmdata.Runtime(num_workers=2))
    with pytest.raises(OptionError, match="give decoder inside runtime="):
        mmdata.DataLoader(
            str(stores["wds"]), SPEC, batch_size=4, decoder="pyav", runtime=mmdata.Runtime(), num_workers=0
        )
    with pytest.raises(OptionError, match="exactly one of batch_size= .* or Batching\\(batch_tokens"):
        mmdata.DataLoader(
            str(stores["wds"]), SPEC, batch_size=4, batching=mmdata.Batching(batch_tokens=64), num_workers=0
        )


def test_a_keyword_that_was_never_an_option_is_a_type_error(stores):
    with pytest.raises(TypeError, match="unexpected keyword argument 'batchsize'"):
        mmdata.DataLoader(str(stores["wds"]), SPEC, batchsize=4, num_workers=0)


def test_a_loader_without_a_batch_names_both_ways_to_give_one(stores):
    with pytest.raises(OptionError, match=r"batch_size=\.\.\. .* batching=mmdata.Batching\(batch_tokens=\.\.\.\)"):
        mmdata.DataLoader(str(stores["wds"]), SPEC, num_workers=0)


def test_a_group_of_the_wrong_type_is_refused(stores):
    with pytest.raises(OptionError, match="runtime is a mmdata.Runtime"):
        mmdata.DataLoader(str(stores["wds"]), SPEC, batch_size=4, runtime={"num_workers": 2}, num_workers=0)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": True}, "batch_size"),
        ({"shuffle": "sometimes"}, "shuffle is True, False or one of"),
        ({"num_workers": -1}, "num_workers"),
        ({"prefetch_factor": 2.5}, "prefetch_factor"),
        ({"drop_last": "yes"}, "drop_last"),
        ({"pin_memory": 1}, "pin_memory"),
        ({"persistent_workers": None}, "persistent_workers"),
        ({"timeout": -1}, "timeout is 0"),
        ({"timeout": float("nan")}, "timeout is 0"),
        ({"timeout": "5"}, "timeout is a number of seconds"),
    ],
)
def test_each_of_pytorchs_words_is_checked_where_it_is_given(stores, given, message):
    with pytest.raises(OptionError, match=message):
        mmdata.DataLoader(str(stores["wds"]), LOWDIM, **{"batch_size": 4, **given})


def test_drop_last_leaves_out_the_epochs_shorter_last_step(stores):
    kept = mmdata.DataLoader(str(stores["wds"]), LOWDIM, batch_size=5, shuffle=False, num_workers=0)
    dropped = mmdata.DataLoader(str(stores["wds"]), LOWDIM, batch_size=5, shuffle=False, drop_last=True, num_workers=0)
    samples = len(kept.samples)
    assert samples % 5, "the store's sample count leaves a shorter last batch"
    assert [len(b["state"]) for b in kept][-1] == samples % 5 and len(kept) == -(-samples // 5)
    assert all(len(b["state"]) == 5 for b in dropped) and len(dropped) == samples // 5


@pytest.mark.slow
def test_workers_that_do_not_persist_give_the_same_batches_and_timeout_bounds_the_wait(stores):
    persistent = mmdata.DataLoader(str(stores["wds"]), LOWDIM, batch_size=8, num_workers=1)
    fresh = mmdata.DataLoader(str(stores["wds"]), LOWDIM, batch_size=8, num_workers=1, persistent_workers=False)
    for epoch in range(2):
        assert_same_batches(list(persistent), list(fresh))
        assert fresh._feed is None, f"epoch {epoch}: the workers stopped at the epoch's end"
    bounded = mmdata.DataLoader(str(stores["wds"]), SPEC, batch_size=8, num_workers=1, timeout=1e-6)
    with pytest.raises(TimeoutError, match=r"within timeout=1e-06 s"):
        list(bounded)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: mmdata.Batching(batch_size=4, batch_tokens=100), "exactly one of batch_tokens"),
        (lambda: mmdata.Batching(batch_size=0), "batch_size"),
        (lambda: mmdata.Batching(batch_size=True), "batch_size"),
        (lambda: mmdata.Batching(batch_tokens=64, tokens_per={"cam_high": float("nan")}), r"tokens_per\['cam_high'\]"),
        (lambda: mmdata.Batching(batch_size=4, layout="ragged"), "layout is 'packed' or 'padded'"),
        (lambda: mmdata.Batching(batch_size=4, balance="speed"), "balance is 'tokens' or 'attention'"),
        (lambda: mmdata.Batching(batch_size=4, attention_mask="full"), "attention_mask is None, .causal."),
        (lambda: mmdata.Shuffling(mode="sometimes"), "shuffle is True, False or one of"),
        (lambda: mmdata.Shuffling(mode="segments"), "'segments' order is now 'blocks'"),
        (lambda: mmdata.Shuffling(window=0), "shuffle_window"),
        (lambda: mmdata.Runtime(num_workers=-1), "num_workers"),
        (lambda: mmdata.Runtime(prefetch_factor=2.5), "prefetch_factor"),
        (lambda: mmdata.Runtime(decoder="ffmpeg"), "unknown decoder 'ffmpeg'"),
        (lambda: mmdata.Runtime(decode_in="gpu"), "decode_in is 'workers' or 'main'"),
        (lambda: mmdata.Runtime(device="tpu:x"), "is not a torch device"),
        (lambda: mmdata.Reading(verify="yes"), "verify is True or False"),
        (lambda: mmdata.Reading(cache_bytes=-1), "cache_bytes"),
        (lambda: mmdata.Reading(policy={"timeout_s": 1}), "policy is a ReadPolicy"),
    ],
)
def test_each_option_group_checks_its_values_where_it_is_made(make, message):
    with pytest.raises(OptionError, match=message):
        make()


@pytest.mark.slow
def test_lerobot_loader_takes_a_runtime_in_place_of_its_device(stores):
    spec = {"state": [0.0]}
    with_runtime = LeRobotLoader(str(stores["wds"]), spec, batch_size=4, num_workers=1, runtime=mmdata.Runtime())
    torch_style = LeRobotLoader(str(stores["wds"]), spec, batch_size=4, num_workers=1, device="cpu")
    assert_same_batches(list(with_runtime), list(torch_style))
    with pytest.raises(OptionError, match="inside runtime="):
        LeRobotLoader(str(stores["wds"]), spec, batch_size=4, device="cpu", runtime=mmdata.Runtime(), num_workers=0)
