"""The loader's options come in groups (Batching, Shuffling, Runtime, Reading), checked where they are
made; the ungrouped keywords of the earlier signature still give the same loader, with a warning."""

from __future__ import annotations

import inspect

import pytest

import mmdata
from mmdata.errors import OptionError
from mmdata.lerobot import LeRobotLoader
from tests.test_loader import assert_same_batches

SPEC = mmdata.Windows(anchor_fps=10, streams={"cam_high": mmdata.Frames(offsets=[-0.1, 0.0]), "state": mmdata.Values()})


def test_the_loader_signature_holds_at_most_twelve_parameters():
    assert len(inspect.signature(mmdata.DataLoader).parameters) <= 12


@pytest.mark.slow
def test_grouped_options_give_the_batches_the_ungrouped_keywords_gave(stores):
    grouped = mmdata.DataLoader(
        str(stores["wds"]),
        SPEC,
        batching=mmdata.Batching(batch_size=4),
        shuffling=mmdata.Shuffling(mode="global"),
        seed=3,
        runtime=mmdata.Runtime(num_workers=1, decoder="pyav"),
        reading=mmdata.Reading(cache_bytes=1 << 20),
    )
    with pytest.warns(DeprecationWarning, match="ungrouped form.*batching=mmdata.Batching"):
        ungrouped = mmdata.DataLoader(
            str(stores["wds"]), SPEC, batch_size=4, shuffle="global", seed=3, num_workers=1, decoder="pyav",
            cache_bytes=1 << 20,
        )  # fmt: skip
    assert_same_batches(list(grouped), list(ungrouped))
    assert grouped.state_dict() == ungrouped.state_dict()


@pytest.mark.slow
def test_a_keyword_beside_its_own_group_is_refused(stores):
    with pytest.raises(OptionError, match="give num_workers inside runtime="):
        mmdata.DataLoader(
            str(stores["wds"]), SPEC, batching=mmdata.Batching(batch_size=4), runtime=mmdata.Runtime(), num_workers=2
        )


def test_a_keyword_that_was_never_an_option_is_a_type_error(stores):
    with pytest.raises(TypeError, match="unexpected keyword argument 'batchsize'"):
        mmdata.DataLoader(str(stores["wds"]), SPEC, batchsize=4)


def test_a_loader_without_batching_names_the_fix(stores):
    with pytest.raises(OptionError, match=r"batching=mmdata.Batching\(batch_size=...\)"):
        mmdata.DataLoader(str(stores["wds"]), SPEC)


def test_a_group_of_the_wrong_type_is_refused(stores):
    with pytest.raises(OptionError, match="runtime is a mmdata.Runtime"):
        mmdata.DataLoader(str(stores["wds"]), SPEC, batching=mmdata.Batching(batch_size=4), runtime={"num_workers": 2})


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: mmdata.Batching(), "exactly one of batch_tokens"),
        (lambda: mmdata.Batching(batch_size=4, batch_tokens=100), "exactly one of batch_tokens"),
        (lambda: mmdata.Batching(batch_size=0), "batch_size"),
        (lambda: mmdata.Batching(batch_size=True), "batch_size"),
        (lambda: mmdata.Batching(batch_tokens=64, tokens_per={"cam_high": float("nan")}), r"tokens_per\['cam_high'\]"),
        (lambda: mmdata.Batching(batch_size=4, layout="ragged"), "layout is 'packed' or 'padded'"),
        (lambda: mmdata.Batching(batch_size=4, balance="speed"), "balance is 'tokens' or 'attention'"),
        (lambda: mmdata.Batching(batch_size=4, attention_mask="full"), "attention_mask is None, .causal."),
        (lambda: mmdata.Shuffling(mode="sometimes"), "shuffle is True, False or one of"),
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
def test_lerobot_loader_takes_a_runtime_in_place_of_workers_and_device(stores):
    spec = {"state": [0.0]}
    with_runtime = LeRobotLoader(str(stores["wds"]), spec, batch_size=4, runtime=mmdata.Runtime(num_workers=1))
    torch_style = LeRobotLoader(str(stores["wds"]), spec, batch_size=4, num_workers=1)
    assert_same_batches(list(with_runtime), list(torch_style))
    with pytest.raises(OptionError, match="inside runtime="):
        LeRobotLoader(str(stores["wds"]), spec, batch_size=4, num_workers=1, runtime=mmdata.Runtime())
