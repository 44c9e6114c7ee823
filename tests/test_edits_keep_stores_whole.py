"""Every edit leaves a store `mmdata verify` passes and the loader reads whole, on stores whose streams end at
different times (audio a sample after the last frame, as real recordings do): an episode's duration is the end of its
longest stream, in every version."""

from __future__ import annotations

import shutil
import wave
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import mmdata
from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.editing.added_streams import add_streams
from mmdata.editing.compaction import compact_store
from mmdata.editing.derived import ValidationChoice, merge_stores, split_store
from mmdata.editing.edits import edit_store, remove_stream
from mmdata.editing.selection import EpisodeSelection
from mmdata.importers.raw import discover_raw_episodes
from mmdata.store.verification import verify_dataset
from mmdata.synthetic import SynthSpec, write_synthetic_dataset
from tests.conftest import LAYOUTS

LATE_AUDIO = SynthSpec(episodes=3, min_seconds=1.5, max_seconds=2.5, audio_rate=48000)


@pytest.fixture(scope="module")
def late_audio_stores(tmp_path_factory) -> dict[str, Path]:
    """Both layouts of a recording whose audio ends one sample (21 us) after its last frame."""
    raw = tmp_path_factory.mktemp("late-audio") / "raw"
    write_synthetic_dataset(raw, LATE_AUDIO)
    for path in sorted(raw.rglob("audio.wav")):
        with wave.open(str(path), "rb") as source:
            params, samples = source.getparams(), source.readframes(source.getnframes())
        with wave.open(str(path), "wb") as target:
            target.setparams(params)
            target.writeframes(samples + samples[-params.sampwidth * params.nchannels :])
    stores = {}
    for layout in LAYOUTS:
        destination = raw.parent / f"robot.{layout}"
        convert(discover_raw_episodes(raw), destination, ConvertOptions(layout=layout, workers=1, progress=False))
        stores[layout] = destination
    return stores


def _delete(store: str, folder: Path) -> str:
    edit_store(store, "delete", EpisodeSelection(ids=[1]), progress=False)
    return store


def _keep(store: str, folder: Path) -> str:
    edit_store(store, "keep", EpisodeSelection(min_seconds=1.9), progress=False)
    return store


def _remove_audio(store: str, folder: Path) -> str:
    remove_stream(store, "audio", progress=False)
    return store


def _remove_camera(store: str, folder: Path) -> str:
    remove_stream(store, "cam_high", progress=False)
    return store


def _add_stream(store: str, folder: Path) -> str:
    other = shutil.copytree(store, folder / f"cameras{Path(store).suffix}")
    remove_stream(store, "audio", progress=False)
    add_streams(store, str(other), ["audio"], progress=False)
    return store


def _split(store: str, folder: Path) -> str:
    train, validation = str(folder / "train"), str(folder / "validation")
    split_store(store, train, validation, ValidationChoice(EpisodeSelection(ids=[0])), progress=False)
    return validation


def _merge(store: str, folder: Path) -> str:
    twin = shutil.copytree(store, folder / f"twin{Path(store).suffix}")
    merge_stores([store, str(twin)], str(folder / "merged"), progress=False)
    return str(folder / "merged")


def _compact(store: str, folder: Path) -> str:
    remove_stream(store, "audio", progress=False)
    compact_store(store, str(folder / "compacted"), progress=False)
    return str(folder / "compacted")


EDITS: dict[str, Callable[[str, Path], str]] = {
    "delete": _delete,
    "keep": _keep,
    "remove the stream that ends last": _remove_audio,
    "remove a camera": _remove_camera,
    "add a stream": _add_stream,
    "split": _split,
    "merge": _merge,
    "compact after removing the last stream": _compact,
}


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("edit", list(EDITS))
def test_every_edit_of_a_store_whose_streams_end_apart_passes_verify_and_loads(
    late_audio_stores, tmp_path, layout, edit
):
    store = str(shutil.copytree(late_audio_stores[layout], tmp_path / f"robot.{layout}"))
    before = mmdata.open_store(store)
    assert (before.table.column("duration").to_numpy() > before.table.column("cam_high/t_end").to_numpy()).all()
    edited = EDITS[edit](store, tmp_path)
    report = verify_dataset(edited, progress=False)
    assert report.ok, report
    opened = mmdata.open_store(edited)
    assert opened.damaged == {}
    ends = [opened.table.column(f"{s.name}/t_end").to_numpy() for s in opened.schema.streams if s.kind != "text"]
    assert np.allclose(opened.table.column("duration").to_numpy(), np.max(ends, axis=0), atol=1e-9)
    spec = mmdata.Windows(anchor_fps=5, streams={"state": mmdata.Values()})
    assert sum(len(batch["state"]) for batch in mmdata.DataLoader(edited, spec, batch_size=8, num_workers=0)) > 0
