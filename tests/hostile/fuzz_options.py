"""Fuzz what users and other tools hand mmdata besides stores: MCAP topic maps (as data and as YAML text),
RLDS `features.json` files, the options of `Resize`, `Source`, `Mixture` and `LeRobotLoader`, and `stats.json`
files. Each must be accepted or refused with an mmdata error; any other exception fails the run (hypothesis
prints the smallest input that does).

Run in a subprocess by `test_fuzz_options.py` under an address-space cap and a timeout, so that a memory
bomb or a hang fails it too: `python -m tests.hostile.fuzz_options STORE RLDS_BUILDER --examples N`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

import mmdata
from mmdata.importers.rlds import step_features
from mmdata.importers.topic_map import load_topic_map, topic_map_from_dict
from mmdata.lerobot import LeRobotLoader
from tests.hostile.fuzz_store import fuzzing

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["/cam", "/joint_states", "position", "header", "log", "random", "stretch", "jpeg", "7", "-1"]),
)
# keys the documents under test use, so that generated mappings reach past their first checks
KEYS = [
    "cameras", "lowdim", "task", "time", "resample", "split", "topic", "field", "fields", "fps", "gap",
    "featuresDict", "features", "pythonClassName", "tensor", "shape", "dimensions", "dtype", "image",
    "mean", "std", "min", "max", "q01", "q99", "lerobot", "version", "state", "observation.state",
]  # fmt: skip
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=8), st.sampled_from(KEYS)), inner, max_size=4),
    ),
    max_leaves=12,
)
NAMED_ERRORS = (mmdata.MmdataError,)


def _refused_or_accepted(call) -> None:
    with contextlib.suppress(*NAMED_ERRORS):
        call()


def _set_at(document, path: list[float], value) -> None:
    """Replace the value at a place `path` picks (numbers in [0, 1) choosing a key at each level)."""
    node = document
    for choice in path:
        if isinstance(node, dict) and node:
            key = sorted(node, key=str)[int(choice * len(node))]
            if not isinstance(node[key], (dict, list)) or choice > 0.7:
                node[key] = value
                return
            node = node[key]
        elif isinstance(node, list) and node:
            index = int(choice * len(node))
            if not isinstance(node[index], (dict, list)) or choice > 0.7:
                node[index] = value
                return
            node = node[index]
        else:
            return


def _edited_copy(folder: Path, copy: Path, name: str, document, path: list[float], value) -> Path:
    """A fresh copy of `folder` whose JSON file `name` is `document` with `value` at the place `path` picks."""
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(folder, copy)
    edited = json.loads(json.dumps(document))
    _set_at(edited, path, value)
    (copy / name).write_text(json.dumps(edited))
    return copy


def run(store: Path, builder: Path, examples: int, random_seed: int | None) -> None:
    work = Path(tempfile.mkdtemp(prefix="mmdata-fuzz-options-"))
    features = json.loads((builder / "features.json").read_text())
    stats = json.loads((store / "stats.json").read_text())
    fuzz = fuzzing(examples, random_seed)

    @fuzz
    @given(document=VALUES, text=st.text(max_size=200))
    def topic_maps(document, text):
        _refused_or_accepted(lambda: topic_map_from_dict(document))
        path = work / "map.yaml"
        path.write_text(text)
        _refused_or_accepted(lambda: load_topic_map(path))
        path.write_text(json.dumps(document) if not isinstance(document, float) else "1")
        _refused_or_accepted(lambda: load_topic_map(path))

    @fuzz
    @given(path=st.lists(st.floats(0, 1, exclude_max=True), min_size=1, max_size=10), value=VALUES)
    def features_json(path, value):
        copy = _edited_copy(builder, work / "builder", "features.json", features, path, value)
        _refused_or_accepted(lambda: step_features(copy))

    @fuzz
    @given(size=VALUES, mode=VALUES, scale=VALUES, ratio=VALUES, weight=VALUES, epoch=VALUES, streams=VALUES)
    def spec_options(size, mode, scale, ratio, weight, epoch, streams):
        _refused_or_accepted(lambda: mmdata.Resize(size))
        _refused_or_accepted(lambda: mmdata.Resize((64, 64), mode=mode))
        _refused_or_accepted(lambda: mmdata.Resize((64, 64), crop="random", scale=scale, ratio=ratio))
        _refused_or_accepted(lambda: mmdata.Source(str(store), weight=weight, streams=streams))
        _refused_or_accepted(lambda: mmdata.Mixture([mmdata.Source(str(store))], epoch_samples=epoch))
        _refused_or_accepted(lambda: mmdata.Frames(offsets=size))

    @fuzz
    @given(deltas=VALUES, images=VALUES, episodes=VALUES)
    def lerobot_options(deltas, images, episodes):
        _refused_or_accepted(lambda: LeRobotLoader(str(store), deltas, batch_size=2, num_workers=0))
        _refused_or_accepted(lambda: LeRobotLoader(str(store), batch_size=2, images=images, num_workers=0))
        _refused_or_accepted(lambda: LeRobotLoader(str(store), batch_size=2, episodes=episodes, num_workers=0))

    @fuzz
    @given(path=st.lists(st.floats(0, 1, exclude_max=True), min_size=1, max_size=6), value=VALUES)
    def stats_json(path, value):
        copy = _edited_copy(store, work / "store", "stats.json", stats, path, value)
        for mode in ("mean_std", "min_max", "quantile"):
            spec = mmdata.Windows(anchor_fps=2, streams={"state": mmdata.Values(normalize=mode)})
            _refused_or_accepted(
                lambda spec=spec: next(iter(mmdata.DataLoader(str(copy), spec, batch_size=2, num_workers=0)))
            )
        _refused_or_accepted(lambda: LeRobotLoader(str(copy), batch_size=2, num_workers=0).dataset_stats)

    try:
        for fuzzer in (topic_maps, features_json, spec_options, lerobot_options, stats_json):
            fuzzer()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("store", type=Path, help="a small store with stats.json")
    parser.add_argument("builder", type=Path, help="an RLDS builder folder (features.json)")
    parser.add_argument("--examples", type=int, default=40)
    parser.add_argument("--seed", type=int, help="explore other examples than CI's fixed sequence")
    args = parser.parse_args()
    run(args.store, args.builder, args.examples, args.seed)
    print("fuzzed", args.examples, "examples of each kind without an unexpected exception", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
