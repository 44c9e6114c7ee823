"""`open_dataset`: a reader of decoded episodes and frames, a thin layer of a decoder over a `Store`.

The store handle (`mmdata.store.handle.Store`) plans and reads; a `Dataset` adds the one thing that
needs a decoder: turning a camera's segment requests into frames. The loader does not use this class:
it holds store handles and decodes in its own decode stage.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, overload

import numpy as np

from mmdata.codecs.decoders import VideoDecoder, make_video_decoder
from mmdata.codecs.decoders.base import OnError
from mmdata.store.filesystem import DEFAULT_READ_POLICY, ReadPolicy
from mmdata.store.handle import (
    OPENED_CACHE_BYTES,
    EpisodeData,
    Store,
    StreamData,
    Times,
    assemble_frames,
    open_store,
)

# What a Dataset offers of its store as its own (the methods documented before the store handle existed).
STORE_ATTRIBUTES = frozenset(
    {
        "url",
        "fs",
        "root",
        "schema",
        "manifest",
        "pieces",
        "cache",
        "read_policy",
        "codecs",
        "damaged",
        "table",
        "metadata_of",
        "plan_frames",
        "plan_span",
        "align_frames",
        "read_segments",
        "row_pieces",
        "segment_table",
        "values_at",
        "audio_between",
        "timestamps_of",
        "audio_track_of",
    }
)


class Dataset:
    """Decoded episodes and frames of a store: a `Store` (`store`, or a path or URL to open one with
    `verify`, `cache_bytes` and `read_policy`) and a `VideoDecoder` (`decoder`).

    `decoder` is a backend name (see `mmdata.codecs.decoders.make_video_decoder`; "auto" picks the
    fastest CPU backend here, since `read_episode` hands back numpy arrays) or a built `VideoDecoder`;
    it is checked against the store's codecs now, not on the first frame. The store's schema,
    manifest, `plan_frames`, `values_at`, `audio_between` and the rest are offered here as they are
    on the store (see `STORE_ATTRIBUTES`).
    """

    def __init__(
        self,
        store: Store | str,
        decoder: str | VideoDecoder = "auto",
        verify: bool = True,
        cache_bytes: int = OPENED_CACHE_BYTES,
        read_policy: ReadPolicy = DEFAULT_READ_POLICY,
    ):
        if not isinstance(store, Store):
            store = open_store(store, verify, cache_bytes, read_policy)
        self.store = store
        if isinstance(decoder, VideoDecoder):
            decoder.check_codecs(store.codecs)
            self.decoder = decoder
        else:
            self.decoder = make_video_decoder(decoder, store.codecs, device="cpu")

    def __getattr__(self, name: str) -> Any:
        if name in STORE_ATTRIBUTES:
            return getattr(self.store, name)
        raise AttributeError(f"'Dataset' object has no attribute '{name}'")

    def __len__(self) -> int:
        return len(self.store)

    def read_episode(
        self,
        index: int,
        streams: Sequence[str] | None = None,
        t0: float | None = None,
        t1: float | None = None,
    ) -> EpisodeData:
        """Decoded values of `streams` (default: all) with timestamps in [t0, t1) seconds."""
        store = self.store
        row = store.manifest.row(index)
        names = list(streams) if streams is not None else [s.name for s in store.schema.streams if s.kind != "text"]
        start = -math.inf if t0 is None else float(t0)
        end = math.inf if t1 is None else float(t1)
        episode = EpisodeData(index, row["key"], row["task"], store.metadata_of(row))
        for name in names:
            kind = store.schema.stream(name).kind
            if kind == "video":
                episode.streams[name] = self._video_span(index, name, start, end)
            elif kind == "audio":
                episode.streams[name] = store.audio_span(index, name, start, end)
            elif kind == "lowdim":
                episode.streams[name] = store.lowdim_span(index, name, start, end)
        return episode

    def _video_span(self, index: int, name: str, start: float, end: float) -> StreamData:
        plan = self.store.plan_span(index, name, start, end)
        if not plan.requests:
            stream = self.store.schema.video(name)
            return StreamData(np.empty((0, stream.height, stream.width, 3), np.uint8), plan.timestamps)
        return assemble_frames(plan, self.decoder.decode(plan.requests))

    @overload
    def frames_at(
        self, index: int, stream: str, times: Times, tolerance: float | None = None, on_error: Literal["raise"] = ...
    ) -> StreamData: ...
    @overload
    def frames_at(
        self, index: int, stream: str, times: Times, tolerance: float | None = None, on_error: OnError = ...
    ) -> StreamData | None: ...
    def frames_at(
        self,
        index: int,
        stream: str,
        times: Times,
        tolerance: float | None = None,
        on_error: OnError = "raise",
    ) -> StreamData | None:
        """Frames `[len(times), H, W, 3]` of camera `stream` at `times`; see `Store.plan_frames`.

        With on_error="skip" a segment that does not decode makes this return None, and the
        decoder's `stats.skipped` counts it.
        """
        plan = self.store.plan_frames(index, stream, times, tolerance)
        decoded = self.decoder.decode(plan.requests, on_error)
        if any(frames is None for frames in decoded):
            return None
        return assemble_frames(plan, decoded)


def open_dataset(
    path_or_url: str,
    decoder: str | VideoDecoder = "auto",
    verify: bool = True,
    cache_bytes: int = OPENED_CACHE_BYTES,
    read_policy: ReadPolicy = DEFAULT_READ_POLICY,
) -> Dataset:
    """Open a store written by `mmdata convert` (a local folder or an fsspec URL) to read decoded episodes.

    `decoder` picks the video backend ("auto", "pyav", "spdl", "decord", "dali-cpu", "dali", "nvdec",
    "spdl-nvdec") or takes a built `VideoDecoder`; a codec it cannot decode fails here. Every piece read is
    checked against its checksum unless `verify=False`. See `Store` for the rest.
    """
    return Dataset(str(path_or_url), decoder, verify, cache_bytes, read_policy)
