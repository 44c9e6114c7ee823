"""What a video decoder is asked for and what it reports: clip requests and decode statistics."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mmdata.codecs.geometry import FrameGeometry
from mmdata.codecs.packet_index import PacketIndex


@dataclass(frozen=True)
class SegmentRef:
    """Where a segment lives, so that an error can name it."""

    episode: str
    stream: str
    segment: int

    def __str__(self) -> str:
        return f"episode '{self.episode}', stream '{self.stream}', segment {self.segment}"


@dataclass(frozen=True)
class ClipRequest:
    """Frames `frames` (indices inside the segment, any order, repeats allowed) of one encoded segment.

    `gop` is the segment's key-frame interval when known; backends that seek use it to count the
    frames they had to decode. `frame_size` (width, height) is what the store declares: a segment
    whose frames are of another size fails before its frames are allocated. `packets`, when the
    store has it, indexes the segment's packets so that a decoder can start without demuxing.
    `geometry`, when set, is the crop and size the frames are delivered at (see `mmdata.codecs.geometry`).
    `display_size` (width, height), when set, is the camera's own size where `frame_size` is larger (a camera
    of odd sides is stored padded to even ones): frames are delivered cut to it. `channels_first` asks a
    decoder that `writes_channels_first` for `[F, 3, H, W]` frames, converted straight into that layout
    (others ignore it and deliver `[F, H, W, 3]`).
    """

    data: bytes
    frames: tuple[int, ...]
    codec: str
    where: SegmentRef | None = None
    gop: int | None = None
    frame_size: tuple[int, int] | None = None
    packets: PacketIndex | None = None
    geometry: FrameGeometry | None = None
    display_size: tuple[int, int] | None = None
    channels_first: bool = False

    def __post_init__(self):
        object.__setattr__(self, "frames", tuple(int(i) for i in self.frames))
        if any(i < 0 for i in self.frames):
            raise ValueError(f"{self.place()}: negative frame index in {list(self.frames)}")

    def place(self) -> str:
        return str(self.where) if self.where is not None else "segment"


@dataclass
class DecodeStats:
    """Running totals of one decoder: how much it decoded for how much it delivered, and in what time: `seconds`
    of wall time and `cpu_seconds` of the calling thread's CPU (all of a CPU backend's that decodes on that
    thread; a backend with threads of its own counts only its hand-off)."""

    requests: int = 0
    frames_delivered: int = 0
    frames_decoded: int = 0
    skipped: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    skipped_where: list[str] = field(default_factory=list)

    @property
    def decode_waste(self) -> float:
        """Frames decoded per frame delivered (1.0 means nothing was decoded in vain)."""
        return self.frames_decoded / self.frames_delivered if self.frames_delivered else 0.0

    def snapshot(self) -> dict:
        return {
            "requests": self.requests,
            "frames_delivered": self.frames_delivered,
            "frames_decoded": self.frames_decoded,
            "decode_waste": round(self.decode_waste, 4),
            "skipped": self.skipped,
            "seconds": round(self.seconds, 6),
            "cpu_seconds": round(self.cpu_seconds, 6),
        }


def frames_decoded_from_key_frames(frames: tuple[int, ...], gop: int | None) -> int:
    """Frames a seeking decoder decodes for `frames`: from the key frame before each run to its end.

    Runs of wanted frames closer than a key-frame interval are decoded in one pass; a decoder
    that cannot seek (gop None) decodes from the segment's first frame.
    """
    if not frames:
        return 0
    wanted = np.unique(np.asarray(frames))
    if not gop:
        return int(wanted[-1]) + 1
    decoded = 0
    run_start = (int(wanted[0]) // gop) * gop
    previous = int(wanted[0])
    for index in wanted[1:]:
        key = (int(index) // gop) * gop
        if key > previous:
            decoded += previous - run_start + 1
            run_start = key
        previous = int(index)
    return decoded + previous - run_start + 1
