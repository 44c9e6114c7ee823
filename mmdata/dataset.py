"""`open_dataset`: the schema, the manifest and decoded episodes of a store, local or remote."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mmdata.codecs.audio import decode_audio
from mmdata.codecs.video_decode import decode_segment
from mmdata.errors import StoreError
from mmdata.schema import DatasetSchema
from mmdata.sharding.filesystem import join, resolve
from mmdata.sharding.layout import DATASET_FILE, MANIFEST_FILE, PARTIAL_DIR
from mmdata.sharding.manifest import Manifest, Piece
from mmdata.sharding.readers import PieceReader, piece_reader


@dataclass
class StreamData:
    """Values of one stream in a time range and the time of each value (seconds)."""

    values: np.ndarray
    timestamps: np.ndarray


@dataclass
class EpisodeData:
    index: int
    key: str
    task: str
    metadata: dict[str, Any] = field(default_factory=dict)
    streams: dict[str, StreamData] = field(default_factory=dict)

    def __getitem__(self, stream: str) -> StreamData:
        return self.streams[stream]


class Dataset:
    """A converted store. Reads only what a request needs: the manifest, then pieces by address."""

    def __init__(self, url: str):
        self.url = url
        self.fs, self.root = resolve(url)
        self.schema = self._read_schema()
        with self.fs.open(join(self.root, MANIFEST_FILE), "rb") as handle:
            self.manifest = Manifest(pq.read_table(handle))
        self.pieces: PieceReader = piece_reader(self.schema.layout, self.fs, self.root)

    def _read_schema(self) -> DatasetSchema:
        path = join(self.root, DATASET_FILE)
        if not self.fs.exists(path):
            hint = "it is not an mmdata store"
            if self.fs.exists(join(self.root, PARTIAL_DIR)):
                hint = "it holds an unfinished conversion: run `mmdata convert ... --resume` to complete it"
            raise StoreError(f"'{self.url}' has no {DATASET_FILE}: {hint}")
        with self.fs.open(path, "rb") as handle:
            return DatasetSchema.from_json(handle.read().decode(), where=f"{self.url}/{DATASET_FILE}")

    @property
    def table(self) -> pa.Table:
        """The manifest as a pyarrow Table, one row per episode."""
        return self.manifest.table

    def __len__(self) -> int:
        return len(self.manifest)

    def read_episode(
        self,
        index: int,
        streams: Sequence[str] | None = None,
        t0: float | None = None,
        t1: float | None = None,
    ) -> EpisodeData:
        """Decoded values of `streams` (default: all) with timestamps in [t0, t1) seconds."""
        row = self.manifest.row(index)
        names = list(streams) if streams is not None else [s.name for s in self.schema.streams if s.kind != "text"]
        start = -math.inf if t0 is None else float(t0)
        end = math.inf if t1 is None else float(t1)
        episode = EpisodeData(index, row["key"], row["task"], json.loads(row["metadata"] or "{}"))
        for name in names:
            kind = self.schema.stream(name).kind
            reader = {"video": self._read_video, "audio": self._read_audio, "lowdim": self._read_lowdim}.get(kind)
            if reader is None:
                continue
            episode.streams[name] = reader(row, name, start, end)
        return episode

    def _read_video(self, row: dict, name: str, start: float, end: float) -> StreamData:
        timestamps = self.pieces.read_rows(Piece.from_dict(row[f"{name}/timestamps"]), row[f"{name}/count"])
        wanted = np.flatnonzero((timestamps >= start) & (timestamps < end))
        stream = self.schema.stream(name)
        if len(wanted) == 0:
            return StreamData(np.empty((0, stream.height, stream.width, 3), np.uint8), timestamps[wanted])
        clips = []
        for segment in row[f"{name}/segments"]:
            first, count = segment["first_frame"], segment["num_frames"]
            inside = wanted[(wanted >= first) & (wanted < first + count)]
            if len(inside):
                data = self.pieces.read_bytes(Piece.from_dict(segment))
                clips.append(decode_segment(data, inside - first))
        return StreamData(np.concatenate(clips), timestamps[wanted])

    def _read_audio(self, row: dict, name: str, start: float, end: float) -> StreamData:
        clip, _ = decode_audio(self.pieces.read_bytes(Piece.from_dict(row[f"{name}/data"])))
        rate, t_start = clip.sample_rate, row[f"{name}/t_start"]
        first = 0 if start == -math.inf else max(0, math.ceil((start - t_start) * rate - 1e-9))
        last = len(clip.samples) if end == math.inf else max(first, math.ceil((end - t_start) * rate - 1e-9))
        samples = clip.samples[first:last]
        return StreamData(samples, t_start + np.arange(first, first + len(samples)) / rate)

    def _read_lowdim(self, row: dict, name: str, start: float, end: float) -> StreamData:
        count = row[f"{name}/count"]
        timestamps = self.pieces.read_rows(Piece.from_dict(row[f"{name}/timestamps"]), count)
        values = self.pieces.read_rows(Piece.from_dict(row[f"{name}/data"]), count)
        inside = (timestamps >= start) & (timestamps < end)
        return StreamData(values[inside], timestamps[inside])


def open_dataset(path_or_url: str) -> Dataset:
    """Open a store written by `mmdata convert`: a local folder or an fsspec URL."""
    return Dataset(str(path_or_url))
