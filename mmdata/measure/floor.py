"""The decode floor of measured steps: the CPU time that decoding, once and in order, the frames those steps
delivered takes, converted to RGB at the size they were delivered at. It is the least any loader of these
samples must spend on video, so a loader's CPU per sample is reported against it (`mmdata bench`)."""

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
    """Decode every frame that the samples `sample_indices` of `loader` deliver once, each camera of each
    episode in time order, with PyAV on this thread (the segments read first, the decoder warmed up on the
    first), and measure the process CPU it takes. None where the spec delivers no frames."""
    indices = np.unique(np.fromiter(sample_indices, np.int64))
    requests = [request for request in _floor_requests(loader, indices) if request.frames]
    if not requests:
        return None
    decoder = PyAvDecoder()
    decoder.decode(requests[:1])
    started = time.process_time()
    frames = 0
    for request in requests:  # one segment at a time: the floor holds no more frames than one segment's
        frames += sum(len(output) for output in decoder.decode([request]))
    return DecodeFloor(time.process_time() - started, frames, len(indices))


def _floor_requests(loader: DataLoader, indices: np.ndarray) -> list[ClipRequest]:
    """Per source, episode and camera in order: the segment requests for the frames the samples deliver."""
    table, spec = loader.samples, loader.spec
    cameras = {name: stream for name, stream in spec.streams.items() if isinstance(stream, Frames)}
    wanted: dict[tuple[int, int, str], list[np.ndarray]] = {}
    for index in indices.tolist():
        source = int(table.source[index])
        for name, stream in cameras.items():
            stored = loader.sources[source].streams.get(name)
            if stored is None:
                continue
            times = sample_times(spec, name, stream, float(table.start[index]), float(table.end[index]))
            wanted.setdefault((source, int(table.episode[index]), name), []).append(times)
    requests = []
    for (source, episode, name), times in sorted(wanted.items()):
        store, stored, stream = loader.sources[source].store, loader.sources[source].streams[name], cameras[name]
        plan = store.plan_frames(episode, stored, np.unique(np.concatenate(times)), stream.tolerance)
        if stream.resize is not None:
            camera, resize = store.schema.stream(stored), stream.resize
            geometry = frame_geometry(camera.width, camera.height, resize.size, resize.mode, resize.interpolation)
            plan.requests = [dataclasses.replace(request, geometry=geometry) for request in plan.requests]
        requests += plan.requests
    return requests
