"""Damage a large manifest can hold is named by episode wherever it is met, and `on_error="skip"` leaves those episodes
out and counts them: a duration no episode can have (not a number, infinite, negative, absurd), found when planning;
a row group that cannot be read, found when planning, reading a row, reading ahead, verifying or inspecting, locally
and from object storage. A conversion or append refuses such durations. Object storage's keys are never resolved
into another bucket's, and a server that answers a byte range with the wrong bytes is named."""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import mmdata
from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.errors import IntegrityError, OptionError, SampleError, SourceError, StoreError
from mmdata.importers.episode import EpisodeSource, LowdimSource
from mmdata.store import manifest_reader
from mmdata.store.s3_plain import PlainS3Reader
from tests.conftest import EPISODES, GROUP_ROWS, run_cli

STATE = mmdata.Windows(anchor_fps=5, streams={"state": mmdata.Values()})


def copy_with_manifest(scaled: Path, folder: Path, change) -> Path:
    """A copy of `scaled` whose manifest file is `change(bytes of the manifest, its Parquet metadata)`."""
    copy = Path(shutil.copytree(scaled, folder / "copy.wds"))
    path = copy / "episodes.parquet"
    path.write_bytes(change(bytearray(path.read_bytes()), pq.ParquetFile(path).metadata))
    return copy


def with_duration(scaled: Path, folder: Path, row: int, value: float) -> Path:
    def change(data: bytearray, metadata) -> bytes:
        table = pq.read_table(pa.BufferReader(bytes(data)))
        durations = table.column("duration").to_pylist()
        durations[row] = value
        column = pa.array(durations, table.schema.field("duration").type)
        table = table.set_column(table.schema.get_field_index("duration"), "duration", column)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, row_group_size=GROUP_ROWS)
        return sink.getvalue().to_pybytes()

    return copy_with_manifest(scaled, folder, change)


def with_group_damaged(scaled: Path, folder: Path, group: int, column: str) -> Path:
    """A copy whose manifest's row group `group` has the first data page of `column` overwritten."""

    def change(data: bytearray, metadata) -> bytes:
        chunks = metadata.row_group(group)
        chunk = next(chunks.column(c) for c in range(chunks.num_columns) if chunks.column(c).path_in_schema == column)
        data[chunk.data_page_offset : chunk.data_page_offset + 40] = b"\xff" * 40
        return bytes(data)

    return copy_with_manifest(scaled, folder, change)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e12, -1.0])
def test_a_duration_no_episode_can_have_in_a_large_manifest_is_named_and_skipped_at_planning(
    scaled, tmp_path, by_row_group, value
):
    store = str(with_duration(scaled, tmp_path, 13, value))
    for mode in ("blocks", "global"):
        shuffling = {"shuffle": mode, "num_workers": 0}
        with pytest.raises(StoreError, match=r"episode 'episode_000013' \(row 13\) .*duration .* is not within"):
            mmdata.DataLoader(store, STATE, batch_size=4, **shuffling)
        loader = mmdata.DataLoader(store, STATE, batch_size=4, on_error="skip", **shuffling)
        episodes = {int(e) for batch in loader for e in batch["episode_index"]}
        assert episodes == set(range(EPISODES)) - {13}
        assert list(loader.stats()["excluded_episodes"]) == [13]


def test_a_conversion_and_an_append_refuse_an_episode_whose_times_give_no_plausible_duration(stores, tmp_path):
    def episode(name: str, times: list[float]) -> EpisodeSource:
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"timestamp": times, "state": [float(i) for i in range(len(times))]}), path)
        return EpisodeSource(name=name, task="t", lowdim=(LowdimSource("state", str(path), column="state"),))

    options = ConvertOptions(layout="wds", workers=1, progress=False)
    with pytest.raises(SourceError, match=r"episode 'jumped'.*duration [0-9.]+e\+12 s is not within \[0, 604800\]"):
        convert([episode("jumped", [0.0, 0.02, 1e12])], tmp_path / "jumped.wds", options)
    with pytest.raises(SourceError, match=r"episode 'unstamped'.*timestamps are not finite"):
        convert([episode("unstamped", [0.0, float("nan"), 0.04])], tmp_path / "unstamped.wds", options)
    convert([episode("fine", [0.0, 0.02, 0.04])], tmp_path / "fine.wds", options)
    appending = ConvertOptions(layout="wds", workers=1, progress=False, append=True)
    with pytest.raises(SourceError, match=r"episode 'jumped'.*duration [0-9.]+e\+12 s is not within"):
        convert([episode("jumped", [0.0, 0.02, 1e12])], tmp_path / "fine.wds", appending)
    assert len(mmdata.open_store(str(tmp_path / "fine.wds"))) == 1


@pytest.mark.slow
def test_a_row_group_that_cannot_be_read_is_named_and_its_episodes_skipped_wherever_they_are_read(
    scaled, tmp_path, by_row_group
):
    store = str(with_group_damaged(scaled, tmp_path, 2, "cam_high/segments.list.element.first_frame"))
    opened = mmdata.open_store(store)
    with pytest.raises(IntegrityError, match=r"row group 2 of .*episodes.parquet \(episodes 16 to 23\) cannot be read"):
        opened.manifest.row(17)
    assert sorted(opened.damaged) == list(range(16, 24))
    assert opened.manifest.row(24)["key"] == "episode_000024"
    opened = mmdata.open_store(store)
    opened.manifest.read_ahead([3, 18, 30])  # (what a worker does ahead of its steps: it does not raise)
    assert sorted(opened.damaged) == list(range(16, 24)) and opened.manifest.row(30)["key"] == "episode_000030"

    spec = mmdata.Windows(anchor_fps=5, streams={"cam_high": mmdata.Frames(), "state": mmdata.Values()})
    with pytest.raises(SampleError, match="row group 2 of .* cannot be read"):
        list(mmdata.DataLoader(store, spec, batch_size=4, shuffle="none", num_workers=2))
    loader = mmdata.DataLoader(store, spec, batch_size=4, num_workers=2, on_error="skip")
    episodes = {int(e) for batch in loader for e in batch["episode_index"]}
    assert episodes == set(range(EPISODES)) - set(range(16, 24))
    skipped = loader.stats()["skipped"]
    assert loader.stats()["skipped_samples"] > 0 and all("row group 2" in message for message in skipped)


def test_a_small_manifest_is_read_by_the_same_row_groups_and_names_an_unreadable_one_when_the_store_opens(
    scaled, tmp_path
):
    store = str(with_group_damaged(scaled, tmp_path, 2, "cam_high/segments.list.element.first_frame"))
    opened = mmdata.open_store(store)  # (40 rows: read in one request, every row group checked now)
    assert opened.manifest.checked_whole and sorted(opened.damaged) == list(range(16, 24))
    assert "row group 2 of" in opened.damaged[16] and opened.manifest.row(24)["key"] == "episode_000024"
    with pytest.raises(IntegrityError, match=r"row group 2 of .*episodes.parquet \(episodes 16 to 23\) cannot be read"):
        opened.manifest.row(17)
    with pytest.raises(StoreError, match=r"8 episode\(s\) .* row group 2 of"):
        mmdata.DataLoader(store, STATE, batch_size=4, num_workers=0)
    loader = mmdata.DataLoader(store, STATE, batch_size=4, on_error="skip", num_workers=0)
    assert {int(e) for batch in loader for e in batch["episode_index"]} == set(range(EPISODES)) - set(range(16, 24))


@pytest.mark.slow
def test_a_row_group_whose_planning_column_cannot_be_read_is_left_out_and_verify_and_inspect_name_it(
    scaled, tmp_path, by_row_group, monkeypatch
):
    store = str(with_group_damaged(scaled, tmp_path, 1, "duration"))
    with pytest.raises(StoreError, match=r"8 episode\(s\) .* row group 1 of .* \(episodes 8 to 15\) cannot be read"):
        mmdata.DataLoader(store, STATE, batch_size=4, num_workers=0)
    loader = mmdata.DataLoader(store, STATE, batch_size=4, on_error="skip", num_workers=0)
    assert {int(e) for batch in loader for e in batch["episode_index"]} == set(range(EPISODES)) - set(range(8, 16))
    assert sorted(loader.stats()["excluded_episodes"]) == list(range(8, 16))
    monkeypatch.setenv("MMDATA_MANIFEST_EAGER_ROWS", "16")
    script = (
        "import sys; from mmdata.store import manifest_reader; manifest_reader.EAGER_ROWS = 16;"
        " from mmdata.tools.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    import subprocess
    import sys

    verified = subprocess.run([sys.executable, "-c", script, "verify", store], capture_output=True, text=True)
    assert verified.returncode == 1, verified.stderr
    assert verified.stdout.count("row group 1 of") == 8 and "Traceback" not in verified.stderr
    inspected = subprocess.run([sys.executable, "-c", script, "inspect", store], capture_output=True, text=True)
    assert inspected.returncode == 0 and "Traceback" not in inspected.stderr, inspected.stderr
    assert "8, 9, 10, 11, 12, 13, 14, 15" in inspected.stdout


@pytest.mark.slow
def test_a_manifest_range_that_comes_back_wrong_from_object_storage_is_named_by_row_group(
    scaled, by_row_group, monkeypatch
):
    pytest.importorskip("moto.server", reason="the S3 tests need moto[server] (pip install -e .[dev])")
    s3fs = pytest.importorskip("s3fs", reason="the S3 tests need s3fs (pip install -e .[dev])")
    import fsspec.config

    from tests.s3_server import S3Proxy, local_s3_bucket

    monkeypatch.setattr(manifest_reader, "EAGER_BYTES", 0)
    groups = pq.ParquetFile(scaled / "episodes.parquet").metadata
    spoiled = groups.row_group(2).column(5).data_page_offset

    def spoil(path: str, headers: dict, status: int, kept: list, body: bytes):
        first = int(headers.get("Range", "bytes=0-").split("=")[1].split("-")[0])
        if path.endswith("episodes.parquet") and first <= spoiled < first + len(body):
            at = spoiled - first
            body = body[:at] + b"\xff" * 32 + body[at + 32 :]
        return status, kept, body

    with local_s3_bucket("mmdata-spoiled") as filesystem:
        filesystem.put(str(scaled), "mmdata-spoiled/store.wds", recursive=True)
        proxy = S3Proxy(os.environ["FSSPEC_S3_ENDPOINT_URL"], rewrite=spoil)
        try:
            monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": proxy.url})
            s3fs.S3FileSystem.clear_instance_cache()
            dataset = mmdata.open_dataset("s3://mmdata-spoiled/store.wds")
            assert dataset.store.manifest.row(3)["key"] == "episode_000003"
            with pytest.raises(IntegrityError, match=r"row group 2 of .* \(episodes 16 to 23\) cannot be read"):
                dataset.read_episode(17, ["state"])
        finally:
            proxy.close()
            s3fs.S3FileSystem.clear_instance_cache()


def test_an_object_store_url_with_dot_segments_is_refused_before_any_request(tmp_path):
    for url in ("s3://bucket/../other/x.wds", "s3://bucket/a/./x.wds", "s3://bucket/a/.."):
        with pytest.raises(OptionError, match=r"has a '\.' or '\.\.' segment"):
            mmdata.open_store(url)
    refused = run_cli("inspect", "s3://bucket/../other/x.wds")
    assert refused.returncode == 2 and "segment" in refused.stderr and "Traceback" not in refused.stderr
    reader = PlainS3Reader("http://127.0.0.1:9", "us-east-1", None)
    assert reader._url("bucket", "a/../b/./c") == "http://127.0.0.1:9/bucket/a/%2E%2E/b/%2E/c"


@pytest.mark.slow
def test_a_store_naming_an_origin_that_climbs_out_of_its_filesystem_is_refused(stores, tmp_path):
    from mmdata.editing.derived import ValidationChoice, split_store
    from mmdata.editing.selection import EpisodeSelection

    source = shutil.copytree(stores["wds"], tmp_path / "robot.wds")
    train = tmp_path / "train"
    split_store(str(source), str(train), str(tmp_path / "val"), ValidationChoice(EpisodeSelection(ids=[0])))
    climbing = "../" * 40 + "robot.wds"
    document = (train / "dataset.json").read_text().replace('"../robot.wds"', f'"{climbing}"')
    (train / "dataset.json").write_text(document)
    with pytest.raises(StoreError, match="climbs 40 folders above .* out of its filesystem"):
        mmdata.open_store(str(train))


@pytest.mark.slow
@pytest.mark.parametrize("answer", ["the whole object", "a longer body", "a shorter body"])
def test_a_server_that_answers_a_byte_range_wrongly_is_named_and_never_gives_wrong_bytes(stores, monkeypatch, answer):
    pytest.importorskip("moto.server", reason="the S3 tests need moto[server] (pip install -e .[dev])")
    s3fs = pytest.importorskip("s3fs", reason="the S3 tests need s3fs (pip install -e .[dev])")
    import fsspec.config

    from tests.s3_server import S3Proxy, local_s3_bucket

    bucket = "mmdata-ranges"
    with local_s3_bucket(bucket) as filesystem:
        filesystem.put(str(stores["wds"]), f"{bucket}/store.wds", recursive=True)
        wrong = {"left": 2}  # (a longer or shorter body twice, then right: retried)

        def misbehave(path: str, headers: dict, status: int, kept: list, body: bytes):
            if status != 206 or "shards/" not in path:
                return status, kept, body
            if answer == "the whole object":
                whole = filesystem.cat_file(path.split("?")[0].lstrip("/"))
                return 200, [(k, v) for k, v in kept if k.lower() != "content-range"], whole
            if wrong["left"] > 0:
                wrong["left"] -= 1
                return status, kept, body + b"junk" if answer == "a longer body" else body[:-7]
            return status, kept, body

        proxy = S3Proxy(os.environ["FSSPEC_S3_ENDPOINT_URL"], rewrite=misbehave)
        try:
            monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": proxy.url})
            s3fs.S3FileSystem.clear_instance_cache()
            policy = mmdata.ReadPolicy(backoff_s=0.01, max_backoff_s=0.02)
            remote = mmdata.open_dataset(f"s3://{bucket}/store.wds", read_policy=policy)
            local = mmdata.open_dataset(str(stores["wds"]))
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                got = remote.read_episode(1, ["state", "cam_high"])
            expected = local.read_episode(1, ["state", "cam_high"])
            assert np.array_equal(got["state"].values, expected["state"].values)
            assert np.array_equal(got["cam_high"].values, expected["cam_high"].values)
            if answer == "the whole object":
                assert any("ignored a byte-range request" in str(w.message) for w in seen)
            else:
                assert wrong["left"] == 0
        finally:
            proxy.close()
            s3fs.S3FileSystem.clear_instance_cache()
