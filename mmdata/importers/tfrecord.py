"""TFRecord files and the `tf.train.Example` records in them, read without TensorFlow.

A record is framed as its length (uint64, little-endian), the masked CRC32C of those 8 bytes, the
data, and the masked CRC32C of the data. Both checksums are checked. A bad checksum, a truncated
record or an Example that does not parse is a `TFRecordError` naming the file, the record number
and its byte offset.

`parse_example` decodes the protobuf wire format of `tf.train.Example` (Features: a map of string
to Feature; a Feature is a bytes, float or int64 list) into `{key: Feature}`, without the protobuf
package: the format is five fields deep and fixed since TensorFlow 1.0.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np

from mmdata.errors import TFRecordError
from mmdata.store.checksum import crc32c

MASK_DELTA = 0xA282EAD8
HEADER_BYTES = 12
FOOTER_BYTES = 4

VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5


def masked_crc32c(data: bytes | memoryview) -> int:
    """TFRecord's checksum: CRC32C rotated right by 15 bits plus a constant (so that a CRC of CRCs differs)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF


def read_records(path: str | os.PathLike) -> Iterator[bytes]:
    """The data of each record of a TFRecord file, in order, every checksum checked."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        number = offset = 0
        while offset < size:
            data = _read_one(handle, os.fspath(path), number, offset, size)
            yield data
            number += 1
            offset += HEADER_BYTES + len(data) + FOOTER_BYTES


def read_record(path: str | os.PathLike, offset: int, number: int = 0) -> bytes:
    """The data of the record whose framing starts at byte `offset` (the `number`-th, for messages)."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        handle.seek(offset)
        return _read_one(handle, os.fspath(path), number, offset, size)


def record_spans(path: str | os.PathLike) -> list[tuple[int, int]]:
    """(offset, data length) of every record, from the framing alone (lengths checked; data when read)."""
    return list(iter_record_spans(path))


def iter_record_spans(path: str | os.PathLike) -> Iterator[tuple[int, int]]:
    """`record_spans` one by one, so a reader keeps the records before a break in the framing."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        offset = number = 0
        while offset < size:
            length = _read_length(handle, os.fspath(path), number, offset, size)
            yield offset, length
            number += 1
            offset += HEADER_BYTES + length + FOOTER_BYTES
            handle.seek(offset)


def _read_length(handle, path: str, number: int, offset: int, size: int) -> int:
    where = f"{path}: record {number} at byte {offset}"
    header = handle.read(HEADER_BYTES)
    if len(header) < HEADER_BYTES:
        raise TFRecordError(f"{where}: the file ends inside the record's header (truncated)")
    length, length_crc = struct.unpack("<QI", header)
    if masked_crc32c(header[:8]) != length_crc:
        raise TFRecordError(f"{where}: the record's length fails its CRC32C (a damaged file)")
    if length > size - offset - HEADER_BYTES - FOOTER_BYTES:
        raise TFRecordError(f"{where}: the record's {length} bytes run past the end of the file (truncated)")
    return length


def _read_one(handle, path: str, number: int, offset: int, size: int) -> bytes:
    where = f"{path}: record {number} at byte {offset}"
    length = _read_length(handle, path, number, offset, size)
    data = handle.read(length)
    (data_crc,) = struct.unpack("<I", handle.read(FOOTER_BYTES))
    if masked_crc32c(data) != data_crc:
        raise TFRecordError(f"{where}: the record's data fails its CRC32C (a damaged file)")
    return data


@dataclass(frozen=True)
class Feature:
    """One feature of an Example: `values` is a list of bytes, or a float32 / int64 array."""

    kind: Literal["bytes", "float", "int64"]
    values: list[bytes] | np.ndarray


def parse_example(data: bytes | memoryview, where: str) -> dict[str, Feature]:
    """The features of a serialized `tf.train.Example`; TFRecordError naming `where` if it does not parse."""
    try:
        features: dict[str, Feature] = {}
        for number, wire, _, value in _fields(memoryview(data)):
            if number == 1 and wire == LENGTH_DELIMITED:  # Example.features
                for entry_number, entry_wire, _, entry in _fields(value):
                    if entry_number == 1 and entry_wire == LENGTH_DELIMITED:  # Features.feature (map entry)
                        key, feature = _map_entry(entry)
                        features[key] = feature
        return features
    except (ValueError, UnicodeDecodeError) as exc:
        raise TFRecordError(f"{where}: not a tf.train.Example ({exc})") from exc


def _map_entry(entry: memoryview) -> tuple[str, Feature]:
    key, feature = "", Feature("bytes", [])
    for number, wire, _, value in _fields(entry):
        if number == 1 and wire == LENGTH_DELIMITED:
            key = bytes(value).decode("utf-8")
        elif number == 2 and wire == LENGTH_DELIMITED:
            feature = _feature(value)
    return key, feature


def _feature(data: memoryview) -> Feature:
    """A Feature: its one list (bytes_list = 1, float_list = 2, int64_list = 3); an empty Feature is no values."""
    found = Feature("bytes", [])
    for number, wire, _, value in _fields(data):
        if wire != LENGTH_DELIMITED or number not in (1, 2, 3):
            raise ValueError(f"a feature holds field {number} of wire type {wire}, not a bytes, float or int64 list")
        if number == 1:
            found = Feature(
                "bytes", [bytes(item) for n, w, _, item in _fields(value) if n == 1 and w == LENGTH_DELIMITED]
            )
        elif number == 2:
            found = Feature("float", _floats(value))
        else:
            found = Feature("int64", _int64s(value))
    return found


def _floats(data: memoryview) -> np.ndarray:
    """FloatList.value: packed (one length-delimited run of float32) or one fixed32 field per value."""
    parts: list[np.ndarray] = []
    for number, wire, integer, span in _fields(data):
        if number != 1:
            continue
        if wire == LENGTH_DELIMITED:
            if len(span) % 4:
                raise ValueError("a packed float list's length is not a multiple of 4")
            parts.append(np.frombuffer(span, "<f4"))
        elif wire == FIXED32:
            parts.append(np.array([struct.unpack("<f", struct.pack("<I", integer))[0]], "<f4"))
        else:
            raise ValueError(f"a float list holds wire type {wire}")
    return np.concatenate(parts).astype(np.float32) if parts else np.empty(0, np.float32)


def _int64s(data: memoryview) -> np.ndarray:
    """Int64List.value: packed (one length-delimited run of varints) or one varint field per value."""
    values: list[int] = []
    for number, wire, integer, span in _fields(data):
        if number != 1:
            continue
        if wire == LENGTH_DELIMITED:
            position = 0
            while position < len(span):
                item, position = _varint(span, position)
                values.append(item)
        elif wire == VARINT:
            values.append(integer)
        else:
            raise ValueError(f"an int64 list holds wire type {wire}")
    return np.array(values, np.uint64).view(np.int64)  # two's complement, as protobuf encodes negatives


def _fields(data: memoryview) -> Iterator[tuple[int, int, int, memoryview]]:
    """(field number, wire type, integer, span) of each field of a protobuf message: a varint or fixed value is the
    integer (its span empty), a length-delimited one the bytes it spans (its integer 0)."""
    nothing = data[0:0]
    position = 0
    while position < len(data):
        tag, position = _varint(data, position)
        number, wire = tag >> 3, tag & 7
        if wire == VARINT:
            value, position = _varint(data, position)
            yield number, wire, value, nothing
        elif wire == LENGTH_DELIMITED:
            length, position = _varint(data, position)
            if position + length > len(data):
                raise ValueError(f"field {number} runs past the end of its message")
            yield number, wire, 0, data[position : position + length]
            position += length
        elif wire in (FIXED64, FIXED32):
            width = 8 if wire == FIXED64 else 4
            if position + width > len(data):
                raise ValueError(f"field {number} runs past the end of its message")
            yield number, wire, int.from_bytes(data[position : position + width], "little"), nothing
            position += width
        else:
            raise ValueError(f"field {number} has wire type {wire}, which no Example uses")


def _varint(data: memoryview, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= len(data) or shift > 63:
            raise ValueError("a varint runs past the end of its message or past 64 bits")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
