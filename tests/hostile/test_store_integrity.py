"""Damaged or hostile stores: never wrong data, always a specific error naming the file or episode."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import mmdata
from mmdata.errors import IntegrityError, ReadError, StoreError
from mmdata.store.verification import verify_dataset
from tests.conftest import run_cli
from tests.hostile.tampering import copy_store, edit_manifest, edit_schema, flip_byte, replace_piece


@pytest.fixture
def damaged(store, tmp_path):
    """A private copy of the store of the parametrised layout."""
    return copy_store(store, tmp_path / store.name)


def _piece_file(store, piece):
    return store / piece["path"] if (store / piece["path"]).is_file() else None


def test_flipped_byte_in_a_wds_segment_is_an_integrity_error_by_default(stores, tmp_path):
    store = copy_store(stores["wds"], tmp_path / "s.wds")
    segment = mmdata.open_dataset(store).manifest.row(1)["cam_high/segments"][0]
    flip_byte(store / segment["path"], segment["offset"] + segment["size"] // 2)
    with pytest.raises(IntegrityError, match=r"shards/shard-\d+\.tar at \d+ .*checksum mismatch"):
        mmdata.open_dataset(store).frames_at(1, "cam_high", [0.1])


@pytest.mark.parametrize("column", ["state/data", "state/timestamps", "cam_high/timestamps", "audio/data"])
def test_flipped_byte_in_a_wds_piece_is_an_integrity_error(stores, tmp_path, column):
    store = copy_store(stores["wds"], tmp_path / "s.wds")
    piece = mmdata.open_dataset(store).manifest.row(0)[column]
    flip_byte(store / piece["path"], piece["offset"] + piece["size"] - 3)
    dataset = mmdata.open_dataset(store)
    with pytest.raises(IntegrityError, match="checksum mismatch"):
        dataset.read_episode(0, streams=[column.split("/")[0]])


@pytest.mark.slow
@pytest.mark.parametrize(
    "array", ["data/state/c/0/0", "timestamps/cam_high/c/0", "video/cam_high/c/0", "audio/audio/c/0"]
)
def test_flipped_byte_in_a_zarr_chunk_is_an_integrity_error(stores, tmp_path, array):
    store = copy_store(stores["zarr"], tmp_path / "s.zarr")
    flip_byte(store / array, 24)  # inside the chunk's zstd frame, or the first element's bytes
    dataset = mmdata.open_dataset(store)
    with pytest.raises(IntegrityError):
        for episode in range(len(dataset)):
            dataset.read_episode(episode)


def test_deleted_zarr_chunk_is_an_integrity_error_not_zeros(stores, tmp_path):
    store = copy_store(stores["zarr"], tmp_path / "s.zarr")
    (store / "data" / "state" / "c" / "0" / "0").unlink()
    with pytest.raises(IntegrityError, match="checksum mismatch"):
        mmdata.open_dataset(store).values_at(0, "state", [0.5])


def test_deleted_shard_fails_at_once_naming_it_and_verify_lists_its_episodes(stores, tmp_path):
    import time

    store = copy_store(stores["wds"], tmp_path / "s.wds")
    dataset = mmdata.open_dataset(store)
    shard = dataset.manifest.row(0)["shard"]
    (store / shard).unlink()
    started = time.perf_counter()
    with pytest.raises(ReadError, match=shard):
        mmdata.open_dataset(store).frames_at(0, "cam_high", [0.0])
    assert time.perf_counter() - started < 1.0, "a missing file is not retried as if transient"
    report = verify_dataset(str(store), progress=False)
    assert 0 in [failure.index for failure in report.failures]
    assert time.perf_counter() - started < 10.0


def test_open_dataset_checks_checksums_unless_told_not_to(stores, tmp_path):
    store = copy_store(stores["wds"], tmp_path / "s.wds")
    assert mmdata.open_dataset(store).pieces.verify, "open_dataset checks checksums by default"
    assert not mmdata.open_dataset(store, verify=False).pieces.verify


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(format_version=2), "format version 2"),
        (lambda d: d["streams"][1].update(fps=0), "fps is 0"),
        (lambda d: d["streams"][1].update(fps="thirty"), "fps is 'thirty', not a number"),
        (lambda d: d["streams"][1].update(width=-4), "width is -4"),
        (lambda d: d["streams"][1].update(kind="hologram"), "stream kind 'hologram'"),
        (lambda d: d["streams"][1].update(name="../../escape"), "holds '/'"),
        (lambda d: d["streams"][1].update(codec="h265"), "codec 'h265'"),
        (lambda d: d.update(streams=[]), "'streams' is not a non-empty list"),
        (lambda d: d.update(layout="tar"), "layout is 'tar'"),
        (lambda d: d.update(num_episodes="3"), "num_episodes is '3', not an integer"),
        (lambda d: d["streams"].append(dict(d["streams"][1])), "appear more than once"),
        (lambda d: d["streams"][1].update(extra_field=1), "unknown fields"),
        (lambda d: d.update(stats_file="stats.json"), "fields ['stats_file'] that no mmdata store writes"),
        (lambda d: d.update(stats="../escape.json"), "'stats' is '../escape.json', not a file name"),
    ],
    ids=[
        "version",
        "fps-zero",
        "fps-string",
        "negative-width",
        "unknown-kind",
        "name-with-slash",
        "unknown-codec",
        "no-streams",
        "unknown-layout",
        "num-episodes-string",
        "duplicate-stream",
        "unknown-field",
        "unknown-top-level-field",
        "version-file-outside",
    ],
)
def test_malformed_dataset_json_is_a_store_error_naming_the_file(damaged, change, message):
    edit_schema(damaged, change)
    with pytest.raises(StoreError, match="dataset.json") as raised:
        mmdata.open_dataset(damaged)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    "text",
    [b"", b"\xff\xfe not utf-8", b"[" * 100_000 + b"]" * 100_000, b'{"format": "mmdata", "format_version": 1}', b"0"],
    ids=["empty", "not-utf8", "deep-nesting", "no-streams", "a-number"],
)
def test_unparseable_dataset_json_is_a_store_error(damaged, text):
    (damaged / "dataset.json").write_bytes(text)
    with pytest.raises(StoreError, match="dataset.json"):
        mmdata.open_dataset(damaged)


@pytest.mark.slow
def test_a_dataset_json_of_200000_streams_is_refused_at_once_by_open_inspect_and_verify(damaged):
    import time

    document = json.loads((damaged / "dataset.json").read_text())
    template = next(s for s in document["streams"] if s["kind"] == "lowdim")
    document["streams"] = [{**template, "name": f"j{i}"} for i in range(200_000)]
    (damaged / "dataset.json").write_text(json.dumps(document, separators=(",", ":")))
    assert (damaged / "dataset.json").stat().st_size < 16 << 20, "within the size a dataset.json may have"
    started = time.perf_counter()
    with pytest.raises(StoreError, match="200000 streams; a store holds at most 4096"):
        mmdata.open_dataset(damaged)
    for command in (["inspect", str(damaged)], ["verify", str(damaged)]):
        result = run_cli(*command)
        assert result.returncode == 2 and "at most 4096" in result.stderr
    assert time.perf_counter() - started < 30.0, "refused before any per-stream work"


def test_duplicate_names_among_the_most_streams_a_store_may_hold_are_found_in_linear_time(damaged):
    import time

    from mmdata.schema import MAX_STREAMS, DatasetSchema

    document = json.loads((damaged / "dataset.json").read_text())
    template = next(s for s in document["streams"] if s["kind"] == "lowdim")
    document["streams"] = [{**template, "name": f"joint_{i % (MAX_STREAMS - 1)}"} for i in range(MAX_STREAMS)]
    started = time.perf_counter()
    with pytest.raises(StoreError, match=r"stream names \['joint_0'\] appear more than once"):
        DatasetSchema.from_json(json.dumps(document))
    assert time.perf_counter() - started < 2.0


def test_manifest_that_is_not_parquet_is_a_store_error(damaged):
    (damaged / "episodes.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(StoreError, match="episodes.parquet is not a readable Parquet file"):
        mmdata.open_dataset(damaged)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda rows: rows.append(dict(rows[-1])), "holds 4 rows but dataset.json says 3"),
        (lambda rows: rows.__delitem__(slice(None)), "holds 0 rows"),
        (lambda rows: rows.__setitem__(1, dict(rows[0])), "row 1 holds episode_index 0"),
        (lambda rows: rows[2].update(key="episode_000001"), "row 2 has key 'episode_000001'"),
    ],
    ids=["duplicated-row", "no-rows", "repeated-episode", "wrong-key"],
)
def test_manifest_rows_that_are_not_one_per_episode_are_a_store_error(damaged, change, message):
    edit_manifest(damaged, change)
    with pytest.raises(StoreError, match=message):
        mmdata.open_dataset(damaged)


def test_manifest_without_a_column_is_a_store_error(damaged):
    import pyarrow.parquet as pq

    table = pq.read_table(damaged / "episodes.parquet")
    pq.write_table(table.drop_columns(["key"]), damaged / "episodes.parquet")
    with pytest.raises(StoreError, match="lacks column 'key'"):
        mmdata.open_dataset(damaged)


@pytest.mark.parametrize(
    ("column", "change", "message"),
    [
        ("duration", lambda r: r.update(duration=1e12), "duration 1e+12 s is not within"),
        ("duration", lambda r: r.update(duration=float("nan")), "duration nan"),
        ("state/data", lambda r: r["state/data"].update(offset=-64), "negative or missing offset"),
        ("state/data", lambda r: r["state/data"].update(path="../../etc/hostname"), "names a path other than"),
        ("cam_high/segments", lambda r: r.update({"cam_high/segments": []}), "frames but no segment"),
        ("cam_high/count", lambda r: r.update({"cam_high/count": 10**9}), "hold"),
        ("state/count", lambda r: r.update({"state/count": 10**9}), "rows of"),
        ("audio/count", lambda r: r.update({"audio/count": 10**9}), "samples say otherwise"),
        ("t_end", lambda r: r.update({"state/t_end": 1e6, "duration": 1e6}), "spans"),
    ],
    ids=[
        "duration-1e12",
        "duration-nan",
        "negative-offset",
        "path-outside",
        "camera-without-segments",
        "frame-count",
        "row-count",
        "audio-count",
        "span-for-few-values",
    ],
)
@pytest.mark.slow
def test_inconsistent_manifest_row_marks_the_episode_damaged(damaged, column, change, message):
    edit_manifest(damaged, lambda rows: change(rows[1]))
    dataset = mmdata.open_dataset(damaged)
    assert list(dataset.damaged) == [1] and message in dataset.damaged[1]
    with pytest.raises(IntegrityError, match=r"episode 'episode_000001' \(row 1\)"):
        dataset.read_episode(1)
    dataset.read_episode(0)
    report = verify_dataset(str(damaged), progress=False)
    assert [failure.index for failure in report.failures] == [1]


def test_piece_path_outside_the_store_is_never_read(damaged, tmp_path):
    secret = tmp_path / "secret.npy"
    np.save(secret, np.zeros((10, 14), np.float32))
    relative = "../" * 12 + str(secret).lstrip("/")
    edit_manifest(damaged, lambda rows: rows[0]["state/data"].update(path=relative, offset=0))
    dataset = mmdata.open_dataset(damaged)
    with pytest.raises(IntegrityError, match="names a path other than"):
        dataset.values_at(0, "state", [0.0])


def test_metadata_that_is_not_json_is_an_integrity_error_when_read(damaged):
    edit_manifest(damaged, lambda rows: rows[0].update(metadata="{not json"))
    with pytest.raises(IntegrityError, match="episode 'episode_000000': its metadata"):
        mmdata.open_dataset(damaged).read_episode(0, streams=[])


def test_zarr_array_with_an_unknown_codec_is_refused_when_the_store_opens(stores, tmp_path):
    store = copy_store(stores["zarr"], tmp_path / "s.zarr")
    meta = store / "data" / "state" / "zarr.json"
    document = json.loads(meta.read_text())
    document["codecs"][1] = {"name": "blosc-secret", "configuration": {}}
    meta.write_text(json.dumps(document))
    with pytest.raises(StoreError, match=r"Zarr array 'data/state' .*codecs \['bytes', 'blosc-secret'\]"):
        mmdata.open_dataset(store)


def test_zarr_array_whose_rows_disagree_with_the_schema_is_refused(stores, tmp_path):
    store = copy_store(stores["zarr"], tmp_path / "s.zarr")
    meta = store / "data" / "state" / "zarr.json"
    document = json.loads(meta.read_text())
    document["data_type"] = "float64"
    meta.write_text(json.dumps(document))
    with pytest.raises(StoreError, match="holds float64 rows"):
        mmdata.open_dataset(store).values_at(0, "state", [0.0])


def test_segment_of_another_codec_than_declared_is_refused(stores, tmp_path):
    from fractions import Fraction

    from mmdata.codecs.video_encode import VideoEncoding, encode_segments
    from mmdata.synthetic import synthetic_frame

    store = copy_store(stores["wds"], tmp_path / "s.wds")
    frames = [synthetic_frame(i, 0, 224, 224) for i in range(32)]
    ((_, vp9),) = encode_segments(frames, Fraction(30), 224, 224, VideoEncoding("vp9", 32, 8))
    replace_piece(store, 0, "cam_high/segments", vp9, segment=0)
    with pytest.raises(mmdata.DecodeError, match="holds vp9 video, the store says h264"):
        mmdata.open_dataset(store).frames_at(0, "cam_high", [0.0])


def test_timestamps_that_do_not_increase_are_an_integrity_error(stores, tmp_path):
    from mmdata.codecs.lowdim import encode_npy

    store = copy_store(stores["wds"], tmp_path / "s.wds")
    row = mmdata.open_dataset(store).manifest.row(0)
    times = np.zeros(row["cam_high/count"])
    replace_piece(store, 0, "cam_high/timestamps", encode_npy(times))
    with pytest.raises(IntegrityError, match="timestamps do not increase"):
        mmdata.open_dataset(store).frames_at(0, "cam_high", [0.0])


def test_npy_header_declaring_more_rows_than_the_manifest_is_refused_before_allocating(stores, tmp_path):
    store = copy_store(stores["wds"], tmp_path / "s.wds")
    header = b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (100000000000, 14), }"
    header = header.ljust(10 + 118, b" ") + b"\n"
    header = header[:8] + (len(header) - 10).to_bytes(2, "little") + header[10:]
    count = mmdata.open_dataset(store).manifest.row(0)["state/count"]
    replace_piece(store, 0, "state/data", header + bytes(count * 56))
    with pytest.raises(IntegrityError, match=r"shape \(100000000000, 14\)"):
        mmdata.open_dataset(store).values_at(0, "state", [0.0])


@pytest.mark.slow
def test_inspect_and_verify_report_a_malformed_store_in_one_line(damaged):
    from tests.conftest import run_cli

    shutil.copy(damaged / "episodes.parquet", damaged / "backup.parquet")
    (damaged / "episodes.parquet").write_bytes(b"garbage")
    for command in ("inspect", "verify"):
        result = run_cli(command, str(damaged))
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith(f"mmdata {command}: error:") and "Traceback" not in result.stderr
