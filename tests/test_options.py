"""Every public option is checked where it is given (type, finiteness, range), with its name in the message,
and sizes that imply an allocation are bounded before it happens."""

from __future__ import annotations

import pytest

import mmdata
from mmdata.errors import OptionError

STATE = mmdata.Windows(anchor_fps=1, streams={"state": mmdata.Values()})


@pytest.mark.parametrize(
    ("size", "complaint"),
    [
        ((float("inf"), 224), "is inf, not an integer"),
        ((float("nan"), 224), "is nan, not an integer"),
        (("224", "224"), "is '224', not an integer"),
        (224, "is two values, not 224"),
        ((224,), "is two values"),
        ((64, 64, 3), "is two values"),
        ((224.9, 224), "is 224.9, not an integer"),
        ((True, True), "is True, not an integer"),
        ((0, 224), "is 0, outside"),
    ],
    ids=["inf", "nan", "text", "one-number", "one-side", "three-sides", "fraction", "bools", "zero"],
)
def test_resize_sizes_that_are_not_two_sides_in_range_are_refused(size, complaint):
    with pytest.raises(mmdata.SpecError, match=f"resize size \\(height, width\\).*{complaint}"):
        mmdata.Resize(size)


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ({"ratio": (1, float("inf"))}, "crop ratio is inf, not a finite number"),
        ({"ratio": (2, 1)}, "crop ratio is a positive range"),
        ({"scale": "small"}, "crop scale is two values"),
        ({"scale": (0.5, float("nan"))}, "crop scale is nan"),
    ],
)
def test_random_crop_ranges_are_checked_when_the_resize_is_made(options, complaint):
    with pytest.raises(mmdata.SpecError, match=complaint):
        mmdata.Resize((64, 64), crop="random", **options)


@pytest.mark.parametrize(
    ("weight", "complaint"),
    [("0.5", "is '0.5', not a number"), (1j, "not a number"), (1e308, "outside"), (float("nan"), "nan"), (-1, "-1")],
    ids=["text", "complex", "huge", "nan", "negative"],
)
def test_source_weights_are_finite_numbers_in_range(stores, weight, complaint):
    with pytest.raises(mmdata.SpecError, match=f"Source weight .*{complaint}"):
        mmdata.Source(str(stores["wds"]), weight=weight)


@pytest.mark.parametrize(
    "epoch_samples", [10**15, float("nan"), "many", 2.5, True, 0], ids=["huge", "nan", "text", "fraction", "bool", "0"]
)
def test_epoch_samples_is_a_bounded_whole_number(stores, epoch_samples):
    with pytest.raises(mmdata.SpecError, match="epoch_samples is"):
        mmdata.Mixture([mmdata.Source(str(stores["wds"]))], epoch_samples=epoch_samples)


def test_large_weights_within_range_keep_their_shares(stores):
    spec = mmdata.Windows(anchor_fps=2, streams={"state": mmdata.Values()})
    big = mmdata.Mixture([mmdata.Source(str(stores["wds"]), weight=1e12, name="a"),
                          mmdata.Source(str(stores["zarr"]), weight=1e12, name="b")])  # fmt: skip
    plain = mmdata.Mixture([mmdata.Source(str(stores["wds"]), weight=1, name="a"),
                            mmdata.Source(str(stores["zarr"]), weight=1, name="b")])  # fmt: skip
    targets = [mmdata.DataLoader(m, spec, batch_size=1, num_workers=0).source_targets.tolist() for m in (big, plain)]
    assert targets[0] == targets[1] and sum(targets[0]) > 2, "weights near the top of the range keep equal shares"


@pytest.mark.parametrize(
    "options",
    [
        {"timeout_s": float("nan")},
        {"timeout_s": float("inf")},
        {"attempts": 2.5},
        {"concurrency": 0},
        {"coalesce_gap": -1},
        {"coalesce_gap": 1.5},
        {"cache_max_bytes": -1},
        {"guard_local_reads": "yes"},
        {"cache_dir": 3},
    ],
)
def test_read_policies_are_checked_when_made(options):
    with pytest.raises(OptionError, match=f"ReadPolicy {next(iter(options))}"):
        mmdata.ReadPolicy(**options)


@pytest.mark.parametrize(
    ("make", "complaint"),
    [
        (lambda: mmdata.Reading(frame_cache_bytes=None), "frame_cache_bytes is None, not an integer"),
        (lambda: mmdata.Reading(cache_bytes=None), "cache_bytes is None, not an integer"),
        (lambda: mmdata.Shuffling(window=None), "shuffle_window is None, not an integer"),
        (lambda: mmdata.Shuffling(open_segments=None), "open_segments is None, not an integer"),
        (lambda: mmdata.DataLoader("store", STATE, num_workers=None), "num_workers is None, not an"),
        (
            lambda: mmdata.DataLoader("store", STATE, prefetch_factor=None, num_workers=0),
            "prefetch_factor is None, not",
        ),
    ],
    ids=["frame-cache", "cache", "window", "open-segments", "workers", "prefetch"],
)
def test_counts_that_have_no_none_default_refuse_none_where_given(make, complaint):
    with pytest.raises(OptionError, match=complaint):
        make()


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ({"cache_bytes": None}, "cache_bytes is None, not an integer"),
        ({"cache_bytes": -1}, "cache_bytes is -1, outside"),
        ({"verify": None}, "verify is True or False, not None"),
        ({"read_policy": "fast"}, "read_policy is a ReadPolicy, not 'fast'"),
    ],
)
def test_store_options_are_checked_when_a_store_is_opened(stores, options, complaint):
    with pytest.raises(OptionError, match=complaint):
        mmdata.open_store(str(stores["wds"]), **options)
    with pytest.raises(OptionError, match=complaint):
        mmdata.open_dataset(str(stores["wds"]), **options)
