"""Stores are readable without mmdata: by webdataset, tar, zarr and PyAV alone."""

from __future__ import annotations

import io
import subprocess
import tarfile
import warnings

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
import webdataset as wds
import zarr


def manifest(store):
    return pq.read_table(store / "episodes.parquet").to_pylist()


def test_webdataset_library_yields_one_sample_per_episode_with_every_member(stores):
    store = stores["wds"]
    shards = sorted(str(p) for p in (store / "shards").glob("*.tar"))
    assert len(shards) > 1
    samples = list(wds.WebDataset(shards, shardshuffle=False))
    rows = manifest(store)
    assert [s["__key__"] for s in samples] == [r["key"] for r in rows]
    for sample, row in zip(samples, rows):
        expected = {m["name"].split(".", 1)[1] for m in row["members"]}
        assert set(sample) - {"__key__", "__url__", "__local_path__"} == expected
        assert sample["task.txt"].decode() == row["task"]
        assert np.load(io.BytesIO(sample["state.npy"])).shape == (row["state/count"], 14)


@pytest.mark.slow
def test_tar_lists_every_member_of_the_manifest(stores):
    store = stores["wds"]
    listed = []
    for shard in sorted((store / "shards").glob("*.tar")):
        output = subprocess.run(["tar", "-tf", str(shard)], capture_output=True, text=True, check=True).stdout
        listed += output.split()
    assert listed == [m["name"] for row in manifest(store) for m in row["members"]]


def test_manifest_offsets_are_the_members_bytes(stores):
    store = stores["wds"]
    for row in manifest(store):
        shard = store / row["shard"]
        with tarfile.open(shard) as archive:
            members = {m.name: m for m in archive.getmembers()}
        raw = shard.read_bytes()
        for member in row["members"]:
            info = members[member["name"]]
            assert (info.offset_data, info.size) == (member["offset"], member["size"])
        segment = row["cam_high/segments"][1]
        data = raw[segment["offset"] : segment["offset"] + segment["size"]]
        with tarfile.open(shard) as archive:
            name = f"{row['key']}.cam_high.00001.mp4"
            assert archive.extractfile(name).read() == data


def test_zarr_open_reads_the_store_and_episode_ends_slice_lowdim(stores, raw_dataset):
    store = stores["zarr"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        root = zarr.open(str(store), mode="r")
        ends = root["meta/episode_ends"][:]
        state = root["data/state"][:]
        action = root["data/action"][:]
        segments = root["video/cam_high"]
    starts = np.concatenate([[0], ends[:-1]])
    for row, start, end in zip(manifest(store), starts, ends):
        folder = raw_dataset / row["source"]
        assert np.array_equal(state[start:end], np.load(folder / "state.npy"))
        assert np.array_equal(action[start:end], np.load(folder / "action.npy"))
    assert segments.shape[0] == sum(len(r["cam_high/segments"]) for r in manifest(store))
    assert root["data/state"].attrs["episode_ends"] == "meta/episode_ends"


def _stored_segments(store, layout):
    if layout == "wds":
        for row in manifest(store):
            raw = (store / row["shard"]).read_bytes()
            for segment in row["cam_wrist/segments"]:
                yield segment, raw[segment["offset"] : segment["offset"] + segment["size"]]
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            array = zarr.open(str(store), mode="r")["video/cam_wrist"]
            for row in manifest(store):
                for segment in row["cam_wrist/segments"]:
                    yield segment, bytes(array[segment["offset"] : segment["offset"] + 1][0])


def test_every_segment_decodes_alone_with_pyav_and_starts_on_a_key_frame(stores):
    for layout, store in stores.items():
        for segment, data in _stored_segments(store, layout):
            with av.open(io.BytesIO(data)) as container:
                packets = [p for p in container.demux(video=0) if p.size]
            with av.open(io.BytesIO(data)) as container:
                frames = list(container.decode(video=0))
            assert packets[0].is_keyframe
            assert len(frames) == segment["num_frames"]
            assert (frames[0].width, frames[0].height) == (208, 160)
