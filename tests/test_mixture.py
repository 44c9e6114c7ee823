"""Mixtures of stores: weights and epoch size, stream maps, padding of missing streams, resume."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import mmdata
from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.importers.raw import discover_raw_episodes
from mmdata.store.statistics import compute_stats, write_stats
from mmdata.synthetic import CameraSpec, SynthSpec, write_synthetic_dataset

WEIGHTS = {"arm": 0.5, "top": 0.3, "wide": 0.2}
EPOCH = 3000
# A value-only window: cheap to read, so whole epochs of 3,000 samples run in the tests.
LOWDIM = mmdata.Windows(
    anchor_fps=60,
    streams={"state": mmdata.Values(offsets=[0.0], pad_to=14), "action": mmdata.Values(offsets=[0.0, 0.02], pad_to=14)},
)


def _store(root: Path, name: str, layout: str, spec: SynthSpec) -> Path:
    write_synthetic_dataset(root / f"{name}-raw", spec)
    destination = root / f"{name}.{layout}"
    convert(discover_raw_episodes(root / f"{name}-raw"), destination, ConvertOptions(layout=layout, progress=False))
    write_stats(mmdata.open_dataset(destination), compute_stats(mmdata.open_dataset(destination), camera_frames=0))
    return destination


@pytest.fixture(scope="module")
def three_stores(tmp_path_factory) -> dict[str, Path]:
    """Three stores unlike each other: WebDataset with two 224x224 / 208x160 cameras at 30 fps and
    14-dim state; Zarr with one 160x120 camera named 'top' at 15 fps and 7-dim state; WebDataset
    with one 96x64 camera named 'wide' at 20 fps."""
    root = tmp_path_factory.mktemp("mixture")
    return {
        "arm": _store(root, "arm", "wds", SynthSpec(episodes=2, min_seconds=2.0, max_seconds=3.0)),
        "top": _store(
            root,
            "top",
            "zarr",
            SynthSpec(
                episodes=2,
                min_seconds=2.0,
                max_seconds=3.0,
                fps=15,
                dof=7,
                seed=1,
                cameras=(CameraSpec("top", 160, 120),),
            ),
        ),
        "wide": _store(
            root,
            "wide",
            "wds",
            SynthSpec(
                episodes=3, min_seconds=1.0, max_seconds=2.0, fps=20, seed=2, cameras=(CameraSpec("wide", 96, 64),)
            ),
        ),
    }


def _mixture(stores: dict[str, Path], **options) -> mmdata.Mixture:
    return mmdata.Mixture(
        [
            mmdata.Source(str(stores["arm"]), WEIGHTS["arm"], name="arm"),
            mmdata.Source(str(stores["top"]), WEIGHTS["top"], {"top": "cam_high"}, name="top"),
            mmdata.Source(str(stores["wide"]), WEIGHTS["wide"], {"wide": "cam_high"}, name="wide"),
        ],
        **options,
    )


def _epoch(loaders) -> list[dict]:
    return [batch for loader in loaders for batch in loader]


@pytest.mark.slow
@pytest.mark.parametrize(("world_size", "workers"), [(1, 0), (2, 2), (3, 0), (3, 2)])
def test_mixture_delivers_each_source_its_weight_over_an_epoch(three_stores, world_size, workers):
    loaders = [
        mmdata.DataLoader(
            _mixture(three_stores, epoch_samples=EPOCH),
            LOWDIM,
            batch_size=50,
            num_workers=workers,
            runtime=mmdata.Runtime(rank=rank, world_size=world_size),
        )
        for rank in range(world_size)
    ]
    assert len({len(loader) for loader in loaders}) == 1, "every rank takes the same number of steps"
    sources = np.concatenate([batch["source"].numpy() for batch in _epoch(loaders)])
    assert len(sources) >= EPOCH * 0.98
    shares = np.bincount(sources, minlength=3) / len(sources)
    assert np.allclose(shares, list(WEIGHTS.values()), atol=0.01), shares


def test_weights_by_tokens_give_each_source_its_share_of_tokens(three_stores):
    # whole episodes: 'wide' has shorter ones, so it must give more samples for its share of tokens
    spec = mmdata.Sequences(fps=30, streams={"state": mmdata.Values(pad_to=14)})
    loader = mmdata.DataLoader(
        _mixture(three_stores, epoch_samples=EPOCH, weight_by="tokens"),
        spec,
        batching=mmdata.Batching(batch_tokens=4096),
        num_workers=0,
    )
    plan = loader.epoch_plan()
    slots = np.concatenate([plan.plan.micro_batch(step, 0) for step in range(len(plan.plan))])
    refs = loader.planner.refs(plan, slots)
    owners, costs = np.array([ref.source for ref in refs]), np.array([ref.cost for ref in refs], np.float64)
    token_shares = np.bincount(owners, weights=costs) / costs.sum()
    assert np.allclose(token_shares, list(WEIGHTS.values()), atol=0.01), token_shares
    sample_shares = np.bincount(owners) / len(owners)
    assert not np.allclose(sample_shares, list(WEIGHTS.values()), atol=0.01)


def test_mixture_without_weights_reads_every_sample_once(three_stores):
    mixture = mmdata.Mixture(
        [
            mmdata.Source(str(path), streams={"top": "cam_high"} if name == "top" else {}, name=name)
            for name, path in three_stores.items()
        ]
    )
    loader = mmdata.DataLoader(mixture, LOWDIM, batch_size=8, shuffle="none", num_workers=0)
    plan = loader.epoch_plan()
    slots = np.concatenate([plan.plan.micro_batch(step, 0) for step in range(len(plan.plan))] + [plan.left_out])
    assert sorted(loader.planner.samples_of(plan, slots).tolist()) == list(range(len(loader.samples)))


@pytest.mark.slow
def test_stream_map_and_missing_camera_padding_value_by_value(three_stores):
    spec = mmdata.Windows(
        anchor_fps=5,
        streams={
            "cam_high": mmdata.Frames(offsets=[0.0], resize=mmdata.Resize(size=(64, 96), mode="stretch")),
            "cam_wrist": mmdata.Frames(offsets=[0.0], resize=mmdata.Resize(size=(64, 96), mode="stretch")),
            "state": mmdata.Values(offsets=[0.0], pad_to=14),
        },
    )
    loader = mmdata.DataLoader(
        _mixture(three_stores),
        spec,
        batch_size=4,
        shuffle="global",
        batching=mmdata.Batching(layout="padded"),
        num_workers=0,
    )
    seen = collections.Counter()
    for batch in loader:
        for row in range(len(batch["source"])):
            source = ["arm", "top", "wide"][int(batch["source"][row])]
            seen[source] += 1
            episode, time = int(batch["episode_index"][row]), float(batch["time"][row])
            dataset = mmdata.open_dataset(str(three_stores[source]))
            frame = batch["cam_high"][row, 0].numpy()
            assert batch["cam_high"].shape[-3:] == (64, 96, 3)
            camera = {"arm": "cam_high", "top": "top", "wide": "wide"}[source]
            full = dataset.frames_at(episode, camera, [time]).values
            reference = torch.nn.functional.interpolate(
                torch.from_numpy(full).permute(0, 3, 1, 2).float(), size=(64, 96), mode="bilinear", antialias=True
            )[0].permute(1, 2, 0)
            assert (torch.from_numpy(frame).float() - reference).abs().mean() < 2, "the mapped camera is that source's"
            wrist, wrist_pad = batch["cam_wrist"][row], batch["cam_wrist_is_pad"][row]
            if source == "arm":
                assert not wrist_pad.any() and wrist.float().mean() > 1
            else:
                assert wrist_pad.all() and not wrist.any(), "a camera the source lacks is black and flagged"
            dof = 7 if source == "top" else 14
            state = batch["state"][row, 0].numpy()
            stored = dataset.read_episode(episode, ["state"])["state"]
            nearest = int(np.argmin(np.abs(stored.timestamps - time)))
            assert np.array_equal(state[:dof], stored.values[nearest])
            assert not state[dof:].any()
            assert batch["state_dim_is_pad"][row].tolist() == [False] * dof + [True] * (14 - dof)
    assert set(seen) == {"arm", "top", "wide"}


def test_mixture_spec_is_checked_against_every_source_when_built(three_stores):
    with pytest.raises(mmdata.SpecError, match="different sizes.*Resize"):
        mmdata.DataLoader(
            _mixture(three_stores), mmdata.Windows(10, {"cam_high": mmdata.Frames()}), batch_size=4, num_workers=0
        )
    with pytest.raises(mmdata.SpecError, match="different widths.*pad_to=14"):
        mmdata.DataLoader(
            _mixture(three_stores), mmdata.Windows(10, {"state": mmdata.Values()}), batch_size=4, num_workers=0
        )
    with pytest.raises(mmdata.SpecError, match="no source has stream 'gripper'"):
        mmdata.DataLoader(
            _mixture(three_stores), mmdata.Windows(10, {"gripper": mmdata.Values()}), batch_size=4, num_workers=0
        )
    bad_map = mmdata.Mixture([mmdata.Source(str(three_stores["top"]), streams={"camera": "cam_high"})])
    with pytest.raises(mmdata.SpecError, match="maps streams it does not have: camera"):
        mmdata.DataLoader(bad_map, LOWDIM, batch_size=4, num_workers=0)
    too_dense = mmdata.Windows(10, {"cam_high": mmdata.Frames(offsets=[0.0, 0.04], resize=mmdata.Resize((32, 32)))})
    with pytest.raises(mmdata.SpecError, match="source 'top' \\(stream 'top'\\).*15 frames/s"):
        mmdata.DataLoader(_mixture(three_stores), too_dense, batch_size=4, num_workers=0)


@pytest.mark.slow
def test_mixture_resumes_exactly_and_elastically(three_stores):
    def build(rank, world, workers=0):
        return mmdata.DataLoader(
            _mixture(three_stores, epoch_samples=EPOCH),
            LOWDIM,
            num_workers=workers,
            seed=7,
            batching=mmdata.Batching(batch_tokens=200),
            runtime=mmdata.Runtime(rank=rank, world_size=world),
        )

    whole = [build(0, 1)]
    reference = _epoch(whole)
    first = build(0, 1)
    iterator = iter(first)
    before = [next(iterator) for _ in range(10)]
    state = first.state_dict()
    first.close()
    again = build(0, 1, workers=2)
    again.load_state_dict(state)
    after = _epoch([again])
    assert [b["sample_index"].tolist() for b in before + after] == [b["sample_index"].tolist() for b in reference]

    # stop at world size 2, go on at world size 3 with workers: nothing lost or repeated
    pair = [build(r, 2) for r in range(2)]
    iterators = [iter(loader) for loader in pair]
    consumed = [next(it) for _ in range(7) for it in iterators]
    state = pair[0].state_dict()
    for loader in pair:
        loader.close()
    trio = [build(r, 3, workers=2) for r in range(3)]
    for loader in trio:
        loader.load_state_dict(state)
    plan = trio[0].epoch_plan()
    rest = _epoch(trio)

    def samples_of(slots) -> collections.Counter:
        return collections.Counter(trio[0].planner.samples_of(plan, np.asarray(slots, np.int64)).tolist())

    delivered = collections.Counter(int(i) for batch in consumed + rest for i in batch["sample_index"])
    assert delivered + samples_of(plan.left_out) == samples_of(range(trio[0].planner.slots))
    assert max(delivered.values()) > 1, "the epoch up-samples, so some samples come twice, as planned"


@pytest.mark.slow
def test_mixture_normalizes_with_each_source_or_pooled_statistics(three_stores):
    spec = mmdata.Windows(anchor_fps=10, streams={"state": mmdata.Values(normalize="mean_std")})
    sources = [
        mmdata.Source(str(three_stores["arm"]), 0.75, name="arm"),
        mmdata.Source(str(three_stores["wide"]), 0.25, {"wide": "cam_high"}, name="wide"),
    ]
    raw = {}
    for name in ("arm", "wide"):
        dataset = mmdata.open_dataset(str(three_stores[name]))
        raw[name] = np.concatenate([dataset.read_episode(i, ["state"])["state"].values for i in range(len(dataset))])
    for normalize_with in ("source", "pooled"):
        loader = mmdata.DataLoader(
            mmdata.Mixture(sources, normalize_with=normalize_with), spec, batch_size=64, num_workers=0
        )
        for batch in loader:
            for row in range(len(batch["source"])):
                name = ["arm", "wide"][int(batch["source"][row])]
                dataset = mmdata.open_dataset(str(three_stores[name]))
                stored = dataset.read_episode(int(batch["episode_index"][row]), ["state"])["state"]
                value = stored.values[int(np.argmin(np.abs(stored.timestamps - float(batch["time"][row]))))]
                if normalize_with == "source":
                    mean, std = raw[name].mean(axis=0), raw[name].std(axis=0)
                else:  # the mixture as sampled: each source weighs its share of the epoch
                    share = loader.source_targets / loader.source_targets.sum()
                    mean = share[0] * raw["arm"].mean(axis=0) + share[1] * raw["wide"].mean(axis=0)
                    second = sum(w * (raw[n].var(axis=0) + raw[n].mean(axis=0) ** 2) for w, n in zip(share, raw))
                    std = np.sqrt(second - mean**2)
                expected = ((value - mean) / std).astype(np.float32)
                assert np.allclose(batch["state"][row, 0].numpy(), expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(mmdata.SpecError, match="different widths.*cannot be pooled"):
        padded = mmdata.Windows(anchor_fps=10, streams={"state": mmdata.Values(normalize="mean_std", pad_to=14)})
        mmdata.DataLoader(_mixture(three_stores, normalize_with="pooled"), padded, batch_size=64, num_workers=0)
    with pytest.raises(mmdata.SpecError, match="pooled percentiles"):
        quantile = mmdata.Windows(anchor_fps=10, streams={"state": mmdata.Values(normalize="quantile")})
        mmdata.DataLoader(mmdata.Mixture(sources, normalize_with="pooled"), quantile, batch_size=64, num_workers=0)


def test_source_stats_and_key_in_every_batch(three_stores):
    loader = mmdata.DataLoader(_mixture(three_stores, epoch_samples=300), LOWDIM, batch_size=50, num_workers=0)
    batches = list(loader)
    assert all("source" in batch for batch in batches)
    stats = loader.stats()["sources"]
    counts = collections.Counter(np.concatenate([b["source"].numpy() for b in batches]).tolist())
    assert [stats[name]["samples"] for name in WEIGHTS] == [counts[i] for i in range(3)]


def test_skip_replaces_a_failing_source_sample_and_counts_it(three_stores, tmp_path):
    import shutil

    broken = tmp_path / "wide.wds"
    shutil.copytree(three_stores["wide"], broken)
    row = mmdata.open_dataset(str(broken)).manifest.row(0)
    for segment in row["wide/segments"]:  # every video segment of episode 0 zeroed past its first bytes
        shard = broken / segment["path"]
        data = bytearray(shard.read_bytes())
        data[segment["offset"] + 64 : segment["offset"] + segment["size"]] = bytes(segment["size"] - 64)
        shard.write_bytes(bytes(data))
    spec = mmdata.Windows(anchor_fps=10, streams={"cam_high": mmdata.Frames(resize=mmdata.Resize((32, 32)))})
    stores = {**three_stores, "wide": broken}
    loader = mmdata.DataLoader(
        _mixture(stores), spec, batch_size=8, on_error="skip", reading=mmdata.Reading(verify=True), num_workers=0
    )
    delivered = sum(len(batch["source"]) for batch in loader)
    stats = loader.stats()
    assert delivered > 0 and stats["skipped_samples"] > 0
    assert stats["sources"]["wide"]["skipped_samples"] == stats["skipped_samples"]


@pytest.mark.slow
def test_pooled_statistics_of_a_mixture_equal_numpy_over_the_weighted_rows(three_stores, tmp_path):
    from tests.conftest import run_cli

    out = tmp_path / "pooled.json"
    paths = [str(three_stores["arm"]), str(three_stores["wide"])]
    result = run_cli("stats", *paths, "--weights", "3", "1", "--out", str(out))
    assert result.returncode == 0, result.stderr
    pooled = json.loads(out.read_text())["lowdim"]["state"]
    rows, weights = [], []
    for path, share in zip(paths, (0.75, 0.25)):
        dataset = mmdata.open_dataset(path)
        values = np.concatenate([dataset.read_episode(i, ["state"])["state"].values for i in range(len(dataset))])
        rows.append(values.astype(np.float64))
        weights.append(np.full(len(values), share / len(values)))
    rows, weights = np.concatenate(rows), np.concatenate(weights)
    mean = (rows * weights[:, None]).sum(axis=0)
    std = np.sqrt((weights[:, None] * (rows - mean) ** 2).sum(axis=0))
    np.testing.assert_allclose(pooled["mean"], mean, rtol=1e-6)
    np.testing.assert_allclose(pooled["std"], std, rtol=1e-6)
    assert np.array_equal(pooled["min"], rows.min(axis=0)) and np.array_equal(pooled["max"], rows.max(axis=0))
    for quantile, key in ((0.01, "q01"), (0.99, "q99")):
        for dim in range(rows.shape[1]):
            order = np.argsort(rows[:, dim], kind="stable")
            exact = rows[order, dim][np.searchsorted(np.cumsum(weights[order]), quantile - 1e-12)]
            assert abs(pooled[key][dim] - exact) <= pooled["quantile_error"][dim] * 1.0001 + 1e-12
