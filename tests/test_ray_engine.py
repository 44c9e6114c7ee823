"""`convert --engine ray` on a local Ray cluster started by the tests: the store equals the local engine's,
byte for byte, also when a worker is killed mid-conversion, the driver is killed and the run resumed, or the
store is written straight into S3."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import mmdata
from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.importers.raw import discover_raw_episodes
from mmdata.store.verification import verify_dataset
from tests.s3_server import CREDENTIALS
from tests.test_object_storage import BUCKET, s3_endpoint  # noqa: F401  (a fixture)

ray = pytest.importorskip("ray", reason="the Ray engine tests need ray (pip install -e .[dev])")

# The session's local stores (tests/conftest.py) were converted with these options.
RAY = ConvertOptions(shard_bytes=150_000, progress=False, engine="ray")


@pytest.fixture(scope="module")
def ray_cluster() -> str:
    """A Ray cluster on this machine with 2 CPUs (so 2 worker processes run tasks at a time); its address."""
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        logging_level="WARNING",
        runtime_env={"env_vars": CREDENTIALS},  # the workers' S3 credentials, as a node's would be
    )
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def store_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_same_store(converted: dict[str, bytes], expected: dict[str, bytes]) -> None:
    assert sorted(converted) == sorted(expected), "the stores hold different files"
    differing = [name for name in expected if converted[name] != expected[name]]
    assert not differing, f"files differ from the local engine's: {differing}"


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["wds", "zarr"])
def test_a_ray_conversion_equals_the_local_one_byte_for_byte(ray_cluster, raw_dataset, stores, tmp_path, layout):
    options = dataclasses.replace(RAY, layout=layout)
    report = convert(discover_raw_episodes(raw_dataset), tmp_path / "out", options)
    assert report.converted == 3 and not report.skipped
    assert_same_store(store_files(tmp_path / "out"), store_files(stores[layout]))
    assert len(list((tmp_path / "out" / "shards").glob("*.tar"))) > 1 if layout == "wds" else True


def _kill_first_encoder(killed: list[int], stop: threading.Event) -> None:
    """Kill (SIGKILL) the first Ray worker process seen running an encode task."""
    while not stop.is_set():
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"ray::_encode_to_store" in title:
                os.kill(int(pid), signal.SIGKILL)
                killed.append(int(pid))
                return
        time.sleep(0.005)


@pytest.mark.slow
def test_a_worker_killed_mid_conversion_still_gives_the_identical_store(ray_cluster, raw_dataset, stores, tmp_path):
    killed: list[int] = []
    stop = threading.Event()
    killer = threading.Thread(target=_kill_first_encoder, args=(killed, stop), daemon=True)
    killer.start()
    try:
        report = convert(discover_raw_episodes(raw_dataset), tmp_path / "out", RAY)
    finally:
        stop.set()
        killer.join(5)
    assert killed, "no encode task was seen running, so none was killed"
    assert report.converted == 3 and not report.skipped
    assert_same_store(store_files(tmp_path / "out"), store_files(stores["wds"]))


@pytest.mark.slow
def test_a_killed_driver_then_resume_gives_the_identical_store(ray_cluster, raw_dataset, stores, tmp_path):
    destination = tmp_path / "out"
    command = [sys.executable, "-m", "mmdata", "convert", str(raw_dataset), str(destination), "--quiet"]
    command += ["--shard-size", "150000", "--engine", "ray", "--ray-address", ray_cluster]
    driver = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    encoded = destination / ".mmdata-partial" / "encoded"
    deadline = time.monotonic() + 120
    while driver.poll() is None and time.monotonic() < deadline and len(list(encoded.glob("*.json"))) < 1:
        time.sleep(0.01)
    driver.kill()
    _, errors = driver.communicate(timeout=60)
    assert not (destination / "dataset.json").exists(), f"the driver finished before it was killed: {errors!r}"
    assert list(encoded.glob("*.episode")), errors

    report = convert(discover_raw_episodes(raw_dataset), destination, dataclasses.replace(RAY, resume=True))
    assert report.resumed_at >= 1 and report.converted == 3
    assert_same_store(store_files(destination), store_files(stores["wds"]))


@pytest.mark.slow
def test_a_ray_conversion_straight_into_s3_equals_the_local_one(ray_cluster, raw_dataset, stores, s3_endpoint):  # noqa: F811
    url = f"s3://{BUCKET}/ray/out.wds"
    report = convert(discover_raw_episodes(raw_dataset), url, RAY)
    assert report.destination == url and report.converted == 3
    prefix = f"{BUCKET}/ray/out.wds"
    objects = {path.removeprefix(prefix + "/"): s3_endpoint.cat_file(path) for path in s3_endpoint.find(prefix)}
    assert_same_store(objects, store_files(stores["wds"]))
    assert verify_dataset(url, progress=False).ok


@pytest.mark.slow
def test_bad_episodes_on_ray_are_reported_or_skipped_like_the_local_engine_does(ray_cluster, raw_copy, tmp_path):
    (raw_copy / "episode_0001" / "audio.wav").write_bytes(b"not audio")
    with pytest.raises(mmdata.SourceError, match="episode_0001"):
        convert(discover_raw_episodes(raw_copy), tmp_path / "stopped", RAY)
    skipping = dataclasses.replace(RAY, skip_bad=True)
    on_ray = convert(discover_raw_episodes(raw_copy), tmp_path / "ray", skipping)
    local = convert(discover_raw_episodes(raw_copy), tmp_path / "local", dataclasses.replace(skipping, engine="local"))
    assert [s["episode"] for s in on_ray.skipped] == ["episode_0001"] and on_ray.skipped == local.skipped
    assert_same_store(store_files(tmp_path / "ray"), store_files(tmp_path / "local"))


@pytest.mark.slow
def test_without_ray_installed_the_error_says_how_to_install_it(raw_dataset, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(mmdata.MmdataError, match=r"pip install 'mmdata\[ray\]'"):
        convert(discover_raw_episodes(raw_dataset), tmp_path / "out", RAY)


def test_an_episode_summary_predicts_the_tar_bytes_its_episode_takes_whatever_its_names_and_number(raw_copy):
    import io

    from mmdata.conversion.encode import EncodeOptions, encode_episode
    from mmdata.conversion.ray_engine import EpisodeSummary
    from mmdata.store.wds_writer import ShardTar

    for folder in raw_copy.iterdir():  # a member name past 100 bytes
        (folder / "cam_wrist.mp4").rename(folder / ("caméra " + "w" * 140 + ".mp4"))
    episode = encode_episode(discover_raw_episodes(raw_copy)[0], 0, EncodeOptions())
    summary = EpisodeSummary.from_json(EpisodeSummary.of(episode).to_json().encode(), "summary.json")
    for index in (0, 41, 1_234_567):  # a 7-digit number lengthens every member's name
        shard = ShardTar(io.BytesIO(), "shard-000000.tar")
        shard.add(episode, index)
        assert summary.shard_bytes(index) == shard.offset
