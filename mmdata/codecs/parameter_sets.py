"""What an H.264 or HEVC stream's sequence parameter sets (and an AV1 stream's sequence headers) declare, read
from the packets without decoding: the units themselves, found in Annex B or length-prefixed packets, and
whether the decoder may show frames in another order than they come (B-frames).

A copy of a robot log's video (`codecs/video_copy.py`) must store each frame at its place in presentation
order; a stream whose parameter sets rule reordering out (H.264 Baseline, or `max_num_reorder_frames` 0 in
its VUI; HEVC `sps_max_num_reorder_pics` 0) is shown in the order it comes, so it need not be decoded to
learn that order. The fields are read as ITU-T H.264 (7.3.2.1.1, E.1.1) and H.265 (7.3.2.2.1, 7.3.3) lay
them out; a parameter set that cannot be read is taken to allow reordering.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from mmdata.codecs.bitstream import annex_b_units, elementary_stream, length_prefixed_units
from mmdata.errors import DecodeError

H264_SPS = 7
HEVC_SPS = 33
AV1_SEQUENCE_HEADER = 1
# H.264 profiles whose SPS carries chroma format, bit depths and scaling matrices (7.3.2.1.1)
_HIGH_PROFILES = {100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135}
_BASELINE = 66  # (no B slices)
_EMULATION_PREVENTION = re.compile(b"\x00\x00\x03")


def length_size(codec: str, config: bytes) -> int:
    """The bytes before each NAL unit of the stream's packets (4 for MP4's usual `avcC`/`hvcC`), or 0 when its
    packets use start codes (Annex B, as logs carry them); 0 for AV1."""
    stream = elementary_stream(codec, config) if codec != "av1" else None
    return stream.length_size if stream is not None else 0


def config_units(codec: str, config: bytes) -> Iterator[bytes]:
    """The sequence parameter sets (or AV1 sequence headers) of a codec configuration (`avcC`, `hvcC`, `av1C`:
    4 bytes, then OBUs; or Annex B units)."""
    if not config:
        return
    if codec == "av1":
        yield from _av1_sequence_headers(config[4:])
    else:
        stream = elementary_stream(codec, config)
        if stream is not None:
            yield from sequence_units(codec, stream.parameter_sets, 0)


def sequence_units(codec: str, payload: bytes, size_of_length: int) -> Iterator[bytes]:
    """The units of a packet that declare the stream's sequence: AV1 sequence headers, H.264 / HEVC sequence
    parameter sets (NAL units after start codes, or after `size_of_length`-byte lengths)."""
    if codec == "av1":
        yield from _av1_sequence_headers(payload)
        return
    wanted = H264_SPS if codec == "h264" else HEVC_SPS
    units = length_prefixed_units(payload, size_of_length) if size_of_length else annex_b_units(payload)
    for start, end in units:
        header = payload[start]
        if (header & 0x1F if codec == "h264" else (header >> 1) & 0x3F) == wanted:
            yield bytes(payload[start:end])


def may_reorder(codec: str, unit: bytes) -> bool:
    """Whether an H.264 or HEVC stream with this sequence parameter set may show frames in another order than
    they come (True when the set cannot be read)."""
    try:
        if codec == "h264":
            return _h264_may_reorder(Bits(_rbsp(unit[1:])))
        if codec == "hevc":
            return _hevc_may_reorder(Bits(_rbsp(unit[2:])))
    except DecodeError:
        return True
    raise ValueError(f"{codec} has no sequence parameter sets to read")


class Bits:
    """Big-endian bits of a header, with Exp-Golomb codes."""

    def __init__(self, data: bytes):
        self.data, self.position = data, 0

    def read(self, count: int) -> int:
        value = 0
        for _ in range(count):
            byte = self.position >> 3
            if byte >= len(self.data):
                raise DecodeError("a header ends early")
            value = (value << 1) | ((self.data[byte] >> (7 - (self.position & 7))) & 1)
            self.position += 1
        return value

    def unsigned(self) -> int:
        """ue(v)."""
        zeros = 0
        while self.read(1) == 0:
            zeros += 1
            if zeros > 31:
                raise DecodeError("an Exp-Golomb code is longer than 32 bits")
        return (1 << zeros) - 1 + self.read(zeros)

    def signed(self) -> int:
        """se(v)."""
        code = self.unsigned()
        return (code + 1) // 2 if code & 1 else -(code // 2)


def _rbsp(unit: bytes) -> bytes:
    """A NAL unit's payload without its emulation prevention bytes."""
    return _EMULATION_PREVENTION.sub(b"\x00\x00", unit)


def _h264_may_reorder(bits: Bits) -> bool:
    profile = bits.read(8)
    if profile == _BASELINE:
        return False
    bits.read(16)  # constraint flags, level
    bits.unsigned()  # seq_parameter_set_id
    if profile in _HIGH_PROFILES:
        chroma_format = bits.unsigned()
        if chroma_format == 3:
            bits.read(1)
        bits.unsigned(), bits.unsigned()  # bit depths
        bits.read(1)
        if bits.read(1):  # seq_scaling_matrix_present_flag
            for number in range(8 if chroma_format != 3 else 12):
                if bits.read(1):
                    _skip_scaling_list(bits, 16 if number < 6 else 64)
    bits.unsigned()  # log2_max_frame_num_minus4
    order_type = bits.unsigned()
    if order_type == 0:
        bits.unsigned()
    elif order_type == 1:
        bits.read(1)
        bits.signed(), bits.signed()
        for _ in range(bits.unsigned()):
            bits.signed()
    bits.unsigned()  # max_num_ref_frames
    bits.read(1)
    bits.unsigned(), bits.unsigned()  # picture size in macroblocks
    if not bits.read(1):  # frame_mbs_only_flag
        bits.read(1)
    bits.read(1)
    if bits.read(1):  # frame_cropping_flag
        for _ in range(4):
            bits.unsigned()
    if not bits.read(1):  # vui_parameters_present_flag
        return True
    if bits.read(1) and bits.read(8) == 255:  # aspect ratio, extended SAR
        bits.read(32)
    if bits.read(1):  # overscan
        bits.read(1)
    if bits.read(1):  # video signal type
        bits.read(4)
        if bits.read(1):
            bits.read(24)
    if bits.read(1):  # chroma location
        bits.unsigned(), bits.unsigned()
    if bits.read(1):  # timing
        bits.read(65)
    hrd = False
    for _ in range(2):  # NAL and VCL HRD parameters
        if bits.read(1):
            _skip_hrd(bits)
            hrd = True
    if hrd:
        bits.read(1)  # low_delay_hrd_flag
    bits.read(1)  # pic_struct_present_flag
    if not bits.read(1):  # bitstream_restriction_flag
        return True
    bits.read(1)
    for _ in range(4):
        bits.unsigned()
    return bits.unsigned() > 0  # max_num_reorder_frames


def _skip_scaling_list(bits: Bits, size: int) -> None:
    last = following = 8
    for _ in range(size):
        if following:
            following = (last + bits.signed() + 256) % 256
        last = following or last


def _skip_hrd(bits: Bits) -> None:
    count = bits.unsigned() + 1
    bits.read(8)
    for _ in range(count):
        bits.unsigned(), bits.unsigned()
        bits.read(1)
    bits.read(20)


def _hevc_may_reorder(bits: Bits) -> bool:
    bits.read(4)  # sps_video_parameter_set_id
    sub_layers = bits.read(3)  # sps_max_sub_layers_minus1
    bits.read(1)
    bits.read(96)  # general profile, tier and level
    present = [(bits.read(1), bits.read(1)) for _ in range(sub_layers)]
    if sub_layers:
        bits.read(2 * (8 - sub_layers))
    for profile_present, level_present in present:
        bits.read(88 * profile_present + 8 * level_present)
    bits.unsigned()  # sps_seq_parameter_set_id
    if bits.unsigned() == 3:  # chroma_format_idc
        bits.read(1)
    bits.unsigned(), bits.unsigned()  # picture size
    if bits.read(1):  # conformance window
        for _ in range(4):
            bits.unsigned()
    bits.unsigned(), bits.unsigned(), bits.unsigned()  # bit depths, log2_max_pic_order_cnt_lsb_minus4
    every_layer = bits.read(1)
    reorder = 0
    for _ in range(0 if every_layer else sub_layers, sub_layers + 1):
        bits.unsigned()
        reorder = bits.unsigned()  # sps_max_num_reorder_pics (the highest sub-layer's is read last)
        bits.unsigned()
    return reorder > 0


def _av1_sequence_headers(data: bytes) -> Iterator[bytes]:
    """The sequence header OBUs of a temporal unit (OBUs with their sizes, as MP4, IVF and Foxglove carry them)."""
    position = 0
    while position < len(data):
        header = data[position]
        kind, extended, sized = (header >> 3) & 0xF, (header >> 2) & 1, (header >> 1) & 1
        start = position + 1 + extended
        if sized:
            length, start = _leb128(data, start)
        else:
            length = len(data) - start
        end = start + length
        if end > len(data):
            raise DecodeError(f"an AV1 OBU of {length} bytes overruns its packet of {len(data)} bytes")
        if kind == AV1_SEQUENCE_HEADER:
            yield bytes(data[start:end])
        position = end


def _leb128(data: bytes, position: int) -> tuple[int, int]:
    value = 0
    for shift in range(8):
        if position >= len(data):
            raise DecodeError("an AV1 OBU size runs past its packet")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << (7 * shift)
        if not byte & 0x80:
            return value, position
    raise DecodeError("an AV1 OBU size is longer than 8 bytes")
