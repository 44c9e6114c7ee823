"""Check a store end to end: every piece against its checksum, every segment and track decodes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from tqdm import tqdm

from mmdata.codecs.decoders.pyav_decoder import decode_all_frames
from mmdata.dataset import Dataset
from mmdata.errors import MmdataError
from mmdata.schema import AudioStream, LowdimStream, VideoStream
from mmdata.sharding.manifest import Piece

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
    """Checks one episode, reading every blob once and collecting problems instead of stopping."""

    def __init__(self, dataset: Dataset, report: VerifyReport):
        self.dataset = dataset
        self.report = report
        self.problems: list[str] = []
        self._blobs: dict[tuple[str, int], bytes | None] = {}

    def blob(self, piece: Piece, what: str) -> bytes | None:
        key = (piece.path, piece.offset)
        if key not in self._blobs:
            self._blobs[key] = self._attempt(what, lambda: self.dataset.pieces.read_bytes(piece))
            if self._blobs[key] is not None:
                self.report.pieces += 1
                self.report.bytes_read += piece.size
        return self._blobs[key]

    def rows(self, piece: Piece, shape: tuple[int, ...], dtype: str, what: str):
        values = self._attempt(what, lambda: self.dataset.pieces.read_rows(piece, shape, dtype))
        if values is not None:
            self.report.pieces += 1
            self.report.bytes_read += piece.size
        return values

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
        for member in row["members"] or []:
            self.blob(Piece(row["shard"], member["offset"], member["size"], member["checksum"]), member["name"])
        for stream in self.dataset.schema.streams:
            if isinstance(stream, VideoStream):
                self._check_video(row, stream)
            elif isinstance(stream, AudioStream):
                self._check_audio(row, stream)
            elif isinstance(stream, LowdimStream):
                self._check_lowdim(row, stream)
        return self.problems

    def _check_video(self, row: dict, stream: VideoStream) -> None:
        name = stream.name
        self._attempt(f"{name} timestamps", lambda: self.dataset.timestamps_of(row, name))
        for number, segment in enumerate(row[f"{name}/segments"]):
            what = f"{name} segment {number}"
            data = self.blob(Piece.from_dict(segment), what)
            if data is None:
                continue
            size = (stream.width, stream.height)
            frames = self._attempt(what, partial(decode_all_frames, data, stream.codec, size, segment["num_frames"]))
            if frames is None:
                continue
            self.report.frames_decoded += len(frames)
            if len(frames) != segment["num_frames"]:
                self.problems.append(f"{what}: decodes to {len(frames)} frames, manifest says {segment['num_frames']}")

    def _check_audio(self, row: dict, stream: AudioStream) -> None:
        self._attempt(stream.name, lambda: self.dataset.audio_track_of(row, stream.name))

    def _check_lowdim(self, row: dict, stream: LowdimStream) -> None:
        name = stream.name
        count = row[f"{name}/count"]
        self.rows(Piece.from_dict(row[f"{name}/data"]), (count, *stream.shape), stream.dtype, name)
        self._attempt(f"{name} timestamps", lambda: self.dataset.timestamps_of(row, name))


def verify_dataset(path_or_url: str, progress: bool = True) -> VerifyReport:
    """Re-read and decode every piece of every episode; failures are collected per episode."""
    dataset = Dataset(str(path_or_url))
    report = VerifyReport()
    sources = dataset.table.column("source").to_pylist()
    for index in tqdm(range(len(dataset)), unit="episode", desc="verify", disable=not progress):
        problems = _EpisodeChecker(dataset, report).check(index)
        report.episodes += 1
        if problems:
            report.failures.append(EpisodeFailure(index, str(sources[index]), problems))
    return report
