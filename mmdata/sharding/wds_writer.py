"""Write episodes into WebDataset tar shards with every member's byte range in the manifest.

Members of one episode share its key (`episode_000042.cam_high.00003.mp4`), so the plain
`webdataset` library yields one sample per episode. A shard is written under a temporary
name and renamed when complete; its manifest rows and the converter's checkpoint are then
saved beside it, so an interrupted conversion resumes after the last complete shard.
"""

from __future__ import annotations

import base64
import io
import json
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from mmdata.checks import parse_json
from mmdata.codecs.lowdim import encode_npy
from mmdata.codecs.video_encode import VIDEO_CODECS
from mmdata.conversion.encode import EncodedEpisode
from mmdata.errors import DestinationError
from mmdata.schema import Stream
from mmdata.sharding.checksum import checksum_bytes
from mmdata.sharding.layout import PARTIAL_DIR, SHARDS_DIR
from mmdata.sharding.manifest import PACKETS_SUFFIX, Piece, base_row, episode_key, packets_column, span_columns

TAR_BLOCK = 512


def shard_name(index: int) -> str:
    return f"{SHARDS_DIR}/shard-{index:06d}.tar"


def segment_member(key: str, stream: str, segment: int, codec: str) -> str:
    return f"{key}.{stream}.{segment:05d}.{VIDEO_CODECS[codec][2]}"


def timestamps_member(key: str, stream: str) -> str:
    return f"{key}.{stream}.timestamps.npy"


def values_member(key: str, stream: str) -> str:
    return f"{key}.{stream}.npy"


def audio_member(key: str, stream: str, codec: str) -> str:
    return f"{key}.{stream}.{codec}"


def episode_members(episode: EncodedEpisode, key: str, index: int) -> list[tuple[str, bytes]]:
    """The tar members of one episode, in a fixed order: meta, task, then each stream."""
    meta = {
        "episode_index": index,
        "source": episode.source,
        "task": episode.task,
        "duration": episode.duration,
        "metadata": episode.metadata,
    }
    members = [
        (f"{key}.json", json.dumps(meta, sort_keys=True).encode()),
        (f"{key}.task.txt", episode.task.encode()),
    ]
    for video in episode.videos:
        name = video.spec.name
        members.append((timestamps_member(key, name), encode_npy(video.timestamps)))
        members += [(segment_member(key, name, i, video.spec.codec), data) for i, data in enumerate(video.segments)]
    for audio in episode.audio:
        members.append((audio_member(key, audio.spec.name, audio.spec.codec), audio.data))
    for stream in episode.lowdim:
        members.append((values_member(key, stream.spec.name), encode_npy(stream.values)))
        members.append((timestamps_member(key, stream.spec.name), encode_npy(stream.timestamps)))
    return members


def _member_bytes_on_disk(size: int) -> int:
    return TAR_BLOCK + -(-size // TAR_BLOCK) * TAR_BLOCK


class WdsWriter:
    """Append episodes to shards of about `shard_bytes`; an episode never spans two shards."""

    def __init__(self, root: str | os.PathLike, shard_bytes: int):
        self.root = Path(root)
        self.shard_bytes = shard_bytes
        self.partial = self.root / PARTIAL_DIR
        self._rows: list[dict[str, Any]] = []
        self._shard_rows: list[dict[str, Any]] = []
        self._shard_index = 0
        self._tar: tarfile.TarFile | None = None
        self._file: BinaryIO | None = None
        self._checkpoint: dict[str, Any] | None = None

    def restore(self) -> dict[str, Any] | None:
        """Load the rows of complete shards; drop partial ones. Returns the last checkpoint."""
        (self.root / SHARDS_DIR).mkdir(parents=True, exist_ok=True)
        self.partial.mkdir(exist_ok=True)
        checkpoint = None
        index = 0
        while (self.partial / f"shard-{index:06d}.json").exists() and (self.root / shard_name(index)).exists():
            sidecar = self.partial / f"shard-{index:06d}.json"
            try:
                record = parse_json(sidecar.read_bytes(), max_bytes=1 << 30)
                if not isinstance(record, dict) or not isinstance(record.get("rows"), list):
                    raise ValueError("holds no list of manifest rows")
                if not all(isinstance(row, dict) for row in record["rows"]):
                    raise ValueError("holds a manifest row that is not an object")
            except ValueError as exc:
                raise DestinationError(f"{sidecar} {exc}; convert again with --overwrite") from exc
            self._rows.extend(_row_from_json(row, sidecar) for row in record["rows"])
            checkpoint = record.get("checkpoint")
            index += 1
        self._shard_index = index
        complete = {Path(shard_name(i)).name for i in range(index)}
        for stale in (self.root / SHARDS_DIR).iterdir():
            if stale.name not in complete:
                stale.unlink()
        return checkpoint

    def add(self, episode: EncodedEpisode, index: int, checkpoint: dict[str, Any]) -> None:
        key = episode_key(index)
        members = episode_members(episode, key, index)
        episode_bytes = sum(_member_bytes_on_disk(len(data)) for _, data in members)
        if self._tar is not None and self._tar.offset + episode_bytes > self.shard_bytes and self._shard_rows:
            self._close_shard()
        if self._tar is None:
            self._open_shard()
        shard = shard_name(self._shard_index)
        written: dict[str, Piece] = {}
        for name, data in members:
            offset = self._add_member(name, data)
            written[name] = Piece(shard, offset, len(data), checksum_bytes(data))
        self._shard_rows.append(_episode_row(episode, index, key, shard, written))
        self._checkpoint = checkpoint

    def finish(self, checkpoint: dict[str, Any], streams: list[Stream]) -> list[dict[str, Any]]:
        """Close the last shard (saving `checkpoint` beside it); every manifest row in episode order."""
        self._checkpoint = checkpoint
        if self._tar is not None:
            self._close_shard()
        return self._rows

    def _open_shard(self) -> None:
        path = self.root / f"{shard_name(self._shard_index)}.tmp"
        # Both stay open across add() calls until the shard is full; _close_shard closes them.
        self._file = open(path, "wb")  # noqa: SIM115
        self._tar = tarfile.TarFile(fileobj=self._file, mode="w", format=tarfile.USTAR_FORMAT)

    def _add_member(self, name: str, data: bytes) -> int:
        assert self._tar is not None
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = 0o644
        info.mtime = 0
        header = info.tobuf(self._tar.format, self._tar.encoding, self._tar.errors)
        data_offset = self._tar.offset + len(header)
        self._tar.addfile(info, io.BytesIO(data))
        return data_offset

    def _close_shard(self) -> None:
        assert self._tar is not None and self._file is not None
        self._tar.close()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        temporary = Path(self._file.name)
        os.replace(temporary, self.root / shard_name(self._shard_index))
        record = {"rows": [_row_to_json(row) for row in self._shard_rows], "checkpoint": self._checkpoint}
        sidecar = self.partial / f"shard-{self._shard_index:06d}.json"
        sidecar.with_suffix(".tmp").write_text(json.dumps(record))
        os.replace(sidecar.with_suffix(".tmp"), sidecar)
        self._rows.extend(self._shard_rows)
        self._shard_rows = []
        self._shard_index += 1
        self._tar = None
        self._file = None


def _episode_row(episode: EncodedEpisode, index: int, key: str, shard: str, pieces: dict[str, Piece]) -> dict[str, Any]:
    row = base_row(index, episode.source, episode.task, episode.duration, episode.metadata, shard)
    row["members"] = [
        {"name": name, "offset": p.offset, "size": p.size, "checksum": p.checksum} for name, p in pieces.items()
    ]
    for video in episode.videos:
        name = video.spec.name
        segment_pieces = [pieces[segment_member(key, name, i, video.spec.codec)] for i in range(len(video.segments))]
        row.update(span_columns(video))
        row[f"{name}/timestamps"] = pieces[timestamps_member(key, name)].to_dict()
        row[packets_column(name)] = video.packet_records()
        row[f"{name}/segments"] = [
            {"first_frame": first, "num_frames": count, **piece.to_dict()}
            for first, count, piece in zip(video.first_frames, video.segment_frames, segment_pieces)
        ]
    for audio in episode.audio:
        name = audio.spec.name
        row.update(span_columns(audio))
        row[f"{name}/data"] = pieces[audio_member(key, name, audio.spec.codec)].to_dict()
    for stream in episode.lowdim:
        name = stream.spec.name
        row.update(span_columns(stream))
        row[f"{name}/data"] = pieces[values_member(key, name)].to_dict()
        row[f"{name}/timestamps"] = pieces[timestamps_member(key, name)].to_dict()
    return row


def _row_to_json(row: dict[str, Any]) -> dict[str, Any]:
    """A manifest row as JSON can hold it: packet indexes' bytes as base64 text."""
    return _with_packet_bytes(row, lambda value: base64.b64encode(value).decode("ascii"))


def _row_from_json(row: dict[str, Any], sidecar: Path) -> dict[str, Any]:
    try:
        return _with_packet_bytes(row, lambda value: base64.b64decode(value, validate=True))
    except (TypeError, AttributeError, ValueError) as exc:
        raise DestinationError(
            f"{sidecar} holds a damaged packet index ({exc}); convert again with --overwrite"
        ) from exc


def _with_packet_bytes(row: dict[str, Any], convert: Callable[[Any], Any]) -> dict[str, Any]:
    """`row` with `convert` applied to every field of its packet-index records."""
    converted = dict(row)
    for column, records in row.items():
        if column.endswith(PACKETS_SUFFIX) and isinstance(records, list):
            converted[column] = [None if r is None else {k: convert(v) for k, v in r.items()} for r in records]
    return converted
