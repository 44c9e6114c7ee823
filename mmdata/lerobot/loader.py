"""Batches as LeRobot's own `LeRobotDataset` + torch `DataLoader` give them, from an mmdata store.

A LeRobot training script changes its dataset and loader lines only:

    loader = LeRobotLoader("/data/aloha.wds", delta_timestamps=cfg.delta_timestamps, batch_size=64,
                           shuffle=True, num_workers=8, device="cuda")
    for batch in loader:
        loss, _ = policy.forward(batch)

Every frame of the episodes is a sample, as in LeRobot. Each batch holds the store's cameras as float
`[B, 3, H, W]` in [0, 1] (`[B, T, 3, H, W]` for a key of `delta_timestamps`, with `<key>_is_pad`),
its low-dim streams `[B, D]` (or `[B, T, D]`; `[B]` or `[B, T]` for a stream of one value, as LeRobot gives
features of shape [1]), and LeRobot's fields: `timestamp`, `frame_index`, `episode_index` and `index` as LeRobot
numbers them, each frame's `task_index` and `task` (an episode's task may change part-way), and its `string`
features (lists of `B` texts). Frames are decoded
as uint8 channels-first and turned into floats where that costs least: on the GPU with `device="cuda"` (uint8
crosses, a quarter of the bytes), else in the workers, in the pass that gathers them into the batch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch

from mmdata.checks import option_int, shown
from mmdata.codecs.unit_float import unit_float_flat
from mmdata.errors import OptionError, SpecError, StoreError
from mmdata.lerobot.numbering import EpisodeNumbering
from mmdata.loading.dataloader import DataLoader
from mmdata.loading.loader_options import UNGROUPED_KEYWORDS, Batching, Reading, Runtime, Shuffling
from mmdata.loading.micro_batch import OnError
from mmdata.planning.episodes import Episodes
from mmdata.planning.mixture import Mixture, Source
from mmdata.planning.orders import Shuffle
from mmdata.planning.specs import MAX_OFFSETS, Frames, Values, Windows
from mmdata.schema import LowdimStream, VideoStream
from mmdata.store.dataset import Dataset
from mmdata.store.handle import Store, open_store
from mmdata.store.statistics import read_stats, stream_figures

ImageFormat = Literal["float", "uint8"]


class LeRobotLoader:
    """An iterable of LeRobot-style batches over the store at `dataset` (see the module's docstring).

    `delta_timestamps` is LeRobot's: stream -> offsets in seconds from each frame. `streams` renames the
    store's streams to the keys the policy expects (`{"cam_high": "observation.images.top"}`, as a
    `Source`'s stream map; unmapped streams keep their names), for stores not converted from LeRobot.
    `images="uint8"` keeps frames as uint8 (still channels-first). `batch_size`, `shuffle` (True / False as in
    torch, or an mmdata order), `num_workers` and `device` are torch's `DataLoader` arguments, as LeRobot's
    training scripts pass them (`num_workers` by default "auto", as `mmdata.DataLoader`'s); `runtime` (an
    `mmdata.Runtime`: decoder, ranks, ...) replaces `device` when given. `episodes` is LeRobot's: a list of its
    `episode_index` values (or an `mmdata.Episodes` filter). `seed`, `reading` and `on_error` are
    `mmdata.DataLoader`'s; `state_dict()` / `load_state_dict()` resume
    exactly, as there.
    """

    def __init__(
        self,
        dataset: str | Store | Dataset,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        *,
        batch_size: int,
        streams: Mapping[str, str] | None = None,
        shuffle: Shuffle | bool = True,
        num_workers: int | Literal["auto"] = "auto",
        device: str | torch.device | None = None,
        images: ImageFormat = "float",
        episodes: Sequence[int] | Episodes | None = None,
        seed: int = 0,
        runtime: Runtime | None = None,
        reading: Reading | None = None,
        on_error: OnError = "raise",
        **ungrouped: Any,
    ):
        if images not in ("float", "uint8"):
            raise SpecError(f"images is 'float' or 'uint8', not {images!r}")
        given = dataset.store if isinstance(dataset, Dataset) else dataset
        self.dataset = given if isinstance(given, Store) else open_store(given)
        self.delta_timestamps = _checked_delta_timestamps(delta_timestamps)
        self.images = images
        renamed = dict(streams or {})
        self._renamed = renamed
        unmapped = sorted(set(renamed) - {s.name for s in self.dataset.schema.streams})
        if unmapped:
            raise SpecError(f"streams renames {unmapped}, which the store does not hold")
        names = [renamed.get(s.name, s.name) for s in self.dataset.schema.streams]
        doubled = sorted({n for n in names if names.count(n) > 1})
        if doubled:
            raise SpecError(f"streams renames a stream to {doubled}, a name another stream of the store has")
        by_name = {renamed.get(s.name, s.name): s for s in self.dataset.schema.streams}
        unknown = sorted(set(self.delta_timestamps) - set(by_name))
        if unknown:
            raise SpecError(
                f"delta_timestamps names {unknown}, which the store does not hold; its streams are {sorted(by_name)}"
            )
        lowdim = {n: s for n, s in by_name.items() if isinstance(s, LowdimStream)}
        self.cameras = [n for n, s in by_name.items() if isinstance(s, VideoStream)]
        self.values = list(lowdim)
        self.scalars = [n for n, s in lowdim.items() if s.shape == (1,)]
        self.fps = _frame_rate(by_name)
        # float frames are made where they cost least: on the device a batch goes to (uint8 across, converted
        # there), else in the workers' pass that gathers the frames into the batch
        lands_on = runtime.device if runtime is not None else device if device is not None else ungrouped.get("device")
        on_host = torch.device(lands_on or "cpu").type == "cpu"
        frame_type: Literal["uint8", "float32"] = "float32" if images == "float" and on_host else "uint8"
        spec = Windows(
            anchor_fps=self.fps,
            streams={
                **{n: Frames(offsets=self._offsets(n), channels_first=True, dtype=frame_type) for n in self.cameras},
                **{n: Values(offsets=self._offsets(n)) for n in self.values},
            },
        )
        self.numbering = EpisodeNumbering.of(self.dataset, self.fps)
        selected = self._selected(episodes)
        source = (
            Mixture([Source(self.dataset, streams=renamed, episodes=selected)]) if renamed or selected else self.dataset
        )
        if runtime is not None and device is not None:
            raise OptionError("give device inside runtime=, not beside it")
        ungrouped = dict(ungrouped)
        grouped = {group: _popped(ungrouped, group) for group in ("batching", "shuffling", "runtime", "reading")}
        if runtime is None:
            runtime = Runtime(**{**({"device": device} if device is not None else {}), **grouped["runtime"]})
        if reading is None:
            reading = Reading(**grouped["reading"])
        self.loader = DataLoader(
            source,
            spec,
            batch_size,
            shuffle,
            num_workers=num_workers,
            batching=Batching(**grouped["batching"]) if grouped["batching"] else None,
            shuffling=Shuffling(**grouped["shuffling"]) if grouped["shuffling"] else None,
            seed=seed,
            runtime=runtime,
            reading=reading,
            on_error=on_error,
            **ungrouped,
        )

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.loader:
            yield self.to_lerobot(batch)

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)

    def stats(self) -> dict[str, Any]:
        """The loader's throughput and stage timings (`mmdata.DataLoader.stats`)."""
        return self.loader.stats()

    @property
    def dataset_stats(self) -> dict[str, dict[str, np.ndarray]]:
        """Normalization statistics as LeRobot's `dataset.meta.stats` holds them, for a policy's `dataset_stats`:
        feature -> {"mean", "std", "min", "max", ...} arrays. A store converted from LeRobot gives LeRobot's own
        (`meta/stats.json`, kept at conversion); another gives mmdata's (`mmdata stats`): per dimension for
        low-dim streams, per channel as [3, 1, 1] in [0, 1] for cameras. Keys follow `streams=`."""
        stats = read_stats(self.dataset)
        rename = self._renamed
        where = f"{self.dataset.url}/{self.dataset.schema.stats_file}"
        shipped = stats.get("lerobot")
        if shipped is not None:
            return {
                rename.get(key, key): {
                    name: _figure(value, f"{where}: lerobot/{key}/{name}") for name, value in figures.items()
                }
                for key, figures in _entries(shipped, where, "lerobot")
            }
        found: dict[str, dict[str, np.ndarray]] = {}
        for key, figures in _entries(stats.get("lowdim", {}), where, "lowdim"):
            if not figures.get("non_finite"):  # (a stream holding NaN or inf has no statistics to give)
                found[rename.get(key, key)] = stream_figures(stats, key, ("mean", "std", "min", "max"), where)
        for key, figures in _entries(stats.get("cameras", {}), where, "cameras"):
            missing = [name for name in ("mean", "std") if name not in figures]
            if missing:
                raise StoreError(f"{where}: cameras/{key} has no {'/'.join(missing)}; run `mmdata stats` again")
            found[rename.get(key, key)] = {
                name: _figure(figures[name], f"{where}: cameras/{key}/{name}", 3).reshape(3, 1, 1)
                for name in ("mean", "std")
            }
        return found

    def to_lerobot(self, batch: dict[str, Any]) -> dict[str, Any]:
        """One mmdata batch of this loader's spec as LeRobot's collated batch."""
        out: dict[str, Any] = {}
        for name in self.cameras:
            frames = batch[name]
            out[name] = to_unit_float(frames) if self.images == "float" and frames.dtype == torch.uint8 else frames
        for name in self.values:
            out[name] = batch[name]
        for name in (*self.cameras, *self.values):
            if name in self.delta_timestamps:
                out[name] = self._in_given_order(name, out[name])
                out[f"{name}_is_pad"] = self._in_given_order(name, batch[f"{name}_is_pad"])
            else:
                out[name] = out[name][:, 0]
        for name in self.scalars:
            out[name] = out[name][..., 0]
        time = batch["time"]
        rows = batch["episode_index"].cpu().numpy()
        frame_index = torch.round(time * self.fps).to(torch.int64)
        device = time.device
        frames = frame_index.cpu().numpy()
        task_index = self.numbering.task_index(rows, frames)
        out["timestamp"] = time.to(torch.float32)
        out["frame_index"] = frame_index
        out["episode_index"] = torch.from_numpy(self.numbering.episode_index[rows]).to(device)
        out["index"] = torch.from_numpy(self.numbering.index_from[rows]).to(device) + frame_index
        out["task_index"] = torch.from_numpy(task_index).to(device)
        out["task"] = self.numbering.task_text(task_index, batch["task"])
        for name, runs in self.numbering.texts.items():
            out[name] = runs.at(rows, frames).tolist()
        return out

    def _selected(self, episodes: Sequence[int] | Episodes | None) -> Episodes | None:
        """LeRobot's episode list (its `episode_index` values) as a filter of the store's manifest rows."""
        if episodes is None or isinstance(episodes, Episodes):
            return episodes
        if isinstance(episodes, (str, bytes)) or not isinstance(episodes, Sequence):
            raise SpecError(f"episodes is a list of LeRobot episode_index values, not {episodes!r:.60}")
        wanted = {option_int(e, "an episode of `episodes`", 0, 1 << 62, SpecError) for e in episodes}
        unknown = sorted(wanted - set(self.numbering.episode_index.tolist()))
        if unknown:
            raise SpecError(
                f"episodes {unknown[:10]} are not in the store; it holds LeRobot episodes"
                f" {sorted(self.numbering.episode_index.tolist())[:10]}..."
            )
        rows = np.flatnonzero(np.isin(self.numbering.episode_index, sorted(wanted)))
        return Episodes(ids=[int(self.dataset.manifest.row(int(r))["episode_index"]) for r in rows])

    def _offsets(self, name: str) -> tuple[float, ...]:
        """The distinct offsets of `name` in increasing order, as mmdata's specs take them (LeRobot's may repeat
        or decrease: `to_lerobot` puts the frames back in the order given)."""
        return tuple(sorted(set(self.delta_timestamps.get(name, (0.0,)))))

    def _in_given_order(self, name: str, values: torch.Tensor) -> torch.Tensor:
        """`values` `[B, T, ...]` at this stream's sorted distinct offsets, in `delta_timestamps`' own order."""
        given = self.delta_timestamps[name]
        distinct = self._offsets(name)
        if given == distinct:
            return values
        order = torch.as_tensor([distinct.index(offset) for offset in given], device=values.device)
        return values.index_select(1, order)


def _checked_delta_timestamps(delta_timestamps: Any) -> dict[str, tuple[float, ...]]:
    """LeRobot's `delta_timestamps` (stream -> offsets in seconds, in any order, repeats allowed), checked here:
    a mapping of names to at most MAX_OFFSETS finite numbers each."""
    if delta_timestamps is None:
        return {}
    if not isinstance(delta_timestamps, Mapping):
        raise SpecError(
            f"delta_timestamps maps stream names to lists of offsets in seconds, not {type(delta_timestamps).__name__}"
        )
    checked = {}
    for name, offsets in delta_timestamps.items():
        if not isinstance(name, str):
            raise SpecError(f"delta_timestamps keys are stream names, not {name!r}")
        if isinstance(offsets, np.ndarray) and offsets.ndim == 1:
            offsets = offsets.tolist()
        if isinstance(offsets, (str, bytes)) or not isinstance(offsets, Sequence) or not len(offsets):
            raise SpecError(f"delta_timestamps['{name}'] is a non-empty list of seconds, not {offsets!r:.60}")
        if len(offsets) > MAX_OFFSETS:
            raise SpecError(f"delta_timestamps['{name}'] lists {len(offsets)} offsets; at most {MAX_OFFSETS}")
        values = []
        for offset in offsets:
            if isinstance(offset, bool) or not isinstance(offset, (int, float, np.integer, np.floating)):
                raise SpecError(f"delta_timestamps['{name}'] holds {offset!r}, not a number of seconds")
            if not math.isfinite(offset):
                raise SpecError(f"delta_timestamps['{name}'] holds {offset}, not a finite number of seconds")
            values.append(float(offset))
        checked[name] = tuple(values)
    return checked


def _entries(section: Any, where: str, name: str) -> list[tuple[str, dict[str, Any]]]:
    """The (key, figures) of a section of `stats.json`, each an object; StoreError naming what is not, never a
    section or entry passed over (a policy would then normalize without it)."""
    if not isinstance(section, dict):
        raise StoreError(f"{where}: '{name}' is {shown(section)}, not an object of figures; run `mmdata stats` again")
    for key, figures in section.items():
        if not isinstance(figures, dict):
            raise StoreError(f"{where}: {name}/{key} is {shown(figures)}, not an object; run `mmdata stats` again")
    return list(section.items())


def _figure(value: Any, where: str, size: int | None = None) -> np.ndarray:
    """A statistic of `stats.json` as a finite numeric array as written (of `size` values when given), or a
    StoreError."""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):
        array = np.asarray(None)
    if array.dtype.kind not in "biuf":
        raise StoreError(f"{where} is not numbers; run `mmdata stats` again")
    if not np.isfinite(array).all() or (size is not None and array.size != size):
        raise StoreError(f"{where} is not {size or 'some'} finite numbers; run `mmdata stats` again")
    return array


def to_unit_float(frames: torch.Tensor) -> torch.Tensor:
    """uint8 frames as float32 in [0, 1], divided as LeRobot divides them (bit for bit). On the CPU in one compiled
    pass on this thread: torch's threaded kernels spin idle threads against the loader's own worker processes
    (measured on 2 cores: 0.8 of a core for what numpy does in 0.3), and numpy takes two passes (a cast, then
    the division) in twice the time."""
    if frames.device.type != "cpu":
        return frames.to(torch.float32).div_(255)
    source = np.ascontiguousarray(frames.numpy())
    unit = np.empty(source.shape, np.float32)
    unit_float_flat(source.reshape(-1), unit.reshape(-1))
    return torch.from_numpy(unit)


def _frame_rate(streams: dict) -> float:
    """The store's frame rate: its cameras' (which must agree), else its low-dim streams' fixed rate."""
    rates = {s.fps for s in streams.values() if isinstance(s, VideoStream)}
    rates = rates or {s.rate for s in streams.values() if isinstance(s, LowdimStream) and s.rate}
    if len(rates) != 1:
        raise SpecError(f"LeRobot-style samples need one frame rate; the store's streams have {sorted(rates)}")
    return float(next(iter(rates)))


def _popped(keywords: dict[str, Any], group: str) -> dict[str, Any]:
    """The fields of option `group` given as plain keywords (LeRobot's scripts pass `device=`, ...), taken out."""
    return {
        UNGROUPED_KEYWORDS[k][1]: keywords.pop(k)
        for k in list(keywords)
        if UNGROUPED_KEYWORDS.get(k, ("",))[0] == group
    }
