"""The raw layout: one folder per episode, written by any recorder.

<episode>/<camera>.mp4|.mkv|.webm|.mov|.avi   one file per camera, any codec PyAV reads
<episode>/audio.wav|.flac|.mp3|.opus|.ogg     optional
<episode>/<name>.npy                          low-dim stream [T, ...] at meta.json's rate
<episode>/lowdim.parquet                      low-dim streams with a `timestamp` column
<episode>/meta.json                           {"task": ..., "rates": {name: Hz}, "metadata": {...}}
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mmdata.errors import SourceError
from mmdata.sources.episode import AudioSource, CameraSource, EpisodeSource, LowdimSource, require_common_streams

VIDEO_SUFFIXES = (".mp4", ".mkv", ".webm", ".mov", ".avi")
AUDIO_SUFFIXES = (".wav", ".flac", ".mp3", ".opus", ".ogg")
LOWDIM_PARQUET = "lowdim.parquet"
META_FILE = "meta.json"
AUDIO_STREAM = "audio"


def discover_raw_episodes(root: str | os.PathLike) -> list[EpisodeSource]:
    """Describe every episode folder under `root`, in name order.

    Problems found by looking (a camera or stream that other episodes have and this one lacks,
    an unreadable meta.json) are recorded on the episode, not raised, so that the converter can
    report them per episode or skip them.
    """
    root = Path(root)
    if not root.is_dir():
        raise SourceError.for_source(
            str(root), None, "the source is not a folder", "give the folder that holds one folder per episode"
        )
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise SourceError.for_source(str(root), None, "holds no episode folders", "see the raw layout in the README")
    episodes = [_describe(folder) for folder in folders]
    return require_common_streams(episodes, _raw_hint)


def _describe(folder: Path) -> EpisodeSource:
    name = folder.name
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    try:
        meta = _read_meta(folder / META_FILE, name)
    except SourceError as problem:
        return EpisodeSource(name=name, problem=problem)
    rates = meta.get("rates", {})
    cameras, audio, lowdim = [], [], []
    for path in files:
        suffix = path.suffix.lower()
        if suffix in VIDEO_SUFFIXES:
            cameras.append(CameraSource(path.stem, str(path)))
        elif suffix in AUDIO_SUFFIXES and path.stem == AUDIO_STREAM:
            audio.append(AudioSource(AUDIO_STREAM, str(path)))
        elif suffix == ".npy":
            lowdim.append(LowdimSource(path.stem, str(path), rate=rates.get(path.stem)))
    if (folder / LOWDIM_PARQUET).is_file():
        try:
            lowdim.extend(_parquet_streams(folder / LOWDIM_PARQUET, name))
        except SourceError as problem:
            return EpisodeSource(name=name, problem=problem)
    names = [c.name for c in cameras] + [a.name for a in audio] + [s.name for s in lowdim]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    problem = None
    if duplicates:
        problem = SourceError(
            name,
            str(folder),
            f"stream name(s) {duplicates} given by more than one file",
            "rename the files so each stream has one source",
        )
    return EpisodeSource(
        name=name,
        task=str(meta.get("task", "")),
        metadata=meta.get("metadata", {}),
        cameras=tuple(cameras),
        audio=tuple(audio),
        lowdim=tuple(lowdim),
        problem=problem,
    )


def _read_meta(path: Path, episode: str) -> dict:
    if not path.exists():
        return {}
    try:
        meta = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SourceError(episode, str(path), f"unreadable meta.json: {exc}", "fix the JSON") from exc
    if not isinstance(meta, dict):
        raise SourceError(episode, str(path), "meta.json must hold a JSON object")
    return meta


def _parquet_streams(path: Path, episode: str) -> list[LowdimSource]:
    import pyarrow.parquet as pq

    try:
        columns = pq.read_schema(path).names
    except (OSError, ValueError) as exc:
        raise SourceError(episode, str(path), f"unreadable Parquet file: {exc}") from exc
    if "timestamp" not in columns:
        raise SourceError(
            episode,
            str(path),
            f"no 'timestamp' column (columns: {columns})",
            "add a timestamp column in seconds from the episode start",
        )
    return [LowdimSource(c, str(path), column=c) for c in columns if c != "timestamp"]


def _raw_hint(episode: EpisodeSource, kind: str, name: str) -> str:
    return {"camera": f"{name}.mp4", "audio": "audio.wav", "low-dim": f"{name}.npy"}[kind]
