"""Audio: read any recording PyAV knows, store it as FLAC (lossless) or keep Opus as is."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import av
import numpy as np
from av.codec.context import Flags

from mmdata.errors import DecodeError

FLAC_FRAME_SAMPLES = 4096
_CHANNEL_LAYOUTS = {1: "mono", 2: "stereo", 3: "2.1", 4: "quad", 5: "5.0", 6: "5.1", 7: "6.1", 8: "7.1"}
_INTEGER_FORMATS = {"s16": np.int16, "s16p": np.int16, "s32": np.int32, "s32p": np.int32}


@dataclass
class AudioClip:
    """Samples `[S, C]` at `sample_rate`, the first one at `t_start` seconds."""

    samples: np.ndarray
    sample_rate: int
    t_start: float = 0.0

    @property
    def channels(self) -> int:
        return int(self.samples.shape[1])

    @property
    def duration(self) -> float:
        return self.samples.shape[0] / self.sample_rate


@dataclass(frozen=True)
class AudioLimits:
    """What a decoded track must be: any field left None is not checked.

    `codec`, `sample_rate` and `channels` are checked against the container before decoding, and
    every frame against them too; decoding stops as soon as more than `max_samples` samples (or
    `max_seconds` of audio) come out, so a track cannot expand past what its metadata promised.
    `max_channels` and `max_rate` bound a track whose format is not known in advance.
    """

    codec: str | None = None
    sample_rate: int | None = None
    channels: int | None = None
    max_samples: int | None = None
    max_seconds: float | None = None
    max_channels: int | None = None
    max_rate: int | None = None


def decode_audio(source: str | bytes, limits: AudioLimits | None = None) -> tuple[AudioClip, str]:
    """Decode a file path or encoded bytes; returns the clip and the codec name.

    Integer PCM (WAV, FLAC) keeps its integer type, so FLAC round trips are sample-exact;
    lossy codecs (MP3, Opus) decode to float32 in [-1, 1]. Every frame must have the stream's
    rate and channels; `limits` bounds what may come out (see `AudioLimits`).
    """
    limits = limits or AudioLimits()
    handle = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source
    chunks: list[np.ndarray] = []
    t_start = None
    total = 0
    try:
        with av.open(handle, mode="r") as container:
            if not container.streams.audio:
                raise DecodeError("holds no audio stream")
            stream = container.streams.audio[0]
            codec = stream.codec_context.name
            rate = stream.codec_context.sample_rate
            channels = stream.codec_context.layout.nb_channels if stream.codec_context.layout else 0
            _check_declared(codec, rate, channels, limits)
            most = limits.max_samples
            if limits.max_seconds is not None:
                in_time = math.ceil(limits.max_seconds * rate)
                most = in_time if most is None else min(most, in_time)
            for frame in container.decode(stream):
                if frame.sample_rate != rate or len(frame.layout.channels) != channels:
                    raise DecodeError(
                        f"a frame of {len(frame.layout.channels)} channels at {frame.sample_rate} Hz in a track of"
                        f" {channels} at {rate} Hz"
                    )
                total += frame.samples
                if most is not None and total > most:
                    raise DecodeError(f"holds more than the {most} samples it may ({total} decoded so far)")
                if t_start is None:
                    t_start = float(frame.time) if frame.time is not None else 0.0
                chunks.append(_frame_to_samples(frame))
    except av.error.FFmpegError as exc:
        raise DecodeError(f"does not decode as audio: {exc}") from exc
    if not chunks:
        raise DecodeError("holds no audio samples")
    return AudioClip(np.concatenate(chunks), int(rate), max(0.0, t_start or 0.0)), codec


def _check_declared(codec: str, rate: int, channels: int, limits: AudioLimits) -> None:
    if not rate or not channels:
        raise DecodeError("declares no sample rate or no channels")
    if limits.codec is not None and codec != limits.codec:
        raise DecodeError(f"is {codec} audio, the store says {limits.codec}")
    if limits.sample_rate is not None and rate != limits.sample_rate:
        raise DecodeError(f"is {rate} Hz, the store says {limits.sample_rate} Hz")
    if limits.channels is not None and channels != limits.channels:
        raise DecodeError(f"has {channels} channels, the store says {limits.channels}")
    if limits.max_channels is not None and channels > limits.max_channels:
        raise DecodeError(f"has {channels} channels, more than the {limits.max_channels} stored")
    if limits.max_rate is not None and rate > limits.max_rate:
        raise DecodeError(f"is sampled at {rate} Hz, above the {limits.max_rate} Hz stored")


def _frame_to_samples(frame: av.AudioFrame) -> np.ndarray:
    array = frame.to_ndarray()
    channels = len(frame.layout.channels)
    samples = array.T if frame.format.is_planar else array.reshape(-1, channels)
    if frame.format.name in _INTEGER_FORMATS:
        return np.ascontiguousarray(samples, dtype=_INTEGER_FORMATS[frame.format.name])
    return np.ascontiguousarray(samples, dtype=np.float32)


def to_flac_samples(clip: AudioClip) -> AudioClip:
    """Integer samples for FLAC: int16/int32 as they are, float converted to int16."""
    if clip.samples.dtype in (np.int16, np.int32):
        return clip
    scaled = np.clip(np.round(clip.samples.astype(np.float64) * 32767.0), -32768, 32767)
    return AudioClip(scaled.astype(np.int16), clip.sample_rate, clip.t_start)


def encode_flac(clip: AudioClip) -> bytes:
    """Lossless FLAC file bytes of integer samples `[S, C]`."""
    sample_format = {np.dtype(np.int16): "s16", np.dtype(np.int32): "s32"}.get(clip.samples.dtype)
    if sample_format is None:
        raise DecodeError(f"FLAC stores int16 or int32 samples, not {clip.samples.dtype}")
    layout = _CHANNEL_LAYOUTS.get(clip.channels)
    if layout is None:
        raise DecodeError(f"FLAC storage supports 1 to 8 channels, not {clip.channels}")
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="flac", options={"fflags": "+bitexact"}) as out:
        stream = out.add_stream("flac", rate=clip.sample_rate, layout=layout, format=sample_format)
        stream.codec_context.flags |= Flags.bitexact
        samples = np.ascontiguousarray(clip.samples)
        for start in range(0, samples.shape[0], FLAC_FRAME_SAMPLES):
            block = samples[start : start + FLAC_FRAME_SAMPLES]
            frame = av.AudioFrame.from_ndarray(block.reshape(1, -1), format=sample_format, layout=layout)
            frame.sample_rate = clip.sample_rate
            frame.pts = start
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return buffer.getvalue()


def as_float(samples: np.ndarray) -> np.ndarray:
    """Samples as float32 in [-1, 1], whatever their stored integer type."""
    if samples.dtype == np.int16:
        return samples.astype(np.float32) / 32768.0
    if samples.dtype == np.int32:
        return (samples.astype(np.float64) / 2147483648.0).astype(np.float32)
    return samples.astype(np.float32, copy=False)


def resample(clip: AudioClip, sample_rate: int | None = None, mono: bool = False) -> AudioClip:
    """The clip as float32 at `sample_rate` (FFmpeg's resampler), averaged to one channel if `mono`.

    Without a rate change or downmix the samples are returned as they are (sample-exact).
    """
    target_rate = sample_rate or clip.sample_rate
    if target_rate == clip.sample_rate and (not mono or clip.channels == 1):
        return clip
    samples = as_float(clip.samples)
    if mono and clip.channels > 1:
        samples = samples.mean(axis=1, keepdims=True)
    if target_rate == clip.sample_rate or len(samples) == 0:
        return AudioClip(np.ascontiguousarray(samples), clip.sample_rate, clip.t_start)
    layout = _CHANNEL_LAYOUTS.get(samples.shape[1])
    if layout is None:
        raise DecodeError(f"resampling supports 1 to 8 channels, not {samples.shape[1]}")
    resampler = av.AudioResampler(format="flt", layout=layout, rate=target_rate)
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples).reshape(1, -1), format="flt", layout=layout)
    frame.sample_rate = clip.sample_rate
    frame.pts = 0
    chunks = [
        f.to_ndarray().reshape(-1, samples.shape[1]) for f in [*resampler.resample(frame), *resampler.resample(None)]
    ]
    out = np.concatenate(chunks) if chunks else np.zeros((0, samples.shape[1]), np.float32)
    expected = round(len(samples) * target_rate / clip.sample_rate)
    out = np.pad(out, ((0, max(0, expected - len(out))), (0, 0)))[:expected]
    return AudioClip(np.ascontiguousarray(out, dtype=np.float32), target_rate, clip.t_start)
