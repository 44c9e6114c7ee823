"""Check a store end to end: every piece against its checksum, every segment and track decodes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from tqdm import tqdm

from mmdata.codecs.decoders.pyav_decoder import decode_all_frames
from mmdata.codecs.packet_index import index_describes
from mmdata.errors import MmdataError
from mmdata.schema import AudioStream, LowdimStream, VideoStream
from mmdata.store.handle import Store
from mmdata.store.manifest import Piece

T = TypeVar("T")


@dataclass
class EpisodeFailure:
    index: int
    source: str
    problems: list[str]


@dataclass
class VerifyReport:
    episodes: int = 0
    pieces: int = 0
    bytes_read: int = 0
    frames_decoded: int = 0
    failures: list[EpisodeFailure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


class _EpisodeChecker:
    """Checks one episode, reading every piece once and collecting problems instead of stopping."""

    def __init__(self, dataset: Store, report: VerifyReport):
        self.dataset = dataset
        self.report = report
        self.problems: list[str] = []

    def _read(self, what: str, piece: Piece, read: Callable[[], T]) -> T | None:
        """`read()` of `piece`, counted when it succeeds; a failure is recorded as a problem."""
        value = self._attempt(what, read)
        if value is not None:
            self.report.pieces += 1
            self.report.bytes_read += piece.size
        return value

    def _attempt(self, what: str, read: Callable[[], T]) -> T | None:
        try:
            return read()
        except (MmdataError, OSError) as exc:
            self.problems.append(f"{what}: {exc}")
            return None

    def check(self, index: int) -> list[str]:
        if index in self.dataset.damaged:
            return [self.dataset.damaged[index]]
        row = self.dataset.manifest.row(index)
        self._attempt("metadata", lambda: self.dataset.metadata_of(row))
        self._check_other_members(row)
        for stream in self.dataset.schema.streams:
            if isinstance(stream, VideoStream):
                self._check_video(row, stream)
            elif isinstance(stream, AudioStream):
                self._check_audio(row, stream)
            elif isinstance(stream, LowdimStream):
                self._check_lowdim(row, stream)
        return self.problems

    def _check_other_members(self, row: dict) -> None:
        """The tar members no stream reads (the episode's JSON and task text), against their checksums."""
        read_by_streams = {
            piece["offset"]
            for name in row
            if "/" in name and isinstance(row[name], (dict, list))
            for piece in (row[name] if isinstance(row[name], list) else [row[name]])
            if isinstance(piece, dict) and "offset" in piece
        }
        for member in row["members"] or []:
            if member["offset"] not in read_by_streams:
                piece = Piece(row["shard"], member["offset"], member["size"], member["checksum"])
                self._read(member["name"], piece, partial(self.dataset.pieces.read_bytes, piece))

    def _check_video(self, row: dict, stream: VideoStream) -> None:
        name = stream.name
        times = Piece.from_dict(row[f"{name}/timestamps"])
        self._read(f"{name} timestamps", times, partial(self.dataset.timestamps_of, row, name))
        table = self._attempt(f"{name} packet indexes", partial(self.dataset.segment_table, row, name))
        for number, segment in enumerate(row[f"{name}/segments"]):
            what = f"{name} segment {number}"
            piece = Piece.from_dict(segment)
            data = self._read(what, piece, partial(self.dataset.pieces.read_bytes, piece))
            if data is None:
                continue
            size = stream.coded_size
            frames = self._attempt(what, partial(decode_all_frames, data, stream.codec, size, segment["num_frames"]))
            if frames is None:
                continue
            self.report.frames_decoded += len(frames)
            if len(frames) != segment["num_frames"]:
                self.problems.append(f"{what}: decodes to {len(frames)} frames, manifest says {segment['num_frames']}")
            stored = table.indexes[number] if table is not None else None
            if stored is not None and not self._attempt(what, partial(index_describes, stored, data)):
                self.problems.append(f"{what}: its packet index does not describe its bytes; convert the store again")

    def _check_audio(self, row: dict, stream: AudioStream) -> None:
        piece = Piece.from_dict(row[f"{stream.name}/data"])
        self._read(stream.name, piece, partial(self.dataset.audio_track_of, row, stream.name))

    def _check_lowdim(self, row: dict, stream: LowdimStream) -> None:
        name = stream.name
        values = Piece.from_dict(row[f"{name}/data"])
        shape = (row[f"{name}/count"], *stream.shape)
        self._read(name, values, partial(self.dataset.pieces.read_rows, values, shape, stream.dtype))
        times = Piece.from_dict(row[f"{name}/timestamps"])
        self._read(f"{name} timestamps", times, partial(self.dataset.timestamps_of, row, name))


def verify_dataset(path_or_url: str, progress: bool = True) -> VerifyReport:
    """Re-read and decode every piece of every episode; failures are collected per episode."""
    dataset = Store(str(path_or_url))
    report = VerifyReport()
    sources = dataset.table.column("source").to_pylist()
    for index in tqdm(range(len(dataset)), unit="episode", desc="verify", disable=not progress):
        problems = _EpisodeChecker(dataset, report).check(index)
        report.episodes += 1
        if problems:
            report.failures.append(EpisodeFailure(index, str(sources[index]), problems))
    return report
