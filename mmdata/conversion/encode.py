"""Encode one source episode into the pieces a store holds, independent of the store's layout.

Every encoded stream offers `count` (frames, samples or rows), `t_start` and `t_end` in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import av
import numpy as np
import pyarrow as pa

from mmdata.checks import stream_name_problem
from mmdata.codecs.audio import encode_flac, to_flac_samples
from mmdata.codecs.video_encode import COPY, VideoEncoding, encode_segments, padded_to_even
from mmdata.errors import MmdataError, SourceError
from mmdata.importers.episode import (
    AudioSource,
    CameraInput,
    CopiedCamera,
    DeclaredCamera,
    EpisodeSource,
    LowdimInput,
)
from mmdata.importers.limits import MAX_AUDIO_SECONDS_WITHOUT_VIDEO
from mmdata.moments import Moments
from mmdata.schema import AudioStream, LowdimStream, VideoStream, stream_from_dict, stream_to_dict
from mmdata.store.encoded import EncodedAudio, EncodedEpisode, EncodedLowdim, EncodedVideo, sample_period
from mmdata.store.manifest import span_columns
from mmdata.store.manifest_checks import time_problems

RESERVED_NAMES = ("task",)


@dataclass(frozen=True)
class EncodeOptions:
    video: VideoEncoding = VideoEncoding()
    duration_tolerance: float = 0.1


def encode_episode(source: EpisodeSource, position: int, options: EncodeOptions) -> EncodedEpisode:
    """Read, check and encode every stream of one episode. Raises SourceError naming the file."""
    if source.deferred is not None and source.problem is None:
        source = source.deferred.complete(source)
    if source.problem is not None:
        raise source.problem
    for stream in source.streams:
        problem = stream_name_problem(stream.name)
        if stream.name in RESERVED_NAMES:
            problem = f"stream name '{stream.name}' is reserved for the task text"
        if problem is not None:
            raise SourceError(source.name, stream.path, problem, "rename the file, column or key that names it")
    _check_declared_spans(source, options.duration_tolerance)
    episode = EncodedEpisode(position, source.name, source.task, dict(source.metadata))
    episode.videos = [_encode_camera(source.name, camera, options.video) for camera in source.cameras]
    longest = max((v.t_end - v.t_start for v in episode.videos), default=None)
    # audio may not run on far past the video (a bound on what it may expand to, not a length check)
    audio_seconds = 2 * longest + 60 if longest is not None else MAX_AUDIO_SECONDS_WITHOUT_VIDEO
    episode.audio = [_encode_audio(source.name, audio, audio_seconds) for audio in source.audio]
    _check_declared_rows(source, episode, options.duration_tolerance)
    episode.lowdim = [_load_lowdim(source.name, stream) for stream in source.lowdim]
    _check_durations(source, episode, options.duration_tolerance)
    _check_store_times(source, episode)
    episode.moments = {stream.spec.name: Moments.of(stream.values) for stream in episode.lowdim}
    return episode


def encode_or_error(source: EpisodeSource, position: int, options: EncodeOptions) -> EncodedEpisode | SourceError:
    """One episode, or the SourceError that stops it. Any other exception is an input this code
    does not expect: it too becomes the episode's error, so that --skip-bad can go on without it."""
    try:
        return encode_episode(source, position, options)
    except SourceError as problem:
        return problem
    except Exception as exc:  # a per-episode boundary: the rest of the conversion must survive it
        return SourceError(
            source.name,
            None,
            f"could not be converted: {type(exc).__name__}: {exc}",
            "an input mmdata did not expect: report it with the file, or pass --skip-bad to leave it out",
        )


def encode_job(job: tuple[EpisodeSource, int, EncodeOptions]) -> EncodedEpisode | SourceError:
    """`encode_or_error` of one (source, position, options) job: what a conversion's worker process runs (it
    imports this module and the importer's, not the conversion's)."""
    return encode_or_error(*job)


def worker_crashed(episode: str) -> SourceError:
    """The error of an episode whose worker process died while converting it, every retry."""
    return SourceError(
        episode,
        None,
        "the worker process converting it crashed (a decoder or encoder failed on this input)",
        "re-export the recording, or pass --skip-bad to leave it out",
    )


def _encode_camera(episode: str, camera: CameraInput, encoding: VideoEncoding) -> EncodedVideo:
    if encoding.codec == COPY:
        return _copied_camera(episode, camera, encoding)
    info = camera.info(episode)
    timestamps: list[float] = []
    spec = VideoStream(
        name=camera.name,
        fps=float(info.fps),
        width=info.width,
        height=info.height,
        codec=encoding.codec,
        segment_frames=encoding.segment_frames,
        gop=encoding.gop,
        crf=encoding.crf,
    )
    padded = spec.coded_size != (info.width, info.height)  # odd sides: stored one pixel larger, read back cut

    def frames():
        for frame, timestamp in camera.frames(episode, info.fps):
            if timestamps and timestamp <= timestamps[-1]:
                raise SourceError(
                    episode,
                    camera.path,
                    f"frame {len(timestamps)} has timestamp {timestamp:.6f}s, not after the previous"
                    f" frame's {timestamps[-1]:.6f}s",
                    "re-mux the file with monotonic timestamps",
                )
            timestamps.append(timestamp)
            yield padded_to_even(frame) if padded else frame

    try:
        encoded = list(encode_segments(frames(), info.fps, *spec.coded_size, encoding))
    except MmdataError as exc:
        if isinstance(exc, SourceError):
            raise
        raise SourceError(episode, camera.path, str(exc)) from exc
    except av.error.FFmpegError as exc:
        raise SourceError(
            episode,
            camera.path,
            f"encoding to {encoding.codec} failed: {exc}",
            "try another --video-codec, and report it with this file if it persists",
        ) from exc
    if not encoded:
        raise SourceError(episode, camera.path, "the video holds no frames", "re-export or replace the file")
    return EncodedVideo(
        spec, [data for _, data in encoded], [n for n, _ in encoded], np.asarray(timestamps, dtype=np.float64)
    )


def _copied_camera(episode: str, camera: CameraInput, encoding: VideoEncoding) -> EncodedVideo:
    """The camera's recorded packets as segments, not re-encoded (`--video-codec copy`). Its stream records
    the codec found, no crf, and as `gop` the most frames between two key frames."""
    if not isinstance(camera, CopiedCamera):
        raise SourceError(
            episode,
            camera.path,
            f"camera '{camera.name}' is not read from a video file or video packets (its pictures come from an"
            " array of images); --video-codec copy keeps the packets of video files (raw MP4s, LeRobot videos) and"
            " of foxglove.CompressedVideo topics only",
            "convert with --video-codec h264 (or another codec) to encode its pictures",
        )
    copied = camera.copied(episode, encoding.segment_frames)
    if not copied.segments:
        raise SourceError(episode, camera.path, "the video holds no frames", "re-export or replace the file")
    if copied.width % 2 or copied.height % 2:
        raise SourceError(
            episode,
            camera.path,
            f"camera '{camera.name}' is {copied.width}x{copied.height}; a copied video cannot be padded to even sides",
            "convert with --video-codec h264, which pads it",
        )
    spec = VideoStream(
        name=camera.name,
        fps=float(copied.fps),
        width=copied.width,
        height=copied.height,
        codec=copied.codec,
        segment_frames=encoding.segment_frames,
        gop=copied.key_interval,
        crf=None,
    )
    timestamps = np.asarray(copied.timestamps, np.float64)
    if len(timestamps) != sum(copied.segment_frames):
        raise SourceError(
            episode,
            camera.path,
            f"camera '{camera.name}': {len(timestamps)} frame times for {sum(copied.segment_frames)} frames",
            "convert with --video-codec h264",
        )
    _require_increasing(episode, camera.path, timestamps)
    return EncodedVideo(spec, copied.segments, copied.segment_frames, timestamps, copied.indexes)


def _require_increasing(episode: str, path: str | None, timestamps: np.ndarray) -> None:
    """SourceError unless a camera's frame times are finite and each after the one before (as when encoding)."""
    if not np.isfinite(timestamps).all():
        frame = int(np.flatnonzero(~np.isfinite(timestamps))[0])
        raise SourceError(episode, path, f"frame {frame} has timestamp {timestamps[frame]}", "re-mux the file")
    late = np.flatnonzero(np.diff(timestamps) <= 0)
    if len(late):
        frame = int(late[0]) + 1
        raise SourceError(
            episode,
            path,
            f"frame {frame} has timestamp {timestamps[frame]:.6f}s, not after the previous frame's"
            f" {timestamps[frame - 1]:.6f}s",
            "re-mux the file with monotonic timestamps",
        )


def _encode_audio(episode: str, audio: AudioSource, max_seconds: float) -> EncodedAudio:
    clip, codec, original = audio.load(episode, max_seconds)
    if codec == "opus" and audio.path.lower().endswith((".opus", ".ogg")):
        data, stored_codec, dtype = original, "opus", "float32"
    else:
        clip = to_flac_samples(clip)
        data, stored_codec, dtype = encode_flac(clip), "flac", str(clip.samples.dtype)
    spec = AudioStream(audio.name, clip.sample_rate, clip.channels, stored_codec, dtype)
    return EncodedAudio(spec, data, int(clip.samples.shape[0]), clip.t_start)


def _load_lowdim(episode: str, stream: LowdimInput) -> EncodedLowdim:
    values, timestamps = stream.load(episode)
    if len(timestamps) != len(values):
        raise SourceError(episode, stream.path, f"{len(values)} rows but {len(timestamps)} timestamps")
    if not np.isfinite(timestamps).all() or (len(timestamps) > 1 and not (np.diff(timestamps) > 0).all()):
        raise SourceError(episode, stream.path, "timestamps are not finite and strictly increasing", "sort or fix them")
    if values.ndim == 0 or values.dtype.kind not in "biuf":
        raise SourceError(episode, stream.path, f"holds {values.dtype} values of shape {values.shape}, not numbers")
    values = values.astype(values.dtype.newbyteorder("="), copy=False)
    spec = LowdimStream(stream.name, tuple(int(d) for d in values.shape[1:]), str(values.dtype), stream.rate)
    problem = _lowdim_spec_problem(spec)
    if problem is not None:
        raise SourceError(episode, stream.path, problem, "store fewer values per row, of a numeric type")
    return EncodedLowdim(spec, np.ascontiguousarray(values), timestamps)


def _lowdim_spec_problem(spec: LowdimStream) -> str | None:
    """Why a store could not hold the stream (the limits `dataset.json` is read with), or None."""
    try:
        stream_from_dict(stream_to_dict(spec))
    except ValueError as exc:
        return str(exc)
    return None


def _check_store_times(source: EpisodeSource, episode: EncodedEpisode) -> None:
    """The episode's times as a reader of the store checks them (a duration of at most 7 days, each stream's
    span finite, inside the episode and not stretched far past its samples): a recording whose stamps jump
    is refused here, naming the stream, instead of being stored as a damaged episode."""
    row = {"key": source.name, "duration": episode.duration}
    for stream in (*episode.videos, *episode.audio, *episode.lowdim):
        row.update(span_columns(stream))
    problems = time_problems(pa.Table.from_pylist([row]), episode.streams)
    if problems:
        files = [s.path for s in source.streams]
        raise SourceError(
            source.name,
            files[0] if len(set(files)) == 1 else None,
            "; ".join(problems[0]),
            "fix the recording's timestamps (a clock that jumped?)",
        )


def _check_declared_spans(source: EpisodeSource, tolerance: float) -> None:
    """Before any frame or row is read: the time that cameras and low-dim arrays declare in their
    containers' metadata (images or rows over their rate) must agree, so a small file declaring
    hours of frames fails here instead of after reading and encoding every one of them."""
    declared = []  # (what, file, count, unit, rate)
    for camera in source.cameras:
        if isinstance(camera, DeclaredCamera):
            declared.append(
                (f"camera '{camera.name}'", camera.path, camera.declared_frames(source.name), "frames", camera.fps)
            )
    for stream in source.lowdim:
        rows = getattr(stream, "declared_rows", None)
        if rows is not None and stream.rate:
            declared.append((f"stream '{stream.name}'", stream.path, rows(source.name), "rows", stream.rate))
    if len(declared) < 2:
        return
    longest = max(declared, key=lambda d: d[2] / d[4])
    shortest = min(declared, key=lambda d: d[2] / d[4])
    if longest[2] / longest[4] - shortest[2] / shortest[4] <= tolerance + 1.0 / longest[4] + 1.0 / shortest[4]:
        return
    what, path, count, unit, rate = longest
    raise SourceError(
        source.name,
        path,
        f"{what} declares {count} {unit} at {rate:g} Hz = {count / rate:.3f} s, but {shortest[0]} declares"
        f" {shortest[2]} {shortest[3]} at {shortest[4]:g} Hz = {shortest[2] / shortest[4]:.3f} s",
        "check --fps and the file; it may be damaged",
    )


def _check_declared_rows(source: EpisodeSource, episode: EncodedEpisode, tolerance: float) -> None:
    """Before reading a low-dim array whose row count its container declares, check that those
    rows span the video's time: a damaged file declaring millions of rows fails here, unread."""
    for stream in source.lowdim:
        declared_rows = getattr(stream, "declared_rows", None)
        if declared_rows is None or not stream.rate:
            continue
        rows = declared_rows(source.name)
        span = rows / stream.rate
        mismatch = _against_video(episode, span, 1.0 / stream.rate, tolerance)
        if mismatch:
            raise SourceError(
                source.name,
                stream.path,
                f"stream '{stream.name}' declares {rows} rows at {stream.rate:g} Hz = {span:.3f} s, {mismatch}",
                "check --fps and the file; it may be damaged",
            )


def _check_durations(source: EpisodeSource, episode: EncodedEpisode, tolerance: float) -> None:
    """A low-dim stream must span the same time as the video, within tolerance plus a sample."""
    for stream, lowdim_source in zip(episode.lowdim, source.lowdim):
        span = stream.t_end - float(stream.timestamps[0]) if len(stream.timestamps) else 0.0
        mismatch = _against_video(episode, span, sample_period(stream.timestamps, stream.spec.rate), tolerance)
        if mismatch:
            rate = f" at {stream.spec.rate:g} Hz" if stream.spec.rate else ""
            raise SourceError(
                source.name,
                lowdim_source.path,
                f"stream '{stream.spec.name}' has {len(stream.values)} rows{rate} = {span:.3f} s, {mismatch}",
                "check the rate in meta.json or trim the recording",
            )


def _against_video(episode: EncodedEpisode, span: float, period: float, tolerance: float) -> str | None:
    """How a stream lasting `span` seconds (a value every `period`) disagrees with the episode's first
    camera beyond `tolerance` plus a frame and a sample, or None when it fits (or there is no camera)."""
    if not episode.videos:
        return None
    video = episode.videos[0]
    video_span = video.t_end - float(video.timestamps[0])
    if abs(span - video_span) <= tolerance + 1.0 / video.spec.fps + period:
        return None
    return f"but camera '{video.spec.name}' lasts {video_span:.3f} s ({len(video.timestamps)} frames)"
