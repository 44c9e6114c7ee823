"""Streams on requested times: frames by timestamp, low-dim interpolation, audio ranges, pad masks."""

from __future__ import annotations

import numpy as np
import pytest

import mmdata
from mmdata.codecs.align import frame_indices_at, values_at
from mmdata.codecs.audio import AudioClip, as_float, decode_audio
from mmdata.codecs.audio_features import mel_spectrogram
from mmdata.errors import AlignmentError, MissingDependencyError
from mmdata.synthetic import read_index_stripe
from tests.conftest import VFR_TIMES


def stripes(frames) -> list[int]:
    return [read_index_stripe(frame) for frame in frames]


def test_frames_at_times_cross_a_segment_boundary(store):
    dataset = mmdata.open_dataset(str(store))
    segment = dataset.schema.stream("cam_high").segment_frames
    times = np.arange(segment - 3, segment + 3) / 30.0
    clip = dataset.frames_at(0, "cam_high", times)
    assert stripes(clip.values) == list(range(segment - 3, segment + 3))
    assert len({r.where.segment for r in dataset.plan_frames(0, "cam_high", times).requests}) == 2
    assert np.allclose(clip.timestamps, times) and not clip.is_pad.any()


def test_frames_at_repeated_and_unordered_times_decode_each_frame_once(store):
    dataset = mmdata.open_dataset(str(store))
    times = [0.5, 0.1, 0.5, 0.0]
    plan = dataset.plan_frames(0, "cam_wrist", times)
    assert sum(len(r.frames) for r in plan.requests) == 3
    assert stripes(dataset.frames_at(0, "cam_wrist", times).values) == [15, 3, 15, 0]


def test_frames_at_snaps_to_the_nearest_frame_within_tolerance(store):
    dataset = mmdata.open_dataset(str(store))
    assert stripes(dataset.frames_at(1, "cam_high", [0.34, 0.351]).values) == [10, 11]
    with pytest.raises(AlignmentError) as error:
        dataset.frames_at(1, "cam_high", [0.35], tolerance=0.001)
    message = str(error.value)
    assert "episode 'episode_000001', stream 'cam_high'" in message
    assert "no frame within 0.001 s of t=0.350000 s; the nearest is frame 10 at t=0.333333 s" in message


def test_frames_outside_the_episode_clamp_to_its_edges_and_are_flagged(store):
    dataset = mmdata.open_dataset(str(store))
    count = dataset.manifest.row(0)["cam_high/count"]
    clip = dataset.frames_at(0, "cam_high", [-0.5, 0.0, count / 30.0 + 1.0])
    assert stripes(clip.values) == [0, 0, count - 1]
    assert clip.is_pad.tolist() == [True, False, True]


def test_variable_frame_rate_frames_are_found_by_timestamp_not_index(vfr_store):
    dataset = mmdata.open_dataset(str(vfr_store))
    picks = [3, 4, 5, 17, 40, 58]
    clip = dataset.frames_at(0, "cam", VFR_TIMES[picks] + 0.004, tolerance=0.005)
    assert stripes(clip.values) == picks
    index_arithmetic = np.round(VFR_TIMES[picks] * dataset.schema.stream("cam").fps).astype(int)
    assert index_arithmetic.tolist() != picks, "a constant-rate guess would pick other frames"
    with pytest.raises(AlignmentError, match="nearest is frame 3 at t=0.090000 s"):
        dataset.frames_at(0, "cam", [VFR_TIMES[3] + 0.012], tolerance=0.005)


@pytest.mark.parametrize("clamp", [True, False])
def test_frame_indices_are_the_nearest_frames_flagged_outside_the_episode_and_refused_beyond_tolerance(clamp):
    rng = np.random.default_rng(4)
    for _ in range(200):
        timestamps = np.cumsum(rng.uniform(0.01, 0.05, rng.integers(1, 40)))
        times = rng.uniform(timestamps[0] - 0.2, timestamps[-1] + 0.2, rng.integers(1, 6))
        tolerance = float(rng.uniform(0.005, 0.3))
        pad = (times < timestamps[0] - 1e-6) | (times > timestamps[-1] + 1e-6)
        at = np.clip(times, timestamps[0], timestamps[-1]) if clamp else times
        distance = np.abs(at[:, None] - timestamps[None, :])
        nearest = distance.argmin(axis=1)  # ties go to the earlier frame
        off = distance[np.arange(len(at)), nearest] > tolerance + 1e-6
        if off.any():
            first = int(np.flatnonzero(off)[0])
            with pytest.raises(AlignmentError, match=f"{off.sum()} of {len(times)} requested times are off") as error:
                frame_indices_at(timestamps, times, tolerance, episode="e", stream="cam", clamp_to_episode=clamp)
            assert f"t={times[first]:.6f} s; the nearest is frame {nearest[first]} " in str(error.value)
            continue
        indices, is_pad = frame_indices_at(
            timestamps, times, tolerance, episode="e", stream="cam", clamp_to_episode=clamp
        )
        assert indices.tolist() == nearest.tolist()
        assert is_pad.tolist() == (pad if clamp else np.zeros(len(times), bool)).tolist()


def test_values_at_interpolation_modes_match_hand_computed_values():
    timestamps = np.array([0.0, 0.1, 0.2])
    values = np.array([[0.0, 1.0], [10.0, 3.0], [20.0, 2.0]], dtype=np.float32)
    times = np.array([0.05, 0.149, 0.2, -0.1, 0.3, 0.1])
    nearest, pad = values_at(timestamps, values, times, "nearest")
    assert nearest[:, 0].tolist() == [0, 10, 20, 0, 20, 10]
    previous, _ = values_at(timestamps, values, times, "previous")
    assert previous[:, 0].tolist() == [0, 10, 20, 0, 20, 10]
    assert values_at(timestamps, values, np.array([0.199]), "previous")[0][0, 0] == 10
    linear, _ = values_at(timestamps, values, times, "linear")
    assert np.allclose(linear[:, 0], [5.0, 14.9, 20, 0, 20, 10], atol=1e-5)
    assert np.allclose(linear[:, 1], [2.0, 3 - 0.49, 2, 1, 2, 3], atol=1e-5)
    assert linear.dtype == np.float32
    assert pad.tolist() == [False, False, False, True, True, False]


def test_linear_interpolation_of_integer_values_returns_float():
    result, _ = values_at(np.array([0.0, 1.0]), np.array([0, 10], dtype=np.int32), np.array([0.25]), "linear")
    assert result.dtype == np.float32 and result[0] == pytest.approx(2.5)


def test_values_at_stored_timestamps_are_the_stored_values(store):
    dataset = mmdata.open_dataset(str(store))
    stored = dataset.read_episode(2, streams=["state"])["state"]
    picked = dataset.values_at(2, "state", stored.timestamps[5:9], "previous")
    assert np.array_equal(picked.values, stored.values[5:9])
    held = dataset.values_at(2, "state", stored.timestamps[5:9] + 0.015, "previous")
    assert np.array_equal(held.values, stored.values[5:9]), "zero-order hold keeps the last value"
    edges = dataset.values_at(2, "action", [-1.0, stored.timestamps[-1] + 1.0])
    assert edges.is_pad.tolist() == [True, True]


def test_audio_between_is_sample_exact_and_windows_tile(store, raw_dataset):
    dataset = mmdata.open_dataset(str(store))
    source, _ = decode_audio(str(raw_dataset / dataset.manifest.row(0)["source"] / "audio.wav"))
    window = dataset.audio_between(0, "audio", 0.25, 0.75)
    assert window.values.dtype == np.float32, "float32 in [-1, 1] whatever the stored sample type"
    assert np.array_equal(window.values, as_float(source.samples[4000:12000]))
    assert window.timestamps[0] == pytest.approx(0.25) and not window.is_pad.any()
    halves = [dataset.audio_between(0, "audio", a, b).values for a, b in ((0.25, 0.5), (0.5, 0.75))]
    assert np.array_equal(np.concatenate(halves), window.values)


def test_audio_outside_the_recording_is_silence_flagged_as_pad(store, raw_dataset):
    dataset = mmdata.open_dataset(str(store))
    source, _ = decode_audio(str(raw_dataset / dataset.manifest.row(0)["source"] / "audio.wav"))
    window = dataset.audio_between(0, "audio", -0.01, 0.01)
    assert len(window.values) == 320 and window.is_pad.tolist() == [True] * 160 + [False] * 160
    assert not window.values[:160].any() and np.array_equal(window.values[160:], as_float(source.samples[:160]))


def test_audio_resampled_and_downmixed_on_request(store):
    dataset = mmdata.open_dataset(str(store))
    native = dataset.audio_between(0, "audio", 0.5, 1.0)
    resampled = dataset.audio_between(0, "audio", 0.5, 1.0, sample_rate=8000, mono=True)
    assert resampled.values.shape == (4000, 1) and resampled.values.dtype == np.float32
    spectrum = np.abs(np.fft.rfft(resampled.values[:, 0]))
    native_spectrum = np.abs(np.fft.rfft(native.values[:, 0].astype(np.float32)))
    peak = np.argmax(spectrum) * 8000 / 4000
    assert peak == pytest.approx(np.argmax(native_spectrum) * 16000 / 8000, abs=4), "the tone survives resampling"


def test_mel_spectrogram_needs_torchaudio_and_says_so(store):
    clip = AudioClip(np.zeros((1600, 1), np.int16), 16000)
    try:
        import torchaudio  # noqa: F401
    except ImportError:
        with pytest.raises(MissingDependencyError, match=r"pip install 'mmdata\[audio\]'"):
            mel_spectrogram(clip)
    else:
        assert tuple(mel_spectrogram(clip, n_mels=40).shape) == (1, 40, 11)
