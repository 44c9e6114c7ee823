"""An episode encoded for a store: video segments, audio bytes and low-dim arrays, whatever the layout.

The conversion makes these (`mmdata.conversion.encode`); the writers (`wds_writer`, `zarr_writer`)
and the episode files of an interrupted conversion (`episode_file`) store them. Every encoded
stream offers `count` (frames, samples or rows), `t_start` and `t_end` in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mmdata.codecs.packet_index import PacketIndex, index_segment
from mmdata.moments import Moments
from mmdata.schema import AudioStream, LowdimStream, Stream, VideoStream


@dataclass
class EncodedVideo:
    """A camera's segments, frames per segment and frame times; `indexes`, each segment's packet index when
    whoever made the segments knows it already (a copy), else found by demuxing each one."""

    spec: VideoStream
    segments: list[bytes]
    segment_frames: list[int]
    timestamps: np.ndarray
    indexes: list[PacketIndex] | None = None

    @property
    def count(self) -> int:
        return len(self.timestamps)

    @property
    def t_start(self) -> float:
        return float(self.timestamps[0])

    @property
    def t_end(self) -> float:
        return float(self.timestamps[-1] + 1.0 / self.spec.fps)

    @property
    def first_frames(self) -> list[int]:
        """Index of each segment's first frame within the episode."""
        return [int(f) for f in np.cumsum([0, *self.segment_frames[:-1]])]

    def packet_records(self) -> list[dict[str, bytes | str] | None]:
        """Each segment's packet index for the manifest (see `mmdata.codecs.packet_index`); None for a
        segment whose packets are not one per frame, which readers then demux."""
        records: list[dict[str, bytes | str] | None] = []
        known: list[PacketIndex | None] = list(self.indexes) if self.indexes else [None] * len(self.segments)
        for data, frames, given in zip(self.segments, self.segment_frames, known):
            index = given if given is not None else index_segment(data)
            records.append(index.to_record() if len(index) == frames else None)
        return records


@dataclass
class EncodedAudio:
    spec: AudioStream
    data: bytes
    count: int
    t_start: float

    @property
    def t_end(self) -> float:
        return self.t_start + self.count / self.spec.sample_rate


@dataclass
class EncodedLowdim:
    spec: LowdimStream
    values: np.ndarray
    timestamps: np.ndarray

    @property
    def count(self) -> int:
        return len(self.values)

    @property
    def t_start(self) -> float:
        return float(self.timestamps[0]) if len(self.timestamps) else 0.0

    @property
    def t_end(self) -> float:
        if len(self.timestamps) == 0:
            return 0.0
        return float(self.timestamps[-1] + sample_period(self.timestamps, self.spec.rate))


@dataclass
class EncodedEpisode:
    """An episode ready to be written: encoded video segments, audio bytes, low-dim arrays."""

    position: int
    source: str
    task: str
    metadata: dict[str, Any] = field(default_factory=dict)
    videos: list[EncodedVideo] = field(default_factory=list)
    audio: list[EncodedAudio] = field(default_factory=list)
    lowdim: list[EncodedLowdim] = field(default_factory=list)
    moments: dict[str, Moments] = field(default_factory=dict)

    @property
    def streams(self) -> list[Stream]:
        return [*(s.spec for s in self.videos), *(s.spec for s in self.audio), *(s.spec for s in self.lowdim)]

    @property
    def duration(self) -> float:
        ends = [*(s.t_end for s in self.videos), *(s.t_end for s in self.audio), *(s.t_end for s in self.lowdim)]
        return max(ends, default=0.0)


def sample_period(timestamps: np.ndarray, rate: float | None) -> float:
    """Seconds between samples: one over the declared rate, else the median step of the timestamps."""
    if rate:
        return 1.0 / rate
    if len(timestamps) > 1:
        return float(np.median(np.diff(timestamps)))
    return 0.0
