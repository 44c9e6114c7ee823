"""The align stage (`loading.aligning.Aligner`): each stream of a planned sample at the spec's times, from the
sample's own source. A camera's times map to its nearest stored frames (times outside the episode clamp and are
padding), a stream the source lacks is padding of the shape every source shares, a sequence reads on its grid."""

from __future__ import annotations

import numpy as np

import mmdata
from mmdata.errors import IntegrityError
from mmdata.loading.aligning import Aligner
from mmdata.planning.mixture import Filler, OpenSource
from mmdata.planning.samples import SampleRef

WINDOWS = mmdata.Windows(
    anchor_fps=10,
    streams={"cam_high": mmdata.Frames(offsets=[-0.5, 0.0, 0.04]), "state": mmdata.Values(offsets=[-0.5, 0.0])},
)


def _sample(start: float, end: float | None = None) -> SampleRef:
    return SampleRef(0, 0, "episode", "shard", start, start if end is None else end, 0, 1)


def _aligner(stores, spec, streams=("cam_high", "state")) -> Aligner:
    store = mmdata.open_store(stores["wds"])
    source = OpenSource(store, "store", {name: name for name in streams})
    state = store.schema.stream("state")
    return Aligner([source], spec, {"state": Filler(tuple(state.shape), np.dtype(state.dtype)), "cam_high": None})


def test_a_cameras_times_map_to_the_nearest_stored_frames_and_times_before_the_episode_are_padding(stores):
    aligner = _aligner(stores, WINDOWS)
    plan = aligner.frames(_sample(0.2), "cam_high", WINDOWS.streams["cam_high"])
    assert np.allclose(plan.timestamps, [0.0, 6 / 30, 7 / 30], atol=1e-3), "0.24 s is nearest frame 7 at 30 fps"
    assert plan.is_pad.tolist() == [True, False, False], "t=-0.3 s lies before the episode: its first frame, padded"
    assert not any(request.data for request in plan.requests), "aligning reads no segment"


def test_values_of_a_stream_the_source_lacks_are_padding_of_the_shape_every_source_shares(stores):
    aligner = _aligner(stores, WINDOWS, streams=("cam_high",))
    values, is_pad = aligner.values(_sample(0.2), "state", WINDOWS.streams["state"])
    assert values.shape == (2, *aligner.fillers["state"].shape) and not values.any()
    assert is_pad.all()


def test_a_sequence_reads_each_stream_on_its_own_grid_over_the_sample_span(stores):
    spec = mmdata.Sequences(fps=10, streams={"cam_high": mmdata.Frames(), "state": mmdata.Values(rate=20)})
    aligner = _aligner(stores, spec)
    sample = _sample(1.0, 1.5)
    assert np.allclose(aligner.times(sample, "cam_high", spec.streams["cam_high"]), [1.0, 1.1, 1.2, 1.3, 1.4])
    assert len(aligner.times(sample, "state", spec.streams["state"])) == 10
    values, is_pad = aligner.values(sample, "state", spec.streams["state"])
    assert len(values) == 10 and not is_pad.any()


def test_a_micro_batchs_values_read_once_per_episode_are_each_samples_own_and_a_failing_episode_is_left_to_read_alone(
    stores, monkeypatch
):
    aligner = _aligner(stores, WINDOWS)
    store = aligner.sources[0].store
    episodes = [store.manifest.row(row)["key"] for row in range(2)]
    samples = [SampleRef(i, row, episodes[row], "shard", start, start, 0, 1) for i, (row, start) in
               enumerate([(0, 0.2), (1, 0.3), (0, 1.0), (0, 0.0), (1, 2.5)])]  # fmt: skip
    stream = WINDOWS.streams["state"]
    together = aligner.values_of(samples, "state", stream)
    for sample, found in zip(samples, together):
        alone = aligner.values(sample, "state", stream)
        assert found is not None and np.array_equal(found[0], alone[0]) and np.array_equal(found[1], alone[1])
    values_at = store.values_at

    def damaged_second_episode(index, *args, **kwargs):
        if index == 1:
            raise IntegrityError("its values are damaged")
        return values_at(index, *args, **kwargs)

    monkeypatch.setattr(store, "values_at", damaged_second_episode)
    found = aligner.values_of(samples, "state", stream)
    assert [f is None for f in found] == [False, True, False, False, True]
