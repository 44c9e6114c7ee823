"""A large manifest is read from its footer, by column for planning and by row group for rows (those a loader will read
soon read ahead together), each row checked before it is first read; a loader over it gives the batches it gives
over the manifest read whole, locally and from object storage, where opening it reads a few byte ranges rather than
the file."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import mmdata
from mmdata.errors import IntegrityError
from mmdata.store import manifest_reader
from tests.conftest import EPISODES, GROUP_ROWS
from tests.test_loader import assert_same_batches

SPEC = mmdata.Windows(anchor_fps=5, streams={"cam_high": mmdata.Frames(offsets=[-0.1, 0.0]), "state": mmdata.Values()})


def test_a_large_manifest_opens_from_its_footer_and_reads_each_row_as_the_whole_one_does(scaled, by_row_group):
    lazy = mmdata.open_dataset(str(scaled)).store
    assert pq.ParquetFile(scaled / "episodes.parquet").num_row_groups == EPISODES // GROUP_ROWS
    assert not lazy.manifest.checked_whole and len(lazy) == EPISODES
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(manifest_reader, "EAGER_ROWS", 1 << 16)
        whole = mmdata.open_dataset(str(scaled)).store
    assert whole.manifest.checked_whole
    for index in (0, 39, 17, 8, 7):
        assert lazy.manifest.row(index) == whole.manifest.row(index)
    columns = lazy.columns(["duration", "shard"])
    assert columns.column("duration").to_pylist() == whole.table.column("duration").to_pylist()
    assert columns.column("shard").to_pylist() == whole.table.column("shard").to_pylist()
    assert lazy.table.equals(whole.table)


def test_a_damaged_row_of_a_large_manifest_is_found_when_its_row_group_is_read(scaled, tmp_path, by_row_group):
    store = mmdata.open_dataset(str(damaged_copy(scaled, tmp_path, 21))).store
    assert store.damaged == {}, "nothing of row group 2 was read yet"
    assert store.manifest.row(3)["key"] == "episode_000003"
    with pytest.raises(IntegrityError, match="episode_000021"):
        store.manifest.row(21)
    assert list(store.damaged) == [21]
    assert store.manifest.row(22)["key"] == "episode_000022", "the rest of the row group reads"


def damaged_copy(scaled: Path, folder: Path, row: int) -> Path:
    """The scaled store with row `row`'s camera count made negative: a row the checks flag."""
    damaged = folder / "damaged.wds"
    damaged.mkdir()
    for entry in scaled.iterdir():
        if entry.name != "episodes.parquet":
            (damaged / entry.name).symlink_to(entry.resolve(), target_is_directory=entry.is_dir())
    table = pq.read_table(scaled / "episodes.parquet")
    counts = table.column("cam_high/count").to_pylist()
    counts[row] = -1
    table = table.set_column(table.schema.get_field_index("cam_high/count"), "cam_high/count", pa.array(counts))
    pq.write_table(table, damaged / "episodes.parquet", row_group_size=GROUP_ROWS)
    return damaged


def test_rows_are_checked_alone_until_several_of_their_group_are_read_then_with_the_whole_group(
    scaled, tmp_path, by_row_group
):
    store = mmdata.open_dataset(str(damaged_copy(scaled, tmp_path, 21))).store
    for index in range(16, 16 + manifest_reader.ROWS_CHECKED_ALONE):
        store.manifest.row(index)
    assert store.damaged == {}, "rows checked alone say nothing of row 21"
    store.manifest.row(20)
    assert list(store.damaged) == [21], "the next row of the group has the whole group checked"


def test_rows_read_ahead_are_the_rows_read_one_by_one_each_row_group_read_once(
    scaled, tmp_path, by_row_group, monkeypatch
):
    store = mmdata.open_dataset(str(damaged_copy(scaled, tmp_path, 21))).store
    wanted = [3, 39, 17, 21, 8, 7, 18, 3]
    one_by_one = mmdata.open_dataset(str(scaled)).store
    expected = {index: one_by_one.manifest.row(index) for index in set(wanted) - {21}}
    read = []
    original = manifest_reader.pq.ParquetFile.read_row_group
    monkeypatch.setattr(
        manifest_reader.pq.ParquetFile,
        "read_row_group",
        lambda self, number, *args, **kwargs: read.append(number) or original(self, number, *args, **kwargs),
    )
    store.manifest.read_ahead(wanted)
    assert sorted(read) == [0, 1, 2, 4] and list(store.damaged) == [21]
    for index, row in expected.items():
        assert store.manifest.row(index) == row
    assert sorted(read) == [0, 1, 2, 4], "the rows read ahead are kept: no row group is read again"
    with pytest.raises(IntegrityError, match="episode_000021"):
        store.manifest.row(21)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_over_a_large_manifest_gives_the_batches_it_gives_over_the_whole_one(scaled, workers, monkeypatch):
    whole = list(mmdata.DataLoader(str(scaled), SPEC, batch_size=4, num_workers=workers, seed=2))
    monkeypatch.setattr(manifest_reader, "EAGER_ROWS", 16)
    dataset = mmdata.open_dataset(str(scaled))
    assert not dataset.store.manifest.checked_whole
    lazy = list(mmdata.DataLoader(dataset, SPEC, batch_size=4, num_workers=workers, seed=2))
    assert_same_batches(lazy, whole)


@pytest.mark.slow
def test_a_large_manifest_in_object_storage_opens_with_a_few_byte_ranges(scaled, tmp_path, monkeypatch):
    pytest.importorskip("moto.server", reason="the S3 tests need moto[server] (pip install -e .[dev])")
    s3fs = pytest.importorskip("s3fs", reason="the S3 tests need s3fs (pip install -e .[dev])")
    import fsspec.config

    from tests.s3_server import S3Proxy, local_s3_bucket

    monkeypatch.setattr(manifest_reader, "EAGER_BYTES", 0)  # read by range whatever its size
    monkeypatch.setattr(manifest_reader, "EAGER_ROWS", 16)
    with local_s3_bucket("mmdata-large") as filesystem:
        filesystem.put(str(scaled), "mmdata-large/store.wds", recursive=True)
        proxy = S3Proxy(os.environ["FSSPEC_S3_ENDPOINT_URL"])
        try:
            monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": proxy.url})
            s3fs.S3FileSystem.clear_instance_cache()
            store = mmdata.open_dataset("s3://mmdata-large/store.wds").store
            opened = proxy.ranged
            row = store.manifest.row(30)
            read_row = proxy.ranged - opened
        finally:
            proxy.close()
            s3fs.S3FileSystem.clear_instance_cache()
    assert not store.manifest.checked_whole
    assert row["key"] == "episode_000030"
    assert 1 <= opened <= 4, f"opening read {opened} byte ranges"
    assert read_row == 1, f"a row group read {read_row} byte ranges, not its one span"
