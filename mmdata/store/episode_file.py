"""An encoded episode saved to disk as data only, so that a conversion can resume from it.

The file is a JSON header (stream specs, counts, task, metadata, checkpoint, and where each blob
lies) followed by the blobs: video segments, audio bytes and `.npy` arrays. Nothing in it is
executed when it is read back (no pickle): a destination folder that someone else can write
cannot make `convert --resume` run their code, and a damaged file is an error naming it.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from mmdata.checks import as_int, as_number, as_text, dump_json, parse_json
from mmdata.codecs.lowdim import NpyError, decode_npy, encode_npy
from mmdata.errors import DestinationError
from mmdata.schema import AudioStream, LowdimStream, VideoStream, stream_from_dict, stream_to_dict
from mmdata.store.encoded import EncodedAudio, EncodedEpisode, EncodedLowdim, EncodedVideo
from mmdata.store.filesystem import write_bytes_atomically
from mmdata.store.layout import CONVERT_AGAIN

MAGIC = b"MMDATA-EPISODE-1\n"
MAX_HEADER_BYTES = 256 << 20


def write_episode_file(path: Path, episode: EncodedEpisode, index: int, checkpoint: dict[str, Any]) -> None:
    """Save `episode` at `path` atomically (a temporary file renamed into place once synced)."""
    write_bytes_atomically(str(path), episode_file_chunks(episode, index, checkpoint))


def episode_file_chunks(episode: EncodedEpisode, index: int, checkpoint: dict[str, Any]) -> list[bytes]:
    """The bytes of an episode file, in order: the header, then each blob."""
    blobs: list[bytes] = []
    end = 0

    def blob(data: bytes) -> list[int]:
        nonlocal end
        blobs.append(data)
        end += len(data)
        return [end - len(data), len(data)]

    header = {
        "index": index,
        "checkpoint": checkpoint,
        "position": episode.position,
        "source": episode.source,
        "task": episode.task,
        "metadata": episode.metadata,
        "videos": [
            {
                "spec": stream_to_dict(video.spec),
                "segment_frames": list(video.segment_frames),
                "segments": [blob(data) for data in video.segments],
                "timestamps": blob(encode_npy(video.timestamps)),
            }
            for video in episode.videos
        ],
        "audio": [
            {"spec": stream_to_dict(a.spec), "count": a.count, "t_start": a.t_start, "data": blob(a.data)}
            for a in episode.audio
        ],
        "lowdim": [
            {
                "spec": stream_to_dict(s.spec),
                "values": blob(encode_npy(s.values)),
                "timestamps": blob(encode_npy(s.timestamps)),
            }
            for s in episode.lowdim
        ],
    }
    encoded = _json(header)
    return [MAGIC + struct.pack("<Q", len(encoded)) + encoded, *blobs]


def read_episode_file(path: Path, restart: str = CONVERT_AGAIN) -> tuple[EncodedEpisode, int, dict[str, Any]]:
    """(episode, its index in the store, the converter's checkpoint) from a file `write_episode_file` made;
    `restart` says how to start again when it is damaged."""
    return episode_from_bytes(path.read_bytes(), str(path), restart)


def episode_from_bytes(
    data: bytes, where: str, restart: str = CONVERT_AGAIN
) -> tuple[EncodedEpisode, int, dict[str, Any]]:
    """`read_episode_file` of bytes already read from `where` (a local or object-store path)."""
    try:
        if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 8:
            raise ValueError("is not an mmdata episode file")
        (length,) = struct.unpack_from("<Q", data, len(MAGIC))
        start = len(MAGIC) + 8
        if length > min(MAX_HEADER_BYTES, len(data) - start):
            raise ValueError("has a header longer than the file")
        header = parse_json(data[start : start + length], max_bytes=MAX_HEADER_BYTES)
        body = memoryview(data)[start + length :]
        return _episode(header, body), as_int(header["index"], "index", 0), _checkpoint(header["checkpoint"])
    except (ValueError, KeyError, TypeError, NpyError) as exc:
        raise DestinationError(
            f"{where}: the saved episode cannot be resumed from ({exc}); delete the file (it is converted again),"
            f" or {restart}"
        ) from exc


def _episode(header: dict[str, Any], body: memoryview) -> EncodedEpisode:
    def blob(where: Any) -> bytes:
        offset, size = (as_int(v, "blob range", 0, len(body)) for v in where)
        if offset + size > len(body):
            raise ValueError("a blob runs past the end of the file")
        return bytes(body[offset : offset + size])

    if not isinstance(header["metadata"], dict):
        raise ValueError("the metadata is not an object")
    episode = EncodedEpisode(
        as_int(header["position"], "position", 0),
        as_text(header["source"], "source"),
        as_text(header["task"], "task"),
        header["metadata"],
    )
    for video in header["videos"]:
        spec = _spec(video["spec"], VideoStream)
        frames = [as_int(n, "segment frames", 1, spec.segment_frames) for n in video["segment_frames"]]
        timestamps = decode_npy(blob(video["timestamps"]), (sum(frames),), "float64")
        episode.videos.append(EncodedVideo(spec, [blob(s) for s in video["segments"]], frames, np.array(timestamps)))
    for audio in header["audio"]:
        spec = _spec(audio["spec"], AudioStream)
        count, t_start = as_int(audio["count"], "count", 0), as_number(audio["t_start"], "t_start")
        episode.audio.append(EncodedAudio(spec, blob(audio["data"]), count, t_start))
    for stream in header["lowdim"]:
        spec = _spec(stream["spec"], LowdimStream)
        values = np.array(decode_npy(blob(stream["values"]), None, spec.dtype))
        timestamps = np.array(decode_npy(blob(stream["timestamps"]), (len(values),), "float64"))
        if values.shape[1:] != spec.shape:
            raise ValueError(f"stream '{spec.name}' holds rows of {values.shape[1:]}, not {spec.shape}")
        episode.lowdim.append(EncodedLowdim(spec, values, timestamps))
    return episode


def _spec(entry: Any, kind: type) -> Any:
    spec = stream_from_dict(entry)
    if not isinstance(spec, kind):
        raise ValueError(f"a {kind.__name__} was expected, not {type(spec).__name__}")
    return spec


def _checkpoint(checkpoint: Any) -> dict[str, Any]:
    if not isinstance(checkpoint, dict):
        raise ValueError("the checkpoint is not an object")
    return checkpoint


def _json(value: Any) -> bytes:
    return dump_json(value, sort_keys=True).encode("utf-8")
