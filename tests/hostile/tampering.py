"""Ways to damage a store or an input on purpose, and to run code under a memory limit."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

MANIFEST = "episodes.parquet"


def copy_store(store: Path, destination: Path) -> Path:
    shutil.copytree(store, destination)
    return destination


def edit_manifest(store: Path, change: Callable[[list[dict[str, Any]]], None]) -> None:
    """Rewrite the manifest after `change` mutates its rows (the column types are kept)."""
    table = pq.read_table(store / MANIFEST)
    rows = table.to_pylist()
    change(rows)
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), store / MANIFEST)


def edit_schema(store: Path, change: Callable[[dict[str, Any]], None]) -> None:
    document = json.loads((store / "dataset.json").read_text())
    change(document)
    (store / "dataset.json").write_text(json.dumps(document))


def _packet_record(data: bytes, frames: int) -> dict[str, bytes] | None:
    """The packet index an attacker who rewrites a segment writes beside it (None if it does not demux)."""
    from mmdata.codecs.packet_index import index_segment

    try:
        index = index_segment(data)
    except Exception:
        return None
    return index.to_record() if len(index) == frames else None


def replace_piece(store: Path, row: int, column: str, data: bytes, segment: int | None = None) -> None:
    """Store `data` as the piece `column` (segment `segment`) of episode `row`, with a matching size
    and checksum in the manifest: what an attacker who can write the whole store can do."""
    layout = json.loads((store / "dataset.json").read_text())["layout"]

    def change(rows: list[dict[str, Any]]) -> None:
        piece = rows[row][column] if segment is None else rows[row][column][segment]
        if layout == "wds":
            shard = store / piece["path"]
            piece["offset"] = shard.stat().st_size
            with open(shard, "ab") as handle:
                handle.write(data)
        else:
            import numpy as np
            import zarr

            array = zarr.open_array(str(store / piece["path"]), mode="r+")
            values = np.empty(1, dtype=object)
            values[0] = data
            array[piece["offset"] : piece["offset"] + 1] = values
        piece["size"] = len(data)
        piece["checksum"] = xxhash.xxh64_hexdigest(data)
        indexes = rows[row].get(column.replace("/segments", "/packets")) if segment is not None else None
        if indexes:
            indexes[segment] = _packet_record(data, piece["num_frames"])

    edit_manifest(store, change)


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def zstd_rle_frame(size: int, byte: int = 0) -> bytes:
    """A valid zstd frame of `size` bytes made of RLE blocks: ~4 bytes per 128 KiB of output
    (2.5 GB in 76 KB), as a compression bomb would be."""
    frame = bytearray(b"\x28\xb5\x2f\xfd" + bytes([0xC0, 0x38]) + struct.pack("<Q", size))
    left = size
    while left > 0:
        block = min(left, 1 << 17)
        left -= block
        frame += ((1 if left == 0 else 0) | (1 << 1) | (block << 3)).to_bytes(3, "little") + bytes([byte])
    return bytes(frame)


def run_limited(code: str, headroom_bytes: int, timeout: float = 120) -> dict[str, Any]:
    """Run `code` in a fresh interpreter whose address space may grow by at most `headroom_bytes` once
    mmdata and the libraries it uses are loaded (so a bomb fails fast whichever torch build is
    installed); it ends by calling `report(outcome)`. Returns that outcome with `peak_rss` (bytes), `increase` (the peak
    over the interpreter's own resident size once mmdata and the libraries it uses are imported: what
    the case itself took, whichever torch build is installed) and `returncode`."""
    prologue = textwrap.dedent(
        """
        import json, resource, sys
        import mmdata, mmdata.conversion.pipeline, mmdata.loading.dataloader, numpy, av, pyarrow.parquet
        try:
            import torch
        except ImportError:
            pass
        _pages = [int(n) * resource.getpagesize() for n in open("/proc/self/statm").read().split()[:2]]
        BASELINE = _pages[1]
        resource.setrlimit(resource.RLIMIT_AS, (_pages[0] + HEADROOM, _pages[0] + HEADROOM))
        def report(outcome):
            # VmHWM, this process's own peak: ru_maxrss would carry the forking parent's over exec
            status = dict(line.split(":", 1) for line in open("/proc/self/status"))
            peak = int(status["VmHWM"].split()[0]) * 1024
            found = {"outcome": outcome, "peak_rss": peak, "increase": peak - BASELINE}
            print("REPORT " + json.dumps(found), flush=True)
        def outcome_of(call):
            try:
                call()
                return "ok"
            except BaseException as exc:
                return f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
        """
    )

    result = subprocess.run(
        [sys.executable, "-c", f"HEADROOM = {int(headroom_bytes)}\n" + prologue + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("REPORT ")]
    found = json.loads(lines[-1][len("REPORT ") :]) if lines else {"outcome": None, "peak_rss": None, "increase": None}
    found.update(returncode=result.returncode, stderr=result.stderr[-3000:])
    return found


def flac_silence_bomb(seconds: float, sample_rate: int = 16000) -> bytes:
    """A valid mono 16-bit FLAC stream of `seconds` of silence in frames of 65535 constant samples,
    about 14 bytes each: two hours at 16 kHz (230 MB decoded) in 25 KB."""
    block = 65535
    frames = int(seconds * sample_rate) // block
    info = (
        struct.pack(">HH", block, block)
        + (0).to_bytes(3, "big") * 2
        + ((sample_rate << 44) | (0 << 41) | (15 << 36) | frames * block).to_bytes(8, "big")
        + bytes(16)
    )
    stream = bytearray(b"fLaC" + bytes([0x80]) + len(info).to_bytes(3, "big") + info)
    for number in range(frames):
        header = bytes([0xFF, 0xF8, 0x70, 0x08]) + _utf8_number(number) + (block - 1).to_bytes(2, "big")
        header += bytes([_crc8(header)])
        frame = header + bytes([0x00]) + (0).to_bytes(2, "big")
        stream += frame + _crc16(frame).to_bytes(2, "big")
    return bytes(stream)


def _utf8_number(value: int) -> bytes:
    if value < 0x80:
        return bytes([value])
    length = 2 if value < 0x800 else 3 if value < 0x10000 else 4
    tail = [0x80 | ((value >> (6 * i)) & 0x3F) for i in range(length - 1)][::-1]
    lead = ((0xFF00 >> length) & 0xFF) | (value >> (6 * (length - 1)))
    return bytes([lead, *tail])


def _crc8(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


def _crc16(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x8005) & 0xFFFF if crc & 0x8000 else (crc << 1) & 0xFFFF
    return crc
