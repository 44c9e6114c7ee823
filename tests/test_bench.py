"""`mmdata bench` and the loader's observability: the table, the JSON schema, regression checks,
stage shares that account for the wall time, the naive baseline, sweeps, and StepTimer."""

from __future__ import annotations

import copy
import io
import json
import time
from pathlib import Path

import jsonschema
import numpy as np
import pytest

import mmdata
from mmdata.measure import StepTimer, run_loader
from mmdata.measure.floor import decode_floor
from mmdata.measure.progress import SettlingLine
from mmdata.measure.sweep import parse_sweep
from tests.conftest import run_cli

SCHEMA = json.loads((Path(__file__).parents[1] / "docs" / "bench.schema.json").read_text())
POLICY = mmdata.Windows(
    anchor_fps=10,
    streams={
        "cam_high": mmdata.Frames(offsets=[-0.1, 0.0]),
        "state": mmdata.Values(offsets=[-0.1, 0.0]),
        "audio": mmdata.Audio(window=(-1.0, 0.0)),
    },
)


@pytest.fixture(scope="module")
def bench_result(stores, tmp_path_factory) -> tuple[Path, str]:
    output = tmp_path_factory.mktemp("bench") / "result.json"
    finished = run_cli("bench", str(stores["wds"]), "--steps", "8", "--json", str(output))
    assert finished.returncode == 0, finished.stderr
    return output, finished.stdout


@pytest.mark.slow
def test_bench_prints_the_table_and_writes_json_valid_against_the_documented_schema(bench_result):
    output, table = bench_result
    for line in (
        "samples/s",
        "frames/s",
        "tokens/s",
        "MB/s read",
        "packing efficiency",
        "rank token spread",
        "batch latency p50/p95/p99",
        "input stall",
        "decode waste",
        "peak RSS per worker",
        "main thread",
    ):
        assert line in table
    document = json.loads(output.read_text())
    jsonschema.validate(document, SCHEMA)
    assert document["figures"]["samples_per_s"] > 0
    assert document["versions"]["mmdata"] == mmdata.__version__
    assert document["config"]["shuffle"] == "blocks" and "order blocks" in table  # "auto" with a camera


@pytest.mark.slow
def test_bench_measures_the_order_asked_for(stores, tmp_path):
    output = tmp_path / "blocks.json"
    finished = run_cli(
        "bench", str(stores["wds"]), "--shuffle", "blocks", "--batch-size", "4", "--steps", "4", "--json", str(output)
    )
    assert finished.returncode == 0, finished.stderr
    document = json.loads(output.read_text())
    jsonschema.validate(document, SCHEMA)
    assert document["config"]["shuffle"] == "blocks" and "order blocks" in finished.stdout
    refused = run_cli("bench", str(stores["wds"]), "--shuffle", "sideways")
    assert refused.returncode == 2 and "--shuffle" in refused.stderr


@pytest.mark.slow
def test_bench_measures_sequences_packed_under_a_token_budget_in_the_blocks_order(stores, tmp_path):
    output = tmp_path / "packed.json"
    finished = run_cli(
        "bench", str(stores["wds"]), "--spec", "sequences", "--shuffle", "blocks", "--steps", "3", "--json", str(output)
    )
    assert finished.returncode == 0, finished.stderr
    document = json.loads(output.read_text())
    jsonschema.validate(document, SCHEMA)
    assert document["config"]["shuffle"] == "blocks"
    assert 0 < document["figures"]["packing_efficiency"] <= 1


@pytest.mark.slow
def test_compare_exits_non_zero_on_a_planted_regression_and_zero_within_the_limit(bench_result, tmp_path):
    output, _ = bench_result
    measured = json.loads(output.read_text())

    def check(old_figures: dict, new_figures: dict) -> tuple[int, str]:
        paths = []
        for name, figures in (("old", old_figures), ("new", new_figures)):
            document = copy.deepcopy(measured)
            document["figures"].update(figures)
            paths.append(tmp_path / f"{name}.json")
            paths[-1].write_text(json.dumps(document))
        finished = run_cli("bench", "--from-json", str(paths[1]), "--compare", str(paths[0]), "--max-regression", "5%")
        return finished.returncode, finished.stdout

    code, text = check({"samples_per_s": 100.0}, {"samples_per_s": 90.0})
    assert code == 1 and "samples_per_s fell from 100 to 90" in text
    code, text = check({"stall_fraction": 0.0}, {"stall_fraction": 0.1})
    assert code == 1 and "stall_fraction rose" in text
    code, text = check({"latency_ms": {"p95": 10.0}}, {"latency_ms": {"p95": 12.0}})
    assert code == 1 and "latency_p95_ms rose" in text
    code, _ = check({"samples_per_s": 100.0, "frames_per_s": 100.0}, {"samples_per_s": 97.0, "frames_per_s": 120.0})
    assert code == 0


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_stage_shares_account_for_the_wall_time_within_five_percent(stores, workers):
    # Without the frame cache, which on this small store would serve most frames and leave little to decode.
    loader = mmdata.DataLoader(
        stores["wds"],
        POLICY,
        num_workers=workers,
        batching=mmdata.Batching(tokens_per={"cam_high": 64}, batch_tokens=1024),
        reading=mmdata.Reading(frame_cache_bytes=0),
    )
    measured = run_loader(loader, steps=12, warmup=2, step_ms=5)
    main = measured["stages"]["main_thread"]
    assert abs(sum(stage["share"] for stage in main.values()) - 1) < 1e-3
    assert abs(main["unaccounted"]["share"]) < 0.05
    if workers == 0:
        assert main["decode"]["share"] > 0.2
    else:
        stages = measured["stages"]["workers"]["stages"]
        assert abs(sum(stage["share"] for stage in stages.values()) - 1) < 1e-3
        assert stages["decode"]["share"] > 0.2


def test_step_timer_separates_waiting_for_data_from_computing():
    def slow_batches(count, seconds):
        for index in range(count):
            time.sleep(seconds)
            yield index

    timer = StepTimer(slow_batches(5, 0.03), synchronize=False)
    for _ in timer:
        time.sleep(0.01)
    report = timer.report()
    assert report["steps"] == 5
    assert report["stall_fraction"] == 1.0
    assert report["wait_seconds"] == pytest.approx(0.15, abs=0.05)
    assert report["compute_seconds"] == pytest.approx(0.05, abs=0.04)
    assert "input stalls: 100.0% of steps" in timer.summary()
    fast = StepTimer(range(5), synchronize=False)
    for _ in fast:
        time.sleep(0.005)
    assert fast.report()["stall_fraction"] == 0.0


def test_step_timer_adds_the_loader_stage_times_when_wrapping_a_loader(stores):
    loader = mmdata.DataLoader(stores["wds"], POLICY, batch_size=8, num_workers=0)
    timer = StepTimer(loader, synchronize=False)
    for _ in timer:
        pass
    report = timer.report()
    assert report["steps"] == report["loader"]["steps"] > 0
    assert report["loader"]["worker_stage_seconds"]["decode"] > 0
    assert "loader stage seconds" in timer.summary()


@pytest.mark.slow
def test_sweep_runs_every_combination_and_plots_them(stores, tmp_path):
    plot, output = tmp_path / "sweep.png", tmp_path / "sweep.json"
    finished = run_cli(
        "bench",
        str(stores["wds"]),
        "--steps",
        "3",
        "--warmup",
        "1",
        "--sweep",
        "num_workers=0,1",
        "decoder=pyav,decord",
        "--plot",
        str(plot),
        "--json",
        str(output),
    )
    assert finished.returncode == 0, finished.stderr
    rows = json.loads(output.read_text())["sweep"]
    assert [row["setting"] for row in rows] == [
        {"num_workers": 0, "decoder": "pyav"},
        {"num_workers": 0, "decoder": "decord"},
        {"num_workers": 1, "decoder": "pyav"},
        {"num_workers": 1, "decoder": "decord"},
    ]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_sweep_axes_are_refused_with_what_can_be_swept():
    with pytest.raises(ValueError, match="cannot sweep 'colour'.*num_workers"):
        parse_sweep(["colour=red,blue"])
    with pytest.raises(ValueError, match="must look like name=value1,value2"):
        parse_sweep(["num_workers"])


@pytest.mark.slow
def test_naive_baseline_runs_on_the_same_episodes_and_reports_ratios(stores, tmp_path):
    output = tmp_path / "baseline.json"
    finished = run_cli(
        "bench",
        str(stores["wds"]),
        "--steps",
        "4",
        "--baseline",
        "naive",
        "--baseline-seconds",
        "3",
        "--json",
        str(output),
    )
    assert finished.returncode == 0, finished.stderr
    document = json.loads(output.read_text())
    jsonschema.validate(document, SCHEMA)
    assert document["baseline"]["samples_per_s"] > 0
    assert document["ratios"]["samples_per_s"] > 1
    assert "mmdata / baseline" in finished.stdout


@pytest.mark.slow
def test_bench_without_a_dataset_measures_a_synthetic_demo_store():
    finished = run_cli("bench", "--steps", "10")
    assert finished.returncode == 0, finished.stderr
    assert "made a synthetic demo store" in finished.stdout
    assert "samples/s" in finished.stdout


def test_mixing_figures_count_distinct_episodes_and_what_consecutive_batches_share():
    from mmdata.measure.runner import mixing_figures

    same = mixing_figures([np.array([1, 2, 3, 3]), np.array([1, 2, 3, 3]), np.array([1, 2, 3, 3])])
    assert same["episodes_per_batch"] == 3 and same["episodes_shared_with_previous"] == 1.0
    apart = mixing_figures([np.array([0, 1]), np.array([10, 11]), np.array([20, 21]), np.array([30, 31])])
    assert apart["episodes_shared_with_previous"] == 0.0 and apart["episode_lag1_correlation"] > 0.9
    assert mixing_figures([]) == {
        "episodes_per_batch": 0.0,
        "episodes_shared_with_previous": 0.0,
        "episode_lag1_correlation": 0.0,
    }


def test_mixing_reads_episode_numbers_from_tensors_as_a_device_batch_holds_them():
    import torch

    from mmdata.measure.runner import _episodes_in

    batch = {"episode_index": torch.tensor([3, 4]), "source": torch.tensor([0, 1])}
    assert _episodes_in(batch).tolist() == [3, (1 << 40) + 4]
    assert _episodes_in({"episode_index": np.array([5])}).tolist() == [5]


def test_the_simulated_step_takes_the_time_asked_and_the_figures_say_so(stores):
    loader = mmdata.DataLoader(stores["wds"], POLICY, batch_size=2, num_workers=0)
    figures = run_loader(loader, steps=3, warmup=1, step_ms=30.0)["figures"]
    assert 25.0 <= figures["step_ms_measured"] <= 60.0


@pytest.mark.slow
def test_a_runs_plot_shows_where_the_time_went(tmp_path):
    from mmdata.measure.plots import plot_stages

    shares = {"data_wait": {"seconds": 1.0, "share": 0.8}, "step": {"seconds": 0.25, "share": 0.2}}
    stages = {"video": {"seconds": 3, "share": 0.7}, "read": {"seconds": 1, "share": 0.3}}
    workers = {"utilization": 0.9, "stages": stages}
    document = {
        "stages": {"main_thread": shares, "workers": workers},
        "figures": {"samples_per_s": 123.4, "stall_fraction": 0.8},
    }
    plot_stages(document, tmp_path / "plot.png", "mmdata bench policy")
    image = (tmp_path / "plot.png").read_bytes()
    assert image.startswith(b"\x89PNG") and len(image) > 5_000


@pytest.mark.slow
def test_from_json_of_what_is_not_a_complete_result_is_named_in_one_line(bench_result, tmp_path, capsys):
    from mmdata.tools.cli import main

    output, _ = bench_result
    measured = json.loads(output.read_text())

    def edited(change) -> dict:
        document = copy.deepcopy(measured)
        change(document)
        return document

    cases = {
        "not JSON": ("{oops", "is not valid JSON"),
        "a list": ([1, 2], "is not an mmdata bench result: it is not a JSON object"),
        "another schema": ({"schema": "other/1"}, "its schema is 'other/1'"),
        "a text figure": (
            edited(lambda d: d["figures"].update(samples_per_s="fast")),
            "figures.samples_per_s is 'fast'",
        ),
        "a missing figure": (edited(lambda d: d["figures"].pop("stall_fraction")), "figures.stall_fraction is None"),
        "a text share": (
            edited(lambda d: d["stages"]["main_thread"].update(step={"share": "most"})),
            "stages.main_thread.step is {'share': 'most'}, not a share",
        ),
    }
    for name, (content, expected) in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        for arguments in (["--from-json", str(path)], ["--from-json", str(output), "--compare", str(path)]):
            assert main(["bench", *arguments]) == 2, name
            error = capsys.readouterr().err
            assert expected in error and str(path) in error and "Traceback" not in error, (name, error)


@pytest.mark.slow
def test_plot_names_the_file_it_writes_and_refuses_a_folder(bench_result, tmp_path, capsys):
    from mmdata.tools.cli import main

    output, _ = bench_result
    assert main(["bench", "--from-json", str(output), "--plot", str(tmp_path / "chart")]) == 0
    assert f"plot written to {tmp_path / 'chart.png'}" in capsys.readouterr().out
    assert (tmp_path / "chart.png").read_bytes().startswith(b"\x89PNG")
    folder = tmp_path / "plots"
    folder.mkdir()
    assert main(["bench", "--from-json", str(output), "--plot", str(folder)]) == 2
    assert "is a folder; name the chart's file, such as" in capsys.readouterr().err
    assert main(["bench", "--from-json", str(output), "--plot", str(tmp_path / "chart.txt")]) == 2
    assert "not .txt" in capsys.readouterr().err and not list(folder.iterdir())


def test_the_decode_floor_decodes_each_frame_the_samples_deliver_once(stores):
    store = mmdata.open_dataset(stores["wds"])
    fps = store.schema.stream("cam_high").fps
    # every stored frame an anchor, each sample also asking for the frame before: each frame asked twice
    spec = mmdata.Windows(anchor_fps=fps, streams={"cam_high": mmdata.Frames(offsets=[-1 / fps, 0.0])})
    loader = mmdata.DataLoader(stores["wds"], spec, batch_size=4, num_workers=0)
    first_episode = np.flatnonzero(loader.samples.episodes_of(np.arange(len(loader.samples)))[0] == 0)
    floor = decode_floor(loader, [*first_episode.tolist(), *first_episode[:5].tolist()])
    assert floor.samples == len(first_episode), "a sample delivered twice is counted once"
    assert floor.frames == len(first_episode), "one frame decoded per stored frame, though each is asked twice"
    assert floor.cpu_seconds > 0 and floor.ms_per_sample == 1000 * floor.cpu_seconds / len(first_episode)


def test_the_decode_floor_of_scattered_samples_times_whole_segments_and_counts_only_delivered_frames(
    stores, monkeypatch
):
    from mmdata.codecs.decoders.pyav_decoder import PyAvDecoder

    timed = []
    decode = PyAvDecoder.decode
    monkeypatch.setattr(
        PyAvDecoder, "decode", lambda self, requests, *a: timed.extend(requests) or decode(self, requests, *a)
    )
    loader = mmdata.DataLoader(stores["wds"], POLICY, batch_size=4, num_workers=0)
    scattered = np.arange(0, len(loader.samples), 7)  # a frame here and there: a short bench's steps
    floor = decode_floor(loader, scattered)
    assert floor.samples == len(scattered) and floor.frames <= 3 * len(scattered)
    assert timed and all(request.frames == tuple(range(len(request.packets))) for request in timed)
    assert sum(len(request.frames) for request in timed) > floor.frames, "whole segments timed, not the frames"


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_bench_reports_the_loaders_cpu_per_sample_workers_included_against_the_decode_floor(stores, workers):
    loader = mmdata.DataLoader(stores["wds"], POLICY, batch_size=4, num_workers=workers)
    measured = run_loader(loader, steps=6, warmup=2)
    figures, worker_cpu = measured["figures"], measured["loader_stats"]["worker_cpu_seconds"]
    assert len(worker_cpu) == workers and all(seconds > 0 for seconds in worker_cpu.values())
    assert figures["cpu_ms_per_sample"] > 0 and figures["decode_floor_ms_per_sample"] > 0
    ratio = figures["cpu_ms_per_sample"] / figures["decode_floor_ms_per_sample"]
    assert figures["cpu_over_decode_floor"] == pytest.approx(ratio, rel=0.01)
    assert 0 < figures["decode_cpu_ms_per_sample"] < figures["cpu_ms_per_sample"]  # decoding is a part of it
    by_stage = figures["stage_cpu_ms_per_sample"]
    assert by_stage["decode"] >= figures["decode_cpu_ms_per_sample"] and by_stage["fetch"] > 0 and by_stage["align"] > 0
    assert sum(by_stage.values()) >= figures["cpu_ms_per_sample"] - 0.01  # the parts add up to the whole
    jsonschema.validate(figures, SCHEMA["properties"]["figures"])


@pytest.mark.slow
def test_bench_with_auto_workers_reports_the_settings_it_chose_over_time(stores, tmp_path):
    output = tmp_path / "auto.json"
    finished = run_cli("bench", str(stores["wds"]), "--num-workers", "auto", "--steps", "40", "--json", str(output))
    assert finished.returncode == 0, finished.stderr
    document = json.loads(output.read_text())
    jsonschema.validate(document, SCHEMA)
    tuning = document["loader_stats"]["autotune"]
    assert tuning["most_workers"] >= 1 and document["config"]["num_workers"] >= 1
    assert 'num_workers="auto"' in finished.stdout
    for setting in tuning["settings"]:
        assert f"{setting['workers']} workers, read-ahead {setting['read_ahead']}" in finished.stdout
    settling = [line for line in finished.stderr.splitlines() if line.startswith("auto: step ")]
    assert settling and f"of at most {tuning['most_workers']} workers" in settling[0]  # while it ran, not a TTY


def _tuner_stats(*settings, workers=2):
    return lambda: {"workers": workers, "autotune": {"most_workers": 4, "read_ahead": 2, "settings": list(settings)}}


SETTING = {"workers": 2, "read_ahead": 2, "stall": 0.25, "steps_per_second": 12.5, "reason": "the loop waited"}


def test_the_settling_line_redraws_one_line_on_a_terminal_and_ends_it_at_the_last_step():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    line = SettlingLine(_tuner_stats(SETTING), stream, redraw_seconds=0)
    for done in range(1, 4):
        line(done, 3)
    text = stream.getvalue()
    assert text.count("\r") == 3 and text.endswith("\n") and text.count("\n") == 1
    assert "auto: step 3/3, 2 of at most 4 workers, read-ahead 2, stall 25.0%, 12.5 steps/s: the loop waited" in text


def test_the_settling_line_writes_a_line_per_new_setting_to_a_log_and_nothing_without_a_tuner():
    stream = io.StringIO()
    settings: list[dict] = []
    line = SettlingLine(lambda: _tuner_stats(*settings, workers=len(settings) + 1)(), stream, 0)
    line(1, 10)
    line(2, 10)
    settings.append(SETTING)
    line(3, 10)
    line(4, 10)
    settings.append(SETTING | {"workers": 3, "reason": "grown"})
    line(5, 10)
    assert stream.getvalue().splitlines() == [
        "auto: step 1/10, 1 of at most 4 workers, read-ahead 2: measuring its first window",
        "auto: step 3/10, 2 of at most 4 workers, read-ahead 2, stall 25.0%, 12.5 steps/s: the loop waited",
        "auto: step 5/10, 3 of at most 4 workers, read-ahead 2, stall 25.0%, 12.5 steps/s: grown",
    ]
    quiet = io.StringIO()
    SettlingLine(lambda: {}, quiet, 0)(1, 1)
    assert quiet.getvalue() == ""


def test_bench_refuses_a_worker_count_that_is_neither_a_number_nor_auto():
    finished = run_cli("bench", "--num-workers", "many")
    assert finished.returncode == 2 and "auto" in finished.stderr
