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
import re
import tarfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from mmdata.checks import dump_json, parse_json
from mmdata.codecs.lowdim import encode_npy
from mmdata.codecs.video_encode import SEGMENT_SUFFIXES
from mmdata.errors import DestinationError
from mmdata.schema import Stream
from mmdata.store.checksum import checksum_bytes
from mmdata.store.encoded import EncodedEpisode
from mmdata.store.filesystem import create_afresh, write_text_atomically
from mmdata.store.layout import CONVERT_AGAIN, PARTIAL_DIR, SHARDS_DIR, start_again
from mmdata.store.manifest import PACKETS_SUFFIX, Piece, base_row, episode_key, packets_column, span_columns

DEFAULT_SHARD_BYTES = 1 << 30  # a shard's size, unless a conversion chooses another (`--shard-bytes`)
TAR_BLOCK = 512
TAR_ENCODING = "utf-8"
TAR_ERRORS = "strict"
_SHARD_FILE = re.compile(r"shard-(\d{6,})\.tar(\.tmp)?")


def shard_name(index: int) -> str:
    return f"{SHARDS_DIR}/shard-{index:06d}.tar"


def shard_number(name: str) -> int | None:
    """The number of the shard `shard_name` names `name` (a path ending in it, or its unfinished `.tmp`)."""
    named = _SHARD_FILE.fullmatch(name.rsplit("/", 1)[-1])
    return int(named.group(1)) if named else None


def segment_member(key: str, stream: str, segment: int, codec: str) -> str:
    return f"{key}.{stream}.{segment:05d}.{SEGMENT_SUFFIXES[codec]}"


def timestamps_member(key: str, stream: str) -> str:
    return f"{key}.{stream}.timestamps.npy"


def values_member(key: str, stream: str) -> str:
    return f"{key}.{stream}.npy"


def audio_member(key: str, stream: str, codec: str) -> str:
    return f"{key}.{stream}.{codec}"


def meta_member(key: str) -> str:
    return f"{key}.json"


def episode_meta(index: int, source: str, task: str, duration: float, metadata: dict[str, Any]) -> bytes:
    """The `<key>.json` member: the one member whose bytes depend on the episode's number."""
    meta = {"episode_index": index, "source": source, "task": task, "duration": duration, "metadata": metadata}
    return json.dumps(meta, sort_keys=True).encode()


def episode_members(episode: EncodedEpisode, key: str, index: int) -> list[tuple[str, bytes]]:
    """The tar members of one episode, in a fixed order: meta, task, then each stream."""
    members = [
        (meta_member(key), episode_meta(index, episode.source, episode.task, episode.duration, episode.metadata)),
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


def member_header(name: str, size: int) -> tuple[tarfile.TarInfo, bytes]:
    """The header of member `name` of `size` bytes: one block, or a PAX extended header before it when the
    name does not fit the 100 ASCII bytes of a plain one (long or non-ASCII stream names)."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    info.mtime = 0
    return info, info.tobuf(tarfile.PAX_FORMAT, TAR_ENCODING, TAR_ERRORS)


def member_disk_bytes(name: str, size: int) -> int:
    """Bytes member `name` of `size` bytes takes in a tar: its header and its data padded to blocks."""
    return len(member_header(name, size)[1]) + -(-size // TAR_BLOCK) * TAR_BLOCK


def starts_new_shard(shard_offset: int, episode_bytes: int, shard_bytes: int, shard_has_episodes: bool) -> bool:
    """The packing rule: an episode that would take a shard holding others past `shard_bytes` opens the next
    one (so an episode never spans two shards, and one larger than `shard_bytes` has a shard to itself)."""
    return shard_has_episodes and shard_offset + episode_bytes > shard_bytes


class ShardTar:
    """One shard being written into `file`: episodes appended as tar members, their manifest rows kept."""

    def __init__(self, file: BinaryIO, shard: str):
        self.shard = shard
        self.rows: list[dict[str, Any]] = []
        self._tar = tarfile.TarFile(
            fileobj=file, mode="w", format=tarfile.PAX_FORMAT, encoding=TAR_ENCODING, errors=TAR_ERRORS
        )

    @property
    def offset(self) -> int:
        """Bytes written so far."""
        return self._tar.offset

    def add(self, episode: EncodedEpisode, index: int, members: list[tuple[str, bytes]] | None = None) -> None:
        """Append episode number `index`; `members` are its `episode_members`, when the caller already made them."""
        key = episode_key(index)
        written: dict[str, Piece] = {}
        for name, data in members if members is not None else episode_members(episode, key, index):
            offset = self._add_member(name, data)
            written[name] = Piece(self.shard, offset, len(data), checksum_bytes(data))
        self.rows.append(_episode_row(episode, index, key, self.shard, written))

    def close(self) -> None:
        """Write the end-of-archive blocks; the caller closes the file."""
        self._tar.close()

    def _add_member(self, name: str, data: bytes) -> int:
        info, header = member_header(name, len(data))
        data_offset = self._tar.offset + len(header)
        self._tar.addfile(info, io.BytesIO(data))
        return data_offset


def shard_record(rows: list[dict[str, Any]], checkpoint: dict[str, Any] | None) -> str:
    """The sidecar saved beside a complete shard: its manifest rows and the state to resume from after it."""
    return dump_json({"rows": [_row_to_json(row) for row in rows], "checkpoint": checkpoint})


def read_shard_record(
    text: bytes, where: str, restart: str = CONVERT_AGAIN
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """(rows, checkpoint) of a sidecar `shard_record` made; DestinationError naming `where` if damaged, saying how
    to start again (`restart`)."""
    try:
        record = parse_json(text, max_bytes=1 << 30)
        if not isinstance(record, dict) or not isinstance(record.get("rows"), list):
            raise ValueError("holds no list of manifest rows")
        if not all(isinstance(row, dict) for row in record["rows"]):
            raise ValueError("holds a manifest row that is not an object")
    except ValueError as exc:
        raise DestinationError(f"{where} {exc}; {restart}") from exc
    return [_row_from_json(row, where, restart) for row in record["rows"]], record.get("checkpoint")


def sidecar_name(index: int) -> str:
    """The sidecar's path under the partial folder."""
    return f"shard-{index:06d}.json"


class WdsWriter:
    """Append episodes to shards of about `shard_bytes`; an episode never spans two shards. The first shard
    written is number `first_shard` (an append's: after the store's own, which are never touched)."""

    def __init__(self, root: str | os.PathLike, shard_bytes: int, first_shard: int = 0):
        self.root = Path(root)
        self.shard_bytes = shard_bytes
        self.first_shard = first_shard
        self.partial = self.root / PARTIAL_DIR
        self._rows: list[dict[str, Any]] = []
        self._shard_index = first_shard
        self._shard: ShardTar | None = None
        self._file: BinaryIO | None = None
        self._checkpoint: dict[str, Any] | None = None

    def restore(self) -> dict[str, Any] | None:
        """Load the rows of complete shards; drop partial ones. Returns the last checkpoint."""
        (self.root / SHARDS_DIR).mkdir(parents=True, exist_ok=True)
        self.partial.mkdir(exist_ok=True)
        checkpoint = None
        index = self.first_shard
        while (self.partial / sidecar_name(index)).exists() and (self.root / shard_name(index)).exists():
            sidecar = self.partial / sidecar_name(index)
            rows, checkpoint = read_shard_record(sidecar.read_bytes(), str(sidecar), start_again(self.root))
            self._rows.extend(rows)
            index += 1
        self._shard_index = index
        for stale in (self.root / SHARDS_DIR).iterdir():
            number = shard_number(stale.name)
            if number is not None and number >= index:  # this writer's unfinished shards, nothing else
                stale.unlink()
        return checkpoint

    def add(self, episode: EncodedEpisode, index: int, checkpoint: dict[str, Any]) -> None:
        members = episode_members(episode, episode_key(index), index)
        episode_bytes = sum(member_disk_bytes(name, len(data)) for name, data in members)
        if self._shard is not None and starts_new_shard(
            self._shard.offset, episode_bytes, self.shard_bytes, bool(self._shard.rows)
        ):
            self._close_shard()
        if self._shard is None:
            self._open_shard()
        assert self._shard is not None
        self._shard.add(episode, index, members)
        self._checkpoint = checkpoint

    def finish(self, checkpoint: dict[str, Any], streams: Sequence[Stream]) -> list[dict[str, Any]]:
        """Close the last shard (saving `checkpoint` beside it); every manifest row in episode order."""
        self._checkpoint = checkpoint
        if self._shard is not None:
            self._close_shard()
        return self._rows

    def durable(self) -> bool:
        return bool(self._rows)

    def discard(self) -> None:
        """Close and remove the shard being written (not durable until closed)."""
        if self._file is not None:
            self._file.close()
            self._writing().unlink(missing_ok=True)
            self._shard = self._file = None

    def _writing(self) -> Path:
        """The name the shard being written has until it is full."""
        return self.root / f"{shard_name(self._shard_index)}.tmp"

    def _open_shard(self) -> None:
        # Stays open across add() calls until the shard is full; _close_shard closes it.
        self._file = create_afresh(self._writing())
        self._shard = ShardTar(self._file, shard_name(self._shard_index))

    def _close_shard(self) -> None:
        assert self._shard is not None and self._file is not None
        self._shard.close()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        publish_without_replacing(self._writing(), self.root / shard_name(self._shard_index))
        sidecar = self.partial / sidecar_name(self._shard_index)
        write_text_atomically(str(sidecar), shard_record(self._shard.rows, self._checkpoint))
        self._rows.extend(self._shard.rows)
        self._shard_index += 1
        self._shard = None
        self._file = None


def publish_without_replacing(written: Path, target: Path) -> None:
    """Give the finished file `written` its name `target`, which must not exist: a writer never replaces a piece
    of a store (linked, then the temporary name removed; where links are not possible, renamed after a check)."""
    try:
        os.link(written, target)
    except FileExistsError:
        written.unlink()
        raise DestinationError(
            f"'{target}' already exists: a store's shards are never written over; nothing of it was changed"
        ) from None
    except OSError:
        if target.exists():
            written.unlink()
            raise DestinationError(f"'{target}' already exists: a store's shards are never written over") from None
        os.replace(written, target)
        return
    written.unlink()


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


def _row_from_json(row: dict[str, Any], sidecar: str, restart: str) -> dict[str, Any]:
    try:
        return _with_packet_bytes(row, lambda value: base64.b64decode(value, validate=True))
    except (TypeError, AttributeError, ValueError) as exc:
        raise DestinationError(f"{sidecar} holds a damaged packet index ({exc}); {restart}") from exc


def _with_packet_bytes(row: dict[str, Any], convert: Callable[[Any], Any]) -> dict[str, Any]:
    """`row` with `convert` applied to the byte fields of its packet-index records (not their checksums)."""
    converted = dict(row)
    for column, records in row.items():
        if column.endswith(PACKETS_SUFFIX) and isinstance(records, list):
            converted[column] = [
                None if r is None else {k: v if k == "checksum" else convert(v) for k, v in r.items()} for r in records
            ]
    return converted
