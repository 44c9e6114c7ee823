"""A segment's packets as the elementary stream a hardware decoder parses, without a container.

MP4 segments hold H.264 and HEVC packets as length-prefixed NAL units, with the parameter sets
(SPS, PPS, VPS) in the codec configuration (`avcC` / `hvcC`, FFmpeg's extradata). NVDEC's parser
reads Annex B instead: each NAL unit after a start code, the parameter sets in band. So each
packet's length prefixes become start codes, and the parameter sets go before every key frame, so
that decoding may start at any key frame. VP9 packets are already what the parser reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from mmdata.errors import DecodeError

START_CODE = b"\x00\x00\x00\x01"
PASSED_AS_STORED = frozenset({"vp8", "vp9"})


@dataclass(frozen=True)
class AnnexB:
    """Rewrites one stream's packets to Annex B: `length_size`-byte NAL lengths become start codes
    (0 when the packets already use start codes), `parameter_sets` go before key frames."""

    length_size: int
    parameter_sets: bytes

    def packet(self, payload: bytes | memoryview, key: bool) -> bytes:
        """One packet in Annex B; raises DecodeError when its NAL lengths overrun it."""
        payload = bytes(payload)
        prefix = self.parameter_sets if key else b""
        if not self.length_size:
            return prefix + payload
        parts = [prefix]
        for start, end in length_prefixed_units(payload, self.length_size):
            parts += [START_CODE, payload[start:end]]
        return b"".join(parts)


def length_prefixed_units(payload: bytes, length_size: int) -> Iterator[tuple[int, int]]:
    """(start, end) of each NAL unit of a packet whose units follow their `length_size`-byte lengths (MP4
    samples); DecodeError when a length or a unit overruns the packet."""
    position, size = 0, len(payload)
    while position < size:
        end = position + length_size
        if end > size:
            raise DecodeError(f"a packet ends inside a NAL length ({size - position} of {length_size} bytes)")
        length = int.from_bytes(payload[position:end], "big")
        if length == 0 or end + length > size:
            raise DecodeError(f"a NAL unit of {length} bytes overruns its packet of {size} bytes")
        yield end, end + length
        position = end + length


def annex_b_units(data: bytes) -> Iterator[tuple[int, int]]:
    """(start, end) of each NAL unit of an Annex B byte stream (each after a 3- or 4-byte start code)."""
    marker = START_CODE[1:]
    start = data.find(marker)
    while start >= 0:
        start += len(marker)
        end = data.find(marker, start)
        stop = end if end >= 0 else len(data)
        while stop > start and data[stop - 1] == 0:  # (the zero before a 4-byte start code)
            stop -= 1
        if stop > start:
            yield start, stop
        start = end


def elementary_stream(codec: str, codec_config: bytes) -> AnnexB | None:
    """How to rewrite `codec`'s packets for a hardware parser (None: pass them as stored).

    Raises DecodeError for a codec configuration that does not parse.
    """
    if codec in PASSED_AS_STORED:
        return None
    if codec_config.startswith((START_CODE, START_CODE[1:])) or not codec_config:
        return AnnexB(0, bytes(codec_config))
    try:
        if codec == "h264":
            return _from_avcc(codec_config)
        if codec == "hevc":
            return _from_hvcc(codec_config)
    except IndexError as exc:
        raise DecodeError(f"its {codec} codec configuration ends early ({len(codec_config)} bytes)") from exc
    raise DecodeError(f"no elementary stream form is known for {codec} video")


def _from_avcc(config: bytes) -> AnnexB:
    """AVCDecoderConfigurationRecord (ISO 14496-15, 5.3.3): SPS then PPS units, each after a 16-bit length."""
    if config[0] != 1:
        raise DecodeError(f"its avcC codec configuration has version {config[0]}, not 1")
    units, position = [], 5
    for count_mask in (0x1F, 0xFF):
        count = config[position] & count_mask
        position += 1
        for _ in range(count):
            unit, position = _unit(config, position)
            units.append(unit)
    return AnnexB((config[4] & 3) + 1, b"".join(START_CODE + unit for unit in units))


def _from_hvcc(config: bytes) -> AnnexB:
    """HEVCDecoderConfigurationRecord (ISO 14496-15, 8.3.3): arrays of VPS, SPS, PPS and SEI units."""
    units, position = [], 23
    for _ in range(config[22]):
        count = int.from_bytes(config[position + 1 : position + 3], "big")
        position += 3
        for _ in range(count):
            unit, position = _unit(config, position)
            units.append(unit)
    return AnnexB((config[21] & 3) + 1, b"".join(START_CODE + unit for unit in units))


def _unit(config: bytes, position: int) -> tuple[bytes, int]:
    length = int.from_bytes(config[position : position + 2], "big")
    end = position + 2 + length
    if end > len(config):
        raise IndexError(end)
    return config[position + 2 : end], end
