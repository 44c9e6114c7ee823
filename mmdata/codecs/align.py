"""Put streams with their own clocks on requested times: frames by nearest timestamp, low-dim
values by nearest / previous / linear, audio by sample range. Timestamps, never index arithmetic,
so variable-frame-rate sources line up too.

Times outside an episode clamp to its edge and are flagged in an `is_pad` mask, as LeRobot's
`delta_timestamps` do (`<stream>_is_pad`).
"""

from __future__ import annotations

import math
from typing import Literal

import numba
import numpy as np

from mmdata.errors import AlignmentError

Interpolation = Literal["nearest", "previous", "linear"]
INTERPOLATIONS = ("nearest", "previous", "linear")
# Times within a microsecond of a stored one count as at it (float32-derived times are off by ~1e-7 s).
_EDGE = 1e-6


@numba.njit(cache=True, nogil=True)
def pad_mask(timestamps: np.ndarray, times: np.ndarray) -> np.ndarray:
    """True where a requested time lies before the first or after the last stored timestamp."""
    return (times < timestamps[0] - _EDGE) | (times > timestamps[-1] + _EDGE)


@numba.njit(cache=True, nogil=True)
def clamped(timestamps: np.ndarray, times: np.ndarray) -> np.ndarray:
    """The requested times moved inside the stored span (to its first or last timestamp)."""
    return np.minimum(np.maximum(times, timestamps[0]), timestamps[-1])


def nearest_indices(timestamps: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Index of the stored timestamp nearest each requested time (ties go to the earlier one)."""
    return _nearest(timestamps, np.asarray(times, dtype=np.float64))


@numba.njit(cache=True, nogil=True)
def _nearest(timestamps: np.ndarray, times: np.ndarray) -> np.ndarray:
    # A window asks a handful of times: a compiled loop, not a dozen small-array numpy calls.
    last = len(timestamps) - 1
    right = np.searchsorted(timestamps, times)
    found = np.empty(len(times), np.int64)
    for i in range(len(times)):
        after = min(max(right[i], 0), last)
        before = max(after - 1, 0)
        found[i] = before if abs(times[i] - timestamps[before]) <= abs(timestamps[after] - times[i]) else after
    return found


def frame_indices_at(
    timestamps: np.ndarray,
    times: np.ndarray,
    tolerance: float,
    *,
    episode: str,
    stream: str,
    clamp_to_episode: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """(frame index, is_pad) for each requested time, by the stored frame timestamps.

    A time inside the episode must have a frame within `tolerance` seconds; a time outside it is
    clamped to the first or last frame and flagged, unless `clamp_to_episode` is False, in which
    case it too must be within tolerance.
    """
    times = np.asarray(times, dtype=np.float64)
    if len(timestamps) == 0:
        raise AlignmentError(f"episode '{episode}', stream '{stream}' holds no frames")
    indices, is_pad, outside, first_outside = _frames_at(
        np.asarray(timestamps, dtype=np.float64), times, float(tolerance) + _EDGE, clamp_to_episode
    )
    if outside:
        nearest = int(indices[first_outside])
        raise AlignmentError(
            f"episode '{episode}', stream '{stream}': no frame within {tolerance:g} s of"
            f" t={times[first_outside]:.6f} s; the nearest is frame {nearest} at t={timestamps[nearest]:.6f} s"
            f" ({outside} of {len(times)} requested times are off; raise the tolerance or request times"
            f" the stream was recorded at)"
        )
    return indices, is_pad


@numba.njit(cache=True, nogil=True)
def _frames_at(
    timestamps: np.ndarray, times: np.ndarray, limit: float, clamp: bool
) -> tuple[np.ndarray, np.ndarray, int, int]:
    # `frame_indices_at` in one compiled pass (a sample asks a handful of times): the nearest frame of each time
    # (clamped to the episode and flagged when `clamp`), how many lie further than `limit` and the first of them.
    is_pad = pad_mask(timestamps, times) if clamp else np.zeros(len(times), np.bool_)
    at = clamped(timestamps, times) if clamp else times
    indices = _nearest(timestamps, at)
    outside, first_outside = 0, -1
    for i in range(len(times)):
        if abs(timestamps[indices[i]] - at[i]) > limit:
            if outside == 0:
                first_outside = i
            outside += 1
    return indices, is_pad, outside, first_outside


def values_at(
    timestamps: np.ndarray, values: np.ndarray, times: np.ndarray, mode: Interpolation = "nearest"
) -> tuple[np.ndarray, np.ndarray]:
    """(values, is_pad) of a low-dim stream at `times`.

    "nearest" takes the closest sample, "previous" the last one at or before the time
    (zero-order hold, what a controller saw), "linear" interpolates between the two neighbours
    (float output). Times outside the stream clamp to its first or last value.
    """
    if mode not in INTERPOLATIONS:
        raise ValueError(f"interpolation '{mode}' is not one of {', '.join(INTERPOLATIONS)}")
    times = np.asarray(times, dtype=np.float64)
    if len(timestamps) == 0:
        raise AlignmentError("the stream holds no values in this episode")
    is_pad = pad_mask(timestamps, times)
    inside = clamped(timestamps, times)
    if mode == "nearest":
        return values[nearest_indices(timestamps, inside)], is_pad
    after = np.searchsorted(timestamps, inside + _EDGE, side="right")
    before = np.clip(after - 1, 0, len(timestamps) - 1)
    if mode == "previous":
        return values[before], is_pad
    following = np.clip(before + 1, 0, len(timestamps) - 1)
    span = timestamps[following] - timestamps[before]
    weight = np.divide(inside - timestamps[before], span, out=np.zeros_like(inside), where=span > 0)
    weight = weight.reshape((-1,) + (1,) * (values.ndim - 1))
    low = values[before].astype(np.float64)
    high = values[following].astype(np.float64)
    result = low + weight * (high - low)
    dtype = values.dtype if np.issubdtype(values.dtype, np.floating) else np.float32
    return result.astype(dtype), is_pad


def sample_range(t_start: float, sample_rate: int, t0: float, t1: float) -> tuple[int, int]:
    """[first, last) sample indices (relative to a clip starting at `t_start`) covering [t0, t1).

    Sample k is at t_start + k / rate; the range holds exactly the samples with t0 <= t < t1,
    so adjacent windows share no sample and miss none.
    """
    first = math.ceil((t0 - t_start) * sample_rate - 1e-6)
    last = math.ceil((t1 - t_start) * sample_rate - 1e-6)
    return first, max(first, last)
