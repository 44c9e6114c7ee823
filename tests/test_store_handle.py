"""The store handle (`store.handle.Store`): a camera's frames aligned from the stored timestamps alone and read
later, each wanted frame once; the pieces a manifest row points to; low-dim values at any times, padded outside
the recording; spans of stored values. Both layouts answer alike."""

from __future__ import annotations

import numpy as np
import pytest

import mmdata
from mmdata.codecs.decoders.pyav_decoder import PyAvDecoder


@pytest.fixture(params=["wds", "zarr"])
def handle(request, stores) -> mmdata.Store:
    return mmdata.open_store(stores[request.param])


def test_aligning_reads_no_segment_and_reading_the_aligned_plan_gives_what_planning_gives(handle):
    times = [0.0, 0.5, 0.5, 1.2, 0.51]
    aligned = handle.align_frames(1, "cam_high", times)
    assert not aligned.is_read and all(not request.data for request in aligned.requests)
    read = handle.read_segments(aligned)
    planned = handle.plan_frames(1, "cam_high", times)
    assert read.is_read and [r.frames for r in read.requests] == [r.frames for r in planned.requests]
    assert [r.data for r in read.requests] == [r.data for r in planned.requests]
    wanted = sum(len(request.frames) for request in read.requests)
    assert wanted == 3, "0.5 s and 0.51 s are one frame at 30 fps: each wanted frame is asked once"
    frames = np.concatenate(PyAvDecoder().decode(read.requests))
    assert frames[read.positions].shape[0] == len(times), "positions put every asked time's frame back in order"
    assert np.array_equal(frames[read.positions[1]], frames[read.positions[2]])


def test_a_rows_pieces_are_the_timestamps_and_data_it_points_to_for_the_streams_asked(handle):
    pieces = handle.row_pieces(0, ["state"])
    row = handle.manifest.row(0)
    expected = [row[column]["path"] for column in ("state/timestamps", "state/data") if row.get(column) is not None]
    assert [piece.path for piece in pieces] == expected and pieces
    assert handle.row_pieces(0, []) == []


def test_values_at_times_outside_the_recording_are_its_edge_values_flagged_as_padding(handle):
    duration = float(handle.manifest.row(0)["duration"])
    inside = handle.lowdim_span(0, "state", 0.0, duration + 1)
    data = handle.values_at(0, "state", [-1.0, 0.0, duration + 1.0])
    assert data.is_pad.tolist() == [True, False, True]
    assert np.array_equal(data.values[0], inside.values[0]) and np.array_equal(data.values[2], inside.values[-1])


def test_a_span_of_stored_values_holds_exactly_those_stamped_inside_it(handle):
    span = handle.lowdim_span(0, "state", 0.25, 0.75)
    assert len(span.values) == len(span.timestamps) > 0
    assert (span.timestamps >= 0.25).all() and (span.timestamps < 0.75).all()
    every = handle.lowdim_span(0, "state", -1.0, 1e9)
    assert np.count_nonzero((every.timestamps >= 0.25) & (every.timestamps < 0.75)) == len(span.timestamps)


@pytest.mark.parametrize("layout", ["wds", "zarr"])
def test_a_store_a_user_opens_reads_an_episodes_timestamps_once_for_repeated_reads(stores, layout):
    """Per-sample reads (`frames_at`, `values_at`) would otherwise read and verify the episode's timestamps at
    every call; `cache_bytes=0` still turns the cache off."""
    for opened in (mmdata.open_store(stores[layout]), mmdata.open_dataset(stores[layout]).store):
        opened.align_frames(1, "cam_high", [0.5])
        opened.values_at(1, "state", [0.5])
        before = opened.pieces.bytes_read
        for time in (0.1, 0.7, 1.3):
            opened.align_frames(1, "cam_high", [time])
            opened.values_at(1, "state", [time])
        assert opened.pieces.bytes_read == before
    uncached = mmdata.open_store(stores[layout], cache_bytes=0)
    uncached.values_at(1, "state", [0.5])
    before = uncached.pieces.bytes_read
    uncached.values_at(1, "state", [0.7])
    assert uncached.pieces.bytes_read > before
