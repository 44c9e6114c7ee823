"""The raw layout: one folder per episode, written by any recorder.

<episode>/<camera>.mp4|.mkv|.webm|.mov|.avi   one file per camera, any codec PyAV reads
<episode>/audio.wav|.flac|.mp3|.opus|.ogg     optional
<episode>/<name>.npy                          low-dim stream [T, ...] at meta.json's rate
<episode>/lowdim.parquet                      low-dim streams with a `timestamp` column
<episode>/meta.json                           {"task": ..., "rates": {name: Hz}, "metadata": {...}}
"""

from __future__ import annotations

import os
from pathlib import Path

from mmdata.checks import as_number, as_text, parse_json
from mmdata.errors import SourceError
from mmdata.importers.episode import AudioSource, CameraSource, EpisodeSource, LowdimSource, require_common_streams
from mmdata.importers.files import file_problem, listed
from mmdata.importers.limits import MAX_METADATA_BYTES
from mmdata.schema import MAX_RATE

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
    episodes = [_describe(folder, root) for folder in folders]
    return require_common_streams(episodes, _raw_hint)


def _describe(folder: Path, root: Path) -> EpisodeSource:
    name = folder.name
    files = listed(folder, _read_by_this_importer)
    try:
        for path in files:
            why = file_problem(path, root)
            if why is not None:
                raise SourceError(name, str(path), why, "replace it with the recording's file, or remove it")
        meta = _read_meta(folder / META_FILE, name)
    except SourceError as failure:
        return EpisodeSource(name=name, problem=failure)
    rates = meta["rates"]
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
        except SourceError as failure:
            return EpisodeSource(name=name, problem=failure)
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
        task=meta["task"],
        metadata=meta["metadata"],
        cameras=tuple(cameras),
        audio=tuple(audio),
        lowdim=tuple(lowdim),
        problem=problem,
    )


def _read_by_this_importer(name: str) -> bool:
    suffix = Path(name).suffix.lower()
    return (
        suffix in VIDEO_SUFFIXES
        or suffix == ".npy"
        or (suffix in AUDIO_SUFFIXES and Path(name).stem == AUDIO_STREAM)
        or name in (META_FILE, LOWDIM_PARQUET)
    )


def _read_meta(path: Path, episode: str) -> dict:
    """meta.json, checked: `task` text, `rates` positive numbers by stream, `metadata` a JSON object."""
    if not path.exists():
        return {"task": "", "rates": {}, "metadata": {}}
    try:
        if not path.is_file():
            raise ValueError("is not a regular file")
        meta = parse_json(path.read_bytes(), MAX_METADATA_BYTES)
        if not isinstance(meta, dict):
            raise ValueError("does not hold a JSON object")
        task = as_text(meta.get("task", ""), "'task'")
        rates = meta.get("rates", {})
        if not isinstance(rates, dict):
            raise ValueError(f"'rates' is {type(rates).__name__}, not an object of stream: Hz")
        rates = {name: as_number(hz, f"rate of '{name}'", high=MAX_RATE, positive=True) for name, hz in rates.items()}
        metadata = meta.get("metadata", {})
        if not isinstance(metadata, dict):
            raise ValueError(f"'metadata' is {type(metadata).__name__}, not an object")
    except (OSError, ValueError) as exc:
        raise SourceError(episode, str(path), f"unusable meta.json: {exc}", "fix the file") from exc
    return {"task": task, "rates": rates, "metadata": metadata}


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
