"""mmdata's bounded Zarr reader agrees with zarr-python on every layout it claims to read: numeric arrays
(bytes, + zstd; either byte order; a partial last chunk; chunks never written read as the fill value) and
sharded byte arrays (vlen-bytes, + zstd; the shard index at the end or the start, with or without CRC32C),
each written here by zarr-python itself and read back by both."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import zarr
from fsspec.implementations.local import LocalFileSystem
from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec, VLenBytesCodec, ZstdCodec

from mmdata.store.zarr_reader import ZarrArrays


@pytest.mark.parametrize("endian", ["little", "big"])
@pytest.mark.parametrize("compressed", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int16", "uint8", "bool"])
def test_numeric_arrays_read_as_zarr_python_reads_them(tmp_path, endian, compressed, dtype):
    group = zarr.open_group(str(tmp_path), mode="w", zarr_format=3)
    rng = np.random.default_rng(0)
    values = (rng.normal(size=(23, 3)) * 100).astype(dtype)
    array = group.create_array(
        "state",
        shape=(30, 3),
        chunks=(7, 3),
        dtype=dtype,
        serializer=BytesCodec(endian=endian if np.dtype(dtype).itemsize > 1 else None),
        compressors=ZstdCodec(level=0) if compressed else None,
        fill_value=5,
    )
    array[:23] = values  # rows 23..29: the last chunk partly, and one chunk never written
    reader = ZarrArrays(LocalFileSystem(), str(tmp_path))
    expected = zarr.open_array(str(tmp_path / "state"), mode="r")[:]
    for start, count in [(0, 30), (5, 9), (20, 10), (28, 2), (0, 0)]:
        got = reader.rows("state", start, count, (3,), dtype)
        np.testing.assert_array_equal(got, expected[start : start + count])
        assert got.dtype.newbyteorder("=") == np.dtype(dtype).newbyteorder("=")


@pytest.mark.parametrize("index_location", ["end", "start"])
@pytest.mark.parametrize("checksum", [False, True])
@pytest.mark.parametrize("compressed", [False, True])
def test_sharded_byte_arrays_read_as_zarr_python_reads_them(tmp_path, index_location, checksum, compressed):
    group = zarr.open_group(str(tmp_path), mode="w", zarr_format=3)
    rng = np.random.default_rng(1)
    elements = [rng.bytes(int(size)) for size in rng.integers(0, 3000, size=11)]
    index_codecs = [BytesCodec(), Crc32cCodec()] if checksum else [BytesCodec()]
    inner = [VLenBytesCodec(), ZstdCodec(level=3)] if compressed else [VLenBytesCodec()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr-python's VariableLengthBytes has no v3 spec yet
        array = group.create_array(
            "video",
            shape=(len(elements),),
            chunks=(4,),
            dtype=zarr.dtype.VariableLengthBytes(),
            serializer=ShardingCodec(
                chunk_shape=(1,), codecs=inner, index_codecs=index_codecs, index_location=index_location
            ),
            compressors=None,
        )
        array[:] = np.array(elements, dtype=object)
        expected = list(zarr.open_array(str(tmp_path / "video"), mode="r")[:])
    assert expected == elements
    reader = ZarrArrays(LocalFileSystem(), str(tmp_path))
    assert [reader.element("video", i, len(data)) for i, data in enumerate(elements)] == expected
