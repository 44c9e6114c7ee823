"""Check a store end to end: every piece against its checksum, every segment and track decodes."""

from __future__ import annotations

from dataclasses import dataclass, field

from tqdm import tqdm

from mmdata.codecs.audio import decode_audio
from mmdata.codecs.decoders.pyav_decoder import decode_all_frames
from mmdata.dataset import Dataset
from mmdata.errors import MmdataError
from mmdata.schema import AudioStream, LowdimStream, VideoStream
from mmdata.sharding.checksum import checksum_bytes
from mmdata.sharding.manifest import Piece


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
            self._blobs[key] = self._read_checked(piece, what)
        return self._blobs[key]

    def _read_checked(self, piece: Piece, what: str) -> bytes | None:
        try:
            data = self.dataset.pieces.read_bytes(piece)
        except (OSError, MmdataError, ValueError, KeyError) as exc:
            self.problems.append(f"{what}: cannot read {piece.path}@{piece.offset}: {exc}")
            return None
        self.report.pieces += 1
        self.report.bytes_read += len(data)
        if checksum_bytes(data) != piece.checksum:
            self.problems.append(f"{what}: checksum mismatch in {piece.path}@{piece.offset}")
            return None
        return data

    def rows(self, piece: Piece, count: int, what: str):
        try:
            values, checksum = self.dataset.pieces.read_rows_with_checksum(piece, count)
        except (OSError, MmdataError, ValueError, KeyError) as exc:
            self.problems.append(f"{what}: cannot read {piece.path}@{piece.offset}: {exc}")
            return None
        self.report.pieces += 1
        self.report.bytes_read += piece.size
        if checksum != piece.checksum:
            self.problems.append(f"{what}: checksum mismatch in {piece.path}@{piece.offset}")
            return None
        if len(values) != count:
            self.problems.append(f"{what}: {len(values)} rows, manifest says {count}")
            return None
        return values

    def check(self, row: dict) -> list[str]:
        for member in row["members"]:
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
        self.rows(Piece.from_dict(row[f"{name}/timestamps"]), row[f"{name}/count"], f"{name} timestamps")
        total = 0
        for number, segment in enumerate(row[f"{name}/segments"]):
            what = f"{name} segment {number}"
            data = self.blob(Piece.from_dict(segment), what)
            if data is None:
                continue
            try:
                frames = decode_all_frames(data)
            except MmdataError as exc:
                self.problems.append(f"{what}: {exc}")
                continue
            self.report.frames_decoded += len(frames)
            total += len(frames)
            if len(frames) != segment["num_frames"] or frames.shape[1:3] != (stream.height, stream.width):
                self.problems.append(
                    f"{what}: decodes to {len(frames)} frames of {frames.shape[2]}x{frames.shape[1]},"
                    f" manifest says {segment['num_frames']} of {stream.width}x{stream.height}"
                )
        if total and total != row[f"{name}/count"] and not self.problems:
            self.problems.append(f"{name}: {total} frames in segments, manifest says {row[f'{name}/count']}")

    def _check_audio(self, row: dict, stream: AudioStream) -> None:
        name = stream.name
        data = self.blob(Piece.from_dict(row[f"{name}/data"]), name)
        if data is None:
            return
        try:
            clip, _ = decode_audio(data)
        except MmdataError as exc:
            self.problems.append(f"{name}: {exc}")
            return
        if len(clip.samples) != row[f"{name}/count"] or clip.channels != stream.channels:
            self.problems.append(
                f"{name}: decodes to {len(clip.samples)} samples x {clip.channels} channels,"
                f" manifest says {row[f'{name}/count']} x {stream.channels}"
            )

    def _check_lowdim(self, row: dict, stream: LowdimStream) -> None:
        name = stream.name
        count = row[f"{name}/count"]
        values = self.rows(Piece.from_dict(row[f"{name}/data"]), count, name)
        self.rows(Piece.from_dict(row[f"{name}/timestamps"]), count, f"{name} timestamps")
        if values is not None and (values.shape[1:] != stream.shape or str(values.dtype) != stream.dtype):
            self.problems.append(
                f"{name}: {values.dtype} {values.shape[1:]}, schema says {stream.dtype} {stream.shape}"
            )


def verify_dataset(path_or_url: str, progress: bool = True) -> VerifyReport:
    """Re-read and decode every piece of every episode; failures are collected per episode."""
    dataset = Dataset(str(path_or_url))
    report = VerifyReport()
    for index in tqdm(range(len(dataset)), unit="episode", desc="verify", disable=not progress):
        row = dataset.manifest.row(index)
        problems = _EpisodeChecker(dataset, report).check(row)
        report.episodes += 1
        if problems:
            report.failures.append(EpisodeFailure(index, row["source"], problems))
    return report
