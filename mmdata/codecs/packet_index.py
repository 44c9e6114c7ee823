"""A segment's packet index: what a decoder needs to start on a segment without demuxing it.

Written at conversion, once per segment, into the manifest: the codec's parameter sets
(`codec_config`, FFmpeg's extradata) and, per packet in decode order, its byte offset and size
inside the segment, the frame it shows (its index in presentation order) and whether it is a key
frame. A reader then slices the packets it needs out of the segment's bytes and feeds them to a
decoder it keeps open, instead of opening a container per request (about half a millisecond each).

The index is interpreted against bytes whose checksum holds, so it carries a checksum of its own
(xxHash64 of its codec configuration and packet table, as pieces are checked): an index edited
consistently (two frames' numbers swapped) would otherwise deliver the wrong frames without an error.
An index without one (stores written before it existed) is not used; readers demux such segments.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from functools import cached_property

import av
import numpy as np
import xxhash

from mmdata.errors import DecodeError

# offset, size, frame (presentation index), key flag; little-endian int32 per packet
COLUMNS = 4
_DTYPE = np.dtype("<i4")
ROW_BYTES = COLUMNS * _DTYPE.itemsize
MAX_CODEC_CONFIG_BYTES = 1 << 16


@dataclass(frozen=True)
class PacketIndex:
    """Packets of one segment in decode order: `offsets`, `sizes`, `frames` (presentation index), `keys`."""

    codec_config: bytes
    offsets: np.ndarray
    sizes: np.ndarray
    frames: np.ndarray
    keys: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets)

    @cached_property
    def key_frames(self) -> tuple[np.ndarray, np.ndarray]:
        """(frames shown by key packets, ascending; their decode positions)."""
        return key_frames_of(self.frames, self.keys)

    def to_record(self) -> dict[str, bytes | str]:
        """The manifest's form: `{"codec_config": bytes, "packets": int32 [n, 4] bytes, "checksum": hex}`."""
        table = np.stack([self.offsets, self.sizes, self.frames, self.keys.astype(np.int32)], axis=1)
        packets = table.astype(_DTYPE).tobytes()
        checksum = record_checksum(self.codec_config, packets)
        return {"codec_config": self.codec_config, "packets": packets, "checksum": checksum}

    @classmethod
    def from_record(cls, record: dict, segment_bytes: int, num_frames: int) -> PacketIndex:
        """Parse and check a manifest record against its segment's size and frame count.

        Raises DecodeError when the index cannot describe the segment (packets outside its bytes,
        frames that are not each shown once, no key frame first) or fails its checksum.
        """
        config, blob = record["codec_config"], record["packets"]
        if config is None or blob is None or len(config) > MAX_CODEC_CONFIG_BYTES:
            raise DecodeError("its packet index is missing or oversized")
        if len(blob) != num_frames * ROW_BYTES:
            raise DecodeError(f"its packet index lists {len(blob) // ROW_BYTES} packets for {num_frames} frames")
        table = np.frombuffer(blob, _DTYPE).reshape(num_frames, COLUMNS)
        offsets, sizes, frames, keys = (table[:, column] for column in range(COLUMNS))
        ends = offsets.astype(np.int64) + sizes
        if (offsets < 0).any() or (sizes < 1).any() or (ends > segment_bytes).any():
            raise DecodeError(f"its packet index points outside the segment's {segment_bytes} bytes")
        if not np.array_equal(np.sort(frames), np.arange(num_frames)) or not keys[0] or frames[0] != 0:
            raise DecodeError("its packet index does not show each frame once, starting with a key frame")
        if record.get("checksum") != record_checksum(config, blob):
            raise DecodeError("its packet index does not match its checksum (the manifest was edited or damaged)")
        return cls(bytes(config), offsets, sizes, frames, keys.astype(bool))


def record_checksum(codec_config: bytes, packets: bytes) -> str:
    """Hex xxHash64 of an index's codec configuration (length first) and packet table."""
    return xxhash.xxh64_hexdigest(len(codec_config).to_bytes(4, "little") + codec_config + packets)


def is_checked(record: dict | None) -> bool:
    """Whether a manifest record is an index readers may use: present and carrying a checksum."""
    return record is not None and bool(record.get("checksum"))


def index_segment(data: bytes) -> PacketIndex:
    """Demux an encoded segment once (at conversion) and describe its packets.

    The offsets are found by locating each packet's payload in the segment's bytes, in order, so
    the index is checked against the very bytes it will slice.
    """
    with av.open(io.BytesIO(data), mode="r") as container:
        stream = container.streams.video[0]
        config = bytes(stream.codec_context.extradata or b"")
        packets = [packet for packet in container.demux(stream) if packet.size]
        frames = presented_frames(packets)
        return located(config, data, [bytes(p) for p in packets], frames, [p.is_keyframe for p in packets])


def located(config: bytes, data: bytes, payloads: list[bytes], frames: list[int], keys: list[bool]) -> PacketIndex:
    """The index of a segment's packets (`payloads` in decode order, the frame each shows, its key flag), each
    found in the segment's bytes `data`, in order: the index is checked against the very bytes it will slice."""
    offsets, position = [], 0
    for payload in payloads:
        found = data.find(payload, position)
        if found < 0:
            raise DecodeError("a packet's bytes are not stored contiguously in the segment")
        offsets.append(found)
        position = found + len(payload)
    return PacketIndex(
        config,
        np.asarray(offsets, np.int32),
        np.asarray([len(payload) for payload in payloads], np.int32),
        np.asarray(frames, np.int32),
        np.asarray(keys, bool),
    )


def presentation_order(packets: list[av.Packet]) -> dict[int, int]:
    """Each packet's frame index in presentation order, keyed by pts (decode order differs with B-frames)."""
    return {pts: index for index, pts in enumerate(sorted(_stamps(packets)))}


def presented_frames(packets: list[av.Packet]) -> list[int]:
    """Each packet's frame index in presentation order, in the packets' (decode) order."""
    stamps = _stamps(packets)
    order = {pts: index for index, pts in enumerate(sorted(stamps))}
    return [order[pts] for pts in stamps]


def _stamps(packets: list[av.Packet]) -> list[int]:
    stamps = []
    for number, packet in enumerate(packets):
        if packet.pts is None:
            raise DecodeError(f"packet {number} of the segment has no presentation time stamp, so its frame is unknown")
        stamps.append(packet.pts)
    return stamps


def index_describes(index: PacketIndex, data: bytes) -> bool:
    """Whether `index` is what demuxing `data` finds (what `mmdata verify` checks)."""
    found = index_segment(data)
    return found.codec_config == index.codec_config and all(
        np.array_equal(getattr(found, name), getattr(index, name)) for name in ("offsets", "sizes", "frames", "keys")
    )


def key_frames_of(frames: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of packets in decode order showing `frames`, the key ones: (frames they show, ascending;
    their decode positions)."""
    positions = np.flatnonzero(keys)
    order = np.argsort(frames[positions], kind="stable")
    return frames[positions][order].astype(np.int64), positions[order]
