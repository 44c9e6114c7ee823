"""The interface every video decoding backend implements."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Literal

from mmdata.codecs.decoders.availability import backends_for_codec
from mmdata.codecs.decoders.requests import ClipRequest, DecodeStats
from mmdata.codecs.geometry import fit_frames
from mmdata.errors import DecodeError, UnsupportedCodecError

OnError = Literal["raise", "skip"]


class VideoDecoder(ABC):
    """Decodes batches of clip requests to uint8 frames `[F, H, W, 3]`, one array per request.

    A decoder is built once per loader for the codecs of its streams; it holds no per-episode
    state, so its memory does not grow with the dataset, and it is safe to build before
    DataLoader workers fork (backends with native resources create them lazily per process).
    """

    name: str = ""
    device: str = "cpu"
    codecs: frozenset[str] = frozenset()
    # Whether the backend delivers requests' `geometry` itself (else frames are fitted after decoding).
    fits_geometry: bool = False
    # Whether it converts frames straight into `[F, 3, H, W]` when a request asks (`ClipRequest.channels_first`).
    writes_channels_first: bool = False
    # Whether decoding comes in two halves: `prepare` (host work, done where the micro-batch is read: in a loader
    # worker) and `decode_prepared` (where the frames are decoded: the GPU's process). A batch is decoded as it was
    # prepared, so a loader keeps no frame cache for such a decoder (the cache changes what is decoded).
    prepares: bool = False

    def __init__(self) -> None:
        self.stats = DecodeStats()

    def check_codecs(self, codecs: Sequence[str]) -> None:
        """Fail now, at build time, for a codec this backend cannot decode, naming one that can."""
        for codec in codecs:
            if codec not in self.codecs:
                able = [name for name in backends_for_codec(codec) if name != self.name]
                fix = f"use decoder='{able[0]}'" if able else "no installed backend decodes it"
                raise UnsupportedCodecError(
                    f"decoder '{self.name}' ({self.device}) cannot decode {codec} video; {fix}"
                    f" (decoder '{self.name}' decodes {', '.join(sorted(self.codecs))})"
                )

    def decode(self, requests: Sequence[ClipRequest], on_error: OnError = "raise") -> list[Any]:
        """Frames for every request, in order; with on_error="skip" a request that fails is None."""
        started, cpu_started = time.perf_counter(), time.thread_time()
        try:
            return self.fitted(requests, self._decode_batch(list(requests), on_error))
        finally:
            self.stats.seconds += time.perf_counter() - started
            self.stats.cpu_seconds += time.thread_time() - cpu_started

    def prepare(self, requests: list[ClipRequest]) -> tuple:
        """The host half of decoding `requests`, for `decode_prepared` (decoders that `prepares` only)."""
        raise NotImplementedError(f"decoder '{self.name}' decodes in one call (decode), it prepares nothing")

    def decode_prepared(self, requests: list[ClipRequest], prepared: tuple, on_error: OnError = "raise") -> list[Any]:
        """Frames for every request from what `prepare(requests)` returned, as `decode` gives them."""
        raise NotImplementedError(f"decoder '{self.name}' decodes in one call (decode), it prepares nothing")

    def fitted(self, requests: Sequence[ClipRequest], outputs: list[Any]) -> list[Any]:
        """Outputs cut to their cameras' own size (`ClipRequest.display_size`), or cropped and scaled to their
        requests' geometry where the backend did not do it."""
        return [self._fit(request, frames) for request, frames in zip(requests, outputs)]

    def _fit(self, request: ClipRequest, frames: Any) -> Any:
        if frames is None or not len(frames):
            return frames
        if request.geometry is not None:  # its box lies inside the camera's own size
            return frames if self.fits_geometry else fit_frames(frames, request.geometry)
        if request.display_size is not None:
            width, height = request.display_size
            if request.channels_first and self.writes_channels_first:
                return frames[:, :, :height, :width]
            return frames[:, :height, :width]
        return frames

    @abstractmethod
    def _decode_batch(self, requests: list[ClipRequest], on_error: OnError) -> list[Any]:
        """Frames (or None when skipped) for every request, counted into `self.stats`."""

    def _count(self, request: ClipRequest, decoded: int) -> None:
        self.stats.requests += 1
        self.stats.frames_delivered += len(request.frames)
        self.stats.frames_decoded += decoded

    def _settled(self, requests: Sequence[ClipRequest], outcomes: Sequence[tuple], on_error: OnError) -> list[Any]:
        """Each request's frames from its (frames, frames decoded, DecodeError or None) outcome, decoded elsewhere
        (threads): failures raised or skipped as `on_error` says, the rest counted."""
        results: list[Any] = []
        for request, (frames, decoded, failure) in zip(requests, outcomes):
            if failure is not None:
                self._failed(request, failure, on_error)
                results.append(None)
                continue
            self._count(request, decoded)
            results.append(frames)
        return results

    def _failed(self, request: ClipRequest, error: Exception, on_error: OnError) -> None:
        message = f"{request.place()}: {request.codec} video does not decode with '{self.name}': {error}"
        if on_error == "raise":
            failure = DecodeError(message)
            failure.where = request.where
            raise failure from error
        self.stats.skipped += 1
        if len(self.stats.skipped_where) < 100:
            self.stats.skipped_where.append(message)
        return None

    @abstractmethod
    def describe(self) -> str:
        """One line naming the backend and its settings, for logs and benchmark tables."""


class SequentialDecoder(VideoDecoder):
    """A CPU backend that decodes one request after another in the calling process."""

    def _decode_batch(self, requests: list[ClipRequest], on_error: OnError) -> list[Any]:
        results: list[Any] = []
        for request in requests:
            try:
                frames, decoded = self._decode_one(request)
            except DecodeError as exc:
                self._failed(request, exc, on_error)
                results.append(None)
                continue
            self._count(request, decoded)
            results.append(frames)
        return results

    @abstractmethod
    def _decode_one(self, request: ClipRequest) -> tuple[Any, int]:
        """(frames, number of frames decoded) for one request; raises DecodeError."""
