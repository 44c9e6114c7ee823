"""Normalization statistics: exact moments merged across parts, percentiles within their stated bound."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import mmdata
from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.errors import StoreError
from mmdata.importers import discover_episodes
from mmdata.store.statistics import Moments, compute_stats, write_stats
from tests.conftest import run_cli


def test_moments_merged_from_parts_equal_the_moments_of_the_whole():
    rng = np.random.default_rng(0)
    rows = rng.normal(5.0, 3.0, size=(1000, 4)) * [1, 10, 100, 1e-3]
    merged = Moments()
    for part in np.array_split(rows, [1, 7, 300, 301, 900]):
        merged = merged.merge(Moments.of(part))
    assert merged.count == 1000
    np.testing.assert_allclose(merged.mean, rows.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(merged.std, rows.std(axis=0), rtol=1e-12)
    assert np.array_equal(merged.low, rows.min(axis=0)) and np.array_equal(merged.high, rows.max(axis=0))


@pytest.mark.parametrize("layout", ["wds", "zarr"])
def test_lowdim_statistics_equal_numpys_over_every_row_of_every_episode(stores, layout):
    dataset = mmdata.open_dataset(str(stores[layout]))
    stats = compute_stats(dataset, camera_frames=0)
    for name in ("state", "action"):
        rows = np.concatenate([dataset.read_episode(i, [name])[name].values for i in range(len(dataset))])
        rows = rows.reshape(len(rows), -1).astype(np.float64)
        figures = stats["lowdim"][name]
        assert figures["count"] == len(rows)
        np.testing.assert_allclose(figures["mean"], rows.mean(axis=0), rtol=1e-6)
        np.testing.assert_allclose(figures["std"], rows.std(axis=0), rtol=1e-6)
        assert figures["min"] == rows.min(axis=0).tolist() and figures["max"] == rows.max(axis=0).tolist()
        bound = np.asarray(figures["quantile_error"]) * (1 + 1e-9) + 1e-12
        for key, quantile in (("q01", 0.01), ("q99", 0.99)):
            exact = np.quantile(rows, quantile, axis=0, method="inverted_cdf")
            assert (np.abs(np.asarray(figures[key]) - exact) <= bound).all(), key


def test_camera_statistics_sample_the_frames_asked_for_and_repeat_with_the_seed(stores):
    dataset = mmdata.open_dataset(str(stores["wds"]))
    first, again = compute_stats(dataset, camera_frames=24), compute_stats(dataset, camera_frames=24)
    camera = first["cameras"]["cam_high"]
    assert camera["frames"] == 24 and camera == again["cameras"]["cam_high"]
    assert all(0.0 < m < 1.0 for m in camera["mean"]) and all(0.0 < s < 0.5 for s in camera["std"])


@pytest.mark.slow
def test_stats_command_writes_stats_json_beside_dataset_json(stores, tmp_path):
    import shutil

    store = tmp_path / "store.wds"
    shutil.copytree(stores["wds"], store)
    finished = run_cli("stats", str(store), "--camera-frames", "8")
    assert finished.returncode == 0, finished.stderr
    written = json.loads((store / "stats.json").read_text())
    assert written["version"] == 1 and set(written["lowdim"]) == {"state", "action"}
    assert written["cameras"]["cam_wrist"]["frames"] == 8
    assert mmdata.open_dataset(str(store)).damaged == {}, "the store still opens as it was"


def _assert_same_statistics(written: dict, recomputed: dict) -> None:
    assert written["episodes"] == recomputed["episodes"]
    assert set(written["lowdim"]) == set(recomputed["lowdim"]) and written["lowdim"]
    for name, figures in recomputed["lowdim"].items():
        for key, values in figures.items():
            np.testing.assert_allclose(written["lowdim"][name][key], values, rtol=1e-9, atol=1e-12, err_msg=key)
    assert written["cameras"] == recomputed["cameras"]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_conversion_writes_statistics_merged_from_its_workers(raw_dataset, tmp_path, workers):
    store = tmp_path / "out"
    options = ConvertOptions(layout="zarr", workers=workers, progress=False)
    convert(discover_episodes(raw_dataset, "raw"), store, options)
    written = json.loads((store / "stats.json").read_text())
    _assert_same_statistics(written, compute_stats(mmdata.open_dataset(str(store))))


@pytest.mark.slow
def test_a_resumed_conversion_has_the_statistics_of_every_episode(raw_copy, tmp_path):
    audio = raw_copy / "episode_0002" / "audio.wav"
    good = audio.read_bytes()
    audio.write_bytes(b"not audio")
    options = ConvertOptions(layout="wds", shard_bytes=100_000, workers=1, progress=False)
    with pytest.raises(mmdata.SourceError):
        convert(discover_episodes(raw_copy, "raw"), tmp_path / "out", options)
    audio.write_bytes(good)
    resumed = ConvertOptions(layout="wds", shard_bytes=100_000, workers=1, progress=False, resume=True)
    report = convert(discover_episodes(raw_copy, "raw"), tmp_path / "out", resumed)
    assert report.resumed_at > 0
    written = json.loads((tmp_path / "out" / "stats.json").read_text())
    _assert_same_statistics(written, compute_stats(mmdata.open_dataset(str(tmp_path / "out"))))


@pytest.mark.slow
def test_statistics_of_a_lerobot_import_agree_with_lerobots_own_stats_json(tmp_path):
    source = Path(__file__).parent / "fixtures" / "lerobot_small"
    store = tmp_path / "out"
    result = run_cli("convert", str(source), str(store), "--from", "lerobot", "--quiet")
    assert result.returncode == 0, result.stderr
    written = json.loads((store / "stats.json").read_text())
    theirs = json.loads((source / "meta" / "stats.json").read_text())
    assert written["lerobot"] == theirs, "LeRobot's own figures are kept as they were"
    ours = written["lowdim"]
    for name in ("observation.state", "action"):
        assert ours[name]["count"] == theirs[name]["count"][0]
        for key in ("mean", "std", "min", "max"):
            # LeRobot aggregates per-episode figures in float32: its std drifts by up to ~2e-5 relative
            np.testing.assert_allclose(ours[name][key], theirs[name][key], rtol=5e-5, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("mode", ["mean_std", "min_max", "quantile"])
def test_the_loader_normalizes_values_by_the_stores_statistics(stores, tmp_path, mode):
    import shutil

    store = tmp_path / "store.zarr"
    shutil.copytree(stores["zarr"], store)
    dataset = mmdata.open_dataset(str(store))
    stats = compute_stats(dataset, camera_frames=0)
    write_stats(dataset, stats)
    offsets = [-0.1, 0.0]
    spec = mmdata.Windows(anchor_fps=5, streams={"state": mmdata.Values(offsets=offsets, normalize=mode)})
    plain = mmdata.Windows(anchor_fps=5, streams={"state": mmdata.Values(offsets=offsets)})
    normalized = next(iter(mmdata.DataLoader(str(store), spec, batch_size=4, shuffle="none", num_workers=0)))
    raw = next(iter(mmdata.DataLoader(str(store), plain, batch_size=4, shuffle="none", num_workers=0)))
    figures = stats["lowdim"]["state"]
    low, high = {"mean_std": ("mean", "std"), "min_max": ("min", "max"), "quantile": ("q01", "q99")}[mode]
    first, second = np.asarray(figures[low]), np.asarray(figures[high])
    shift, scale = (first, second) if mode == "mean_std" else ((first + second) / 2, (second - first) / 2)
    expected = (raw["state"].numpy().astype(np.float64) - shift) / scale
    assert normalized["state"].dtype == torch.float32
    np.testing.assert_allclose(normalized["state"].numpy(), expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(normalized["state_is_pad"], raw["state_is_pad"])


def test_normalizing_without_stats_json_names_the_command_that_makes_it(stores, tmp_path):
    import shutil

    store = tmp_path / "older.wds"  # stores converted before conversion wrote statistics
    shutil.copytree(stores["wds"], store)
    (store / "stats.json").unlink()
    spec = mmdata.Windows(anchor_fps=5, streams={"state": mmdata.Values(normalize="mean_std")})
    with pytest.raises(StoreError, match="no readable stats.json .*run `mmdata stats"):
        mmdata.DataLoader(str(store), spec, batch_size=4, num_workers=0)


def _with_stats(stores, tmp_path, name, change):
    import shutil

    store = tmp_path / name
    shutil.copytree(stores["wds"], store)
    stats = json.loads((store / "stats.json").read_text())
    change(stats["lowdim"]["state"])
    (store / "stats.json").write_text(json.dumps(stats))
    return store


@pytest.mark.parametrize(
    ("change", "mode", "complaint"),
    [
        (lambda f: f.update(std=[-1.0] * len(f["std"])), "mean_std", "negative std"),
        (lambda f: f.update(min=f["max"], max=f["min"]), "min_max", "min above its max"),
        (lambda f: f.update(mean="zero"), "mean_std", "'mean' of stream 'state' is not 14 numbers"),
        (lambda f: f.update(mean=[[0.0]] * 14), "mean_std", "'mean' of stream 'state' is not 14 numbers"),
        (lambda f: f.update(max=[None] * 14), "min_max", "'max' of stream 'state' holds values that are not finite"),
        (lambda f: f.pop("q99"), "quantile", "no q01/q99 for stream 'state'"),
    ],
    ids=["negative-std", "min-above-max", "text", "nested", "nulls", "missing"],
)
def test_statistics_that_cannot_be_right_are_refused_naming_the_stream(stores, tmp_path, change, mode, complaint):
    store = _with_stats(stores, tmp_path, "odd.wds", change)
    spec = mmdata.Windows(anchor_fps=5, streams={"state": mmdata.Values(normalize=mode)})
    with pytest.raises(StoreError, match=complaint):
        mmdata.DataLoader(str(store), spec, batch_size=4, num_workers=0)


def test_pooled_normalization_refuses_a_sources_malformed_statistics_by_name(stores, tmp_path):
    good = _with_stats(stores, tmp_path, "good.wds", lambda f: None)
    bad = _with_stats(stores, tmp_path, "bad.wds", lambda f: f.update(std={"a": 1}))
    mixture = mmdata.Mixture([mmdata.Source(str(good)), mmdata.Source(str(bad))], normalize_with="pooled")
    spec = mmdata.Windows(anchor_fps=5, streams={"state": mmdata.Values(normalize="mean_std")})
    with pytest.raises(StoreError, match="bad.wds/stats.json: 'std' of stream 'state' is not a list of numbers"):
        mmdata.DataLoader(mixture, spec, batch_size=4, num_workers=0)


@pytest.mark.slow
@pytest.mark.parametrize("weights", [["nan", "1"], ["inf", "1"], ["-1", "1"], ["0", "0"]])
def test_stats_weights_that_are_not_finite_shares_are_refused_in_one_line(stores, tmp_path, weights):
    out = str(tmp_path / "pooled.json")
    result = run_cli("stats", str(stores["wds"]), str(stores["zarr"]), "--weights", *weights, "--out", out)
    assert result.returncode == 2 and "weight" in result.stderr and "Traceback" not in result.stderr


def test_an_unset_normalization_leaves_the_spec_description_and_resume_fingerprint_as_before():
    described = mmdata.Windows(anchor_fps=5, streams={"state": mmdata.Values()}).describe()
    assert described["streams"]["state"] == {
        "type": "Values",
        "offsets": (0.0,),
        "interpolation": "nearest",
        "rate": None,
    }


@pytest.mark.slow
def test_camera_statistics_of_large_frames_decode_a_bounded_block_at_a_time(tmp_path):
    import tracemalloc

    from mmdata.conversion.pipeline import ConvertOptions, convert
    from mmdata.importers.raw import discover_raw_episodes
    from mmdata.store.statistics import compute_stats
    from mmdata.synthetic import synthetic_frame, write_video

    episode = tmp_path / "raw" / "episode_0"
    episode.mkdir(parents=True)
    frames = 64  # 1280x720: 2.8 MB of RGB each, 177 MB for the episode's frames held at once
    write_video(episode / "cam.mp4", (synthetic_frame(i, 0, 720, 1280) for i in range(frames)), 30, 1280, 720)
    (episode / "meta.json").write_text('{"task": "look"}')
    convert(discover_raw_episodes(tmp_path / "raw"), str(tmp_path / "out"), ConvertOptions(workers=1, progress=False))
    dataset = mmdata.open_dataset(str(tmp_path / "out"))
    tracemalloc.start()
    stats = compute_stats(dataset, camera_frames=frames)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert stats["cameras"]["cam"]["frames"] == frames
    assert peak < 150 << 20, f"{peak >> 20} MB held while counting"


@pytest.mark.slow
def test_a_recording_holding_nan_gives_statistics_every_reader_parses_the_other_streams_normalize(raw_copy, tmp_path):
    from mmdata.store.statistics import read_stats

    episode = sorted(raw_copy.iterdir())[1]
    values = np.load(episode / "state.npy")
    values[3, 2] = np.nan
    np.save(episode / "state.npy", values)
    store = tmp_path / "nan.wds"
    convert(discover_episodes(raw_copy, "raw"), store, ConvertOptions(workers=1, progress=False))
    text = (store / "stats.json").read_text()
    json.loads(text, parse_constant=lambda constant: pytest.fail(f"stats.json holds {constant}"))
    stats = read_stats(mmdata.open_store(str(store)))
    assert stats["lowdim"]["state"] == {"count": stats["lowdim"]["state"]["count"], "non_finite": True}
    assert stats["moments"]["state"]["mean"][2] is None and stats["moments"]["action"]["mean"][2] is not None
    normalized = mmdata.Windows(anchor_fps=5, streams={"action": mmdata.Values(normalize="mean_std")})
    assert len(list(mmdata.DataLoader(str(store), normalized, batch_size=4, num_workers=0))) > 0
    refused = mmdata.Windows(anchor_fps=5, streams={"state": mmdata.Values(normalize="mean_std")})
    with pytest.raises(mmdata.StoreError, match="stream 'state' holds NaN or infinite values"):
        mmdata.DataLoader(str(store), refused, batch_size=4, num_workers=0)
