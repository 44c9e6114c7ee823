"""The decode floor of measured steps: the CPU time that decoding the frames those steps delivered takes when each
is decoded once, in order, converted to RGB at the size it was delivered at. It is the least any loader of these
samples must spend on video, so a loader's CPU per sample is reported against it (`mmdata bench`).

The floor is the CPU per frame of decoding the segments that hold those frames whole and in order (up to
`SEGMENTS_TIMED` of them, spread over the samples), times the frames delivered. Decoding only the delivered
frames of a few scattered samples would also count the reference frames before each, which a loader reading all
of a segment's samples decodes once for them all: a short measurement would then put the floor above the loader.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable

import numpy as np

from mmdata.codecs.decoders.pyav_decoder import PyAvDecoder
from mmdata.codecs.decoders.requests import ClipRequest
from mmdata.codecs.geometry import frame_geometry
from mmdata.loading.aligning import sample_times
from mmdata.loading.dataloader import DataLoader
from mmdata.planning.specs import Frames

# The most segments whose decoding is timed for the CPU per frame (a sample of them, spread over the samples).
SEGMENTS_TIMED = 64


@dataclasses.dataclass(frozen=True)
class DecodeFloor:
    """What decoding the delivered frames once took: CPU seconds, frames decoded, samples they serve."""

    cpu_seconds: float
    frames: int
    samples: int

    @property
    def ms_per_sample(self) -> float:
        return 1000 * self.cpu_seconds / max(1, self.samples)


def decode_floor(loader: DataLoader, sample_indices: Iterable[int]) -> DecodeFloor | None:
    """The floor of the samples `sample_indices` of `loader`: per camera of each source, the frames they deliver
    (each counted once) times the process CPU per frame of decoding whole segments holding them, with PyAV on
    this thread, one segment at a time (the segments read first, the decoder warmed up). None where the spec
    delivers no frames."""
    indices = np.unique(np.fromiter(sample_indices, np.int64))
    cameras = _floor_requests(loader, indices)
    if not cameras:
        return None
    decoder = PyAvDecoder()
    decoder.decode([_whole(next(iter(cameras.values()))[0])])
    share = max(1, SEGMENTS_TIMED // len(cameras))
    cpu_seconds, delivered = 0.0, 0
    for requests in cameras.values():
        picks = np.unique(np.linspace(0, len(requests) - 1, min(len(requests), share)).round().astype(int))
        started, decoded = time.process_time(), 0
        for pick in picks.tolist():  # one segment at a time: the floor holds no more frames than one segment's
            decoded += sum(len(output) for output in decoder.decode([_whole(requests[pick])]))
        frames = sum(len(request.frames) for request in requests)
        cpu_seconds += (time.process_time() - started) / max(1, decoded) * frames
        delivered += frames
    return DecodeFloor(cpu_seconds, delivered, len(indices))


def _whole(request: ClipRequest) -> ClipRequest:
    """The request for every frame of the segment `request` reads (one packet per frame in its index)."""
    if request.packets is None:
        return request
    return dataclasses.replace(request, frames=tuple(range(len(request.packets))))


def _floor_requests(loader: DataLoader, indices: np.ndarray) -> dict[tuple[int, str], list[ClipRequest]]:
    """Per source and camera, episode by episode in order: the segment requests for the frames the samples
    deliver (none empty)."""
    spec = loader.spec
    cameras = {name: stream for name, stream in spec.streams.items() if isinstance(stream, Frames)}
    wanted: dict[tuple[int, str, int], list[np.ndarray]] = {}
    sources, episodes, starts, ends = loader.samples.locate(indices)
    for source, episode, start, end in zip(sources.tolist(), episodes.tolist(), starts.tolist(), ends.tolist()):
        for name, stream in cameras.items():
            stored = loader.sources[source].streams.get(name)
            if stored is None:
                continue
            times = sample_times(spec, name, stream, float(start), float(end))
            wanted.setdefault((source, name, episode), []).append(times)
    requests: dict[tuple[int, str], list[ClipRequest]] = {}
    for (source, name, episode), episode_times in sorted(wanted.items()):
        store, stored, stream = loader.sources[source].store, loader.sources[source].streams[name], cameras[name]
        plan = store.plan_frames(episode, stored, np.unique(np.concatenate(episode_times)), stream.tolerance)
        if stream.resize is not None:
            camera, resize = store.schema.video(stored), stream.resize
            geometry = frame_geometry(camera.width, camera.height, resize.size, resize.mode, resize.interpolation)
            plan.requests = [dataclasses.replace(request, geometry=geometry) for request in plan.requests]
        requests.setdefault((source, name), []).extend(request for request in plan.requests if request.frames)
    return {camera: found for camera, found in requests.items() if found}
