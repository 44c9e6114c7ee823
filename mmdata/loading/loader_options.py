"""The loader's options: those `torch.utils.data.DataLoader` has, spelled as PyTorch spells them as plain
keywords of the loader (`TorchOptions`: `batch_size`, `shuffle`, `num_workers`, `prefetch_factor`, `drop_last`,
`pin_memory`, `persistent_workers`, `timeout`), and the rest grouped by what they decide: how samples become
batches (`Batching`), in what order (`Shuffling`), where the work runs (`Runtime`) and how stores are read
(`Reading`).

`DataLoader`, `LeRobotLoader` and `mmdata bench` take the same words and objects. Each checks its values when it
is given (type, finite, in range), so a wrong option fails where it is written, not steps later. The spellings of
earlier versions (PyTorch's words inside a group, the other options as plain keywords) still work, give the same
batches and states, and warn with the one spelling (`resolve_options`).
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import torch

from mmdata.checks import option_bool, option_int
from mmdata.codecs.decoders import BACKEND_NAMES, VideoDecoder
from mmdata.codecs.decoders.select import host_cores_per_rank
from mmdata.errors import OptionError
from mmdata.loading.collate import LAYOUTS, Layout
from mmdata.planning.orders import Shuffle, as_shuffle
from mmdata.planning.packing.layouts import MaskKind
from mmdata.planning.planner import PlanSettings
from mmdata.store.filesystem import DEFAULT_READ_POLICY, ReadPolicy

Balance = Literal["tokens", "attention"]
DecodeIn = Literal["workers", "main"]


@dataclass(frozen=True)
class Batching:
    """How samples become micro-batches besides the loader's `batch_size`: `batch_tokens` instead of it (packed by
    token cost, `tokens_per` stream: tokens per frame, per value, per second of audio, 1 by default), the `layout`
    ("packed" by default with `batch_tokens`, "padded" with `batch_size`); `balance` evens the ranks' "tokens" or
    "attention" cost; `attention_mask` and `pad_to_multiple` shape the collated batch (see
    `mmdata.loading.collate`). (`batch_size` here is the earlier spelling of the loader's own.)"""

    batch_size: int | None = None
    batch_tokens: int | None = None
    tokens_per: Mapping[str, float] = field(default_factory=dict)
    layout: Layout | None = None
    balance: Balance = "tokens"
    attention_mask: MaskKind | None = None
    pad_to_multiple: int | None = None

    def __post_init__(self):
        if self.batch_tokens is not None and self.batch_size is not None:
            raise OptionError(
                "give exactly one of batch_tokens (token-budgeted packing) or batch_size (samples per batch)"
            )
        _check_optional_counts(
            batch_size=(self.batch_size, 1, 1 << 24),
            batch_tokens=(self.batch_tokens, 1, 1 << 40),
            pad_to_multiple=(self.pad_to_multiple, 1, 1 << 20),
        )
        layout = self.layout or ("packed" if self.batch_tokens is not None else "padded")
        if layout not in LAYOUTS:
            raise OptionError(f"layout is 'packed' or 'padded', not '{layout}'")
        object.__setattr__(self, "layout", layout)
        if self.attention_mask not in (None, "causal", "bidirectional"):
            raise OptionError(f"attention_mask is None, 'causal' or 'bidirectional', not {self.attention_mask!r:.60}")
        if self.balance not in ("tokens", "attention"):
            raise OptionError(f"balance is 'tokens' or 'attention', not {self.balance!r}")
        tokens_per = {} if self.tokens_per is None else self.tokens_per
        if not isinstance(tokens_per, Mapping):
            raise OptionError(f"tokens_per maps stream names to tokens, not {tokens_per!r:.60}")
        for name, tokens in tokens_per.items():
            if isinstance(tokens, bool) or not isinstance(tokens, numbers.Real) or not 0 < tokens < float("inf"):
                raise OptionError(f"tokens_per['{name}'] is a positive number of tokens, not {tokens!r}")
        object.__setattr__(self, "tokens_per", dict(tokens_per))


DEFAULT_LANES = 8  # (a rank's steps cut into lanes when the worker count is not fixed)


@dataclass(frozen=True)
class Shuffling:
    """The order of an epoch's samples (`mmdata.planning.orders`): `mode` "blocks" (runs of about a stored
    segment's samples, `open_segments` of them dealt in turn, each rank's steps cut into `lanes` lanes taken in
    turn; a lane's steps go to one worker when `lanes` is a multiple of `num_workers`, so that its frame cache
    decodes each frame about once; None gives one lane per worker, an order that then depends on the worker
    count), "locality" (shards shuffled, then samples within groups of `shards_per_group` shards), "global" (one
    permutation of every sample), "none" (manifest and time order), or "auto" (the default: "blocks" where the
    spec reads a camera, else "locality"). Every order is planned per rank in the time and memory of its own steps,
    whatever the epoch's size. The loader's `shuffle` chooses it (`True` / `False` are torch's: "auto" / "none");
    `mode` here is its earlier spelling. `window` bounds the samples the packer looks over at once."""

    mode: Shuffle | bool | None = None
    window: int = 8192
    shards_per_group: int = 8
    open_segments: int = 8
    lanes: int | None = 8

    def __post_init__(self):
        if self.mode is not None:
            object.__setattr__(self, "mode", as_shuffle(self.mode))
        _check_counts(
            shuffle_window=(self.window, 1, 1 << 40),
            shards_per_group=(self.shards_per_group, 1, 1 << 40),
            open_segments=(self.open_segments, 1, 1 << 20),
        )
        _check_optional_counts(lanes=(self.lanes, 1, 1024))


@dataclass(frozen=True)
class Runtime:
    """Where the work runs besides the loader's `num_workers` and `prefetch_factor` (their earlier spelling is
    here too): `device` receives the batches. `decoder` is a backend name (see
    `mmdata.codecs.decoders.make_video_decoder`; "auto" decodes on the GPU in the main process when `device`
    is a CUDA device and the measured work suits it, else in the workers on the fastest CPU backend) or a
    built `VideoDecoder`; `decode_in` overrides where ("main": workers send encoded segments and the main
    process decodes each micro-batch in one decoder call). `rank` / `world_size` default to torch.distributed's
    (or torchrun's environment). `profiler_ranges` marks every stage for the PyTorch profiler and Nsight.
    `cpu_budget` is the most workers `num_workers="auto"` may run (default: the cores this process may run on,
    shared among the ranks of its node;
    within it the tuner only ever adds a worker into cores that stood idle, see `mmdata.loading.autotune`)."""

    num_workers: int | Literal["auto"] | None = None
    prefetch_factor: int | None = None
    device: str | torch.device = "cpu"
    decoder: str | VideoDecoder = "auto"
    decode_in: DecodeIn | None = None
    rank: int | None = None
    world_size: int | None = None
    profiler_ranges: bool = False
    cpu_budget: int | None = None

    def __post_init__(self):
        if self.num_workers != "auto":
            _check_optional_counts(num_workers=(self.num_workers, 0, 1024))
        _check_optional_counts(prefetch_factor=(self.prefetch_factor, 1, 1024), cpu_budget=(self.cpu_budget, 1, 1024))
        if self.decode_in not in (None, "workers", "main"):
            raise OptionError(f"decode_in is 'workers' or 'main', not '{self.decode_in}'")
        if not isinstance(self.decoder, VideoDecoder) and self.decoder not in BACKEND_NAMES:
            raise OptionError(f"unknown decoder {self.decoder!r:.60}; choose one of {', '.join(BACKEND_NAMES)}")
        option_bool(self.profiler_ranges, "profiler_ranges")
        try:
            torch.device(self.device)
        except (RuntimeError, TypeError, ValueError) as exc:
            raise OptionError(f"device {self.device!r:.60} is not a torch device ({exc})") from None

    def resolved_device(self) -> torch.device:
        """A CUDA device without an index means this process's GPU: torchrun's LOCAL_RANK, else the current one."""
        resolved = torch.device(self.device)
        if resolved.type != "cuda" or resolved.index is not None:
            return resolved
        if "LOCAL_RANK" in os.environ:
            return torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        return torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)


@dataclass(frozen=True)
class Reading:
    """How stores are read: `verify` checks every piece against the manifest's checksum; `cache_bytes` of
    memory per process keep recently read timestamps, low-dim arrays and audio; `frame_cache_bytes` per
    worker keep the decoded frames its next steps need, so a segment is decoded once for all of them: "auto"
    sizes it from the plan within a share of the machine's memory (`mmdata.loading.frame_budget`), a number
    of bytes fixes it, 0 turns it off; `policy` sets the timeout, retries, concurrency and disk cache of the
    stores the loader opens from a path or URL (a `Store` passed in keeps its own)."""

    verify: bool = True
    cache_bytes: int = 256 << 20
    frame_cache_bytes: int | Literal["auto"] = "auto"
    policy: ReadPolicy = DEFAULT_READ_POLICY

    def __post_init__(self):
        option_bool(self.verify, "verify")
        _check_counts(cache_bytes=(self.cache_bytes, 0, 1 << 50))
        given = self.frame_cache_bytes
        if isinstance(given, str) and given != "auto":
            raise OptionError(f"frame_cache_bytes is 'auto' or a number of bytes, not {given!r:.60}")
        if not isinstance(given, str):
            _check_counts(frame_cache_bytes=(given, 0, 1 << 50))
        if not isinstance(self.policy, ReadPolicy):
            raise OptionError(f"policy is a ReadPolicy, not {self.policy!r:.60}")


@dataclass(frozen=True)
class TorchOptions:
    """The options `torch.utils.data.DataLoader` has, as the loader takes them: plain keywords, PyTorch's names.
    `batch_size` samples per micro-batch (or a `Batching(batch_tokens=...)` budget instead); `shuffle` True
    ("auto": an order that suits the spec), False ("none") or an order by name; `num_workers` processes read and
    (by default) decode, each `prefetch_factor` batches ahead ("auto", the default: as many as keep the training
    loop fed, chosen while it runs, see `mmdata.loading.autotune`; 0: the main process reads); `drop_last` leaves
    out the epoch's last, shorter step; `pin_memory` puts host batches in pinned memory (None: when `device` is a
    CUDA device); `persistent_workers` keeps the workers across epochs (the next epoch's first batches are ready
    as the last ends); `timeout` seconds a batch may take to come from the workers before TimeoutError (0: no
    bound)."""

    batch_size: int | None = None
    shuffle: Shuffle | bool = "auto"
    num_workers: int | Literal["auto"] = "auto"
    prefetch_factor: int = 2
    drop_last: bool = False
    pin_memory: bool | None = None
    persistent_workers: bool = True
    timeout: float = 0.0

    def __post_init__(self):
        _check_optional_counts(batch_size=(self.batch_size, 1, 1 << 24))
        object.__setattr__(self, "shuffle", as_shuffle(self.shuffle))
        if self.num_workers != "auto":
            _check_counts(num_workers=(self.num_workers, 0, 1024))
        _check_counts(prefetch_factor=(self.prefetch_factor, 1, 1024))
        option_bool(self.drop_last, "drop_last")
        option_bool(self.persistent_workers, "persistent_workers")
        if self.pin_memory is not None:
            option_bool(self.pin_memory, "pin_memory")
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, numbers.Real):
            raise OptionError(f"timeout is a number of seconds, not {self.timeout!r:.60}")
        if not 0 <= float(self.timeout) < 1e9:
            raise OptionError(f"timeout is 0 (no bound) or a positive number of seconds, not {self.timeout!r}")


TORCH_DEFAULTS = {f.name: f.default for f in fields(TorchOptions)}
TORCH_WORDS = tuple(TORCH_DEFAULTS)
# Where PyTorch's words were spelled inside the groups before they were the loader's own keywords.
GROUPED_TORCH_WORDS: dict[str, tuple[str, str]] = {
    "batch_size": ("batching", "batch_size"),
    "shuffle": ("shuffling", "mode"),
    "num_workers": ("runtime", "num_workers"),
    "prefetch_factor": ("runtime", "prefetch_factor"),
}
# The other options' plain keywords of the form before the groups: (group, field) of each.
UNGROUPED_KEYWORDS: dict[str, tuple[str, str]] = {
    "batch_tokens": ("batching", "batch_tokens"),
    "tokens_per": ("batching", "tokens_per"),
    "layout": ("batching", "layout"),
    "balance": ("batching", "balance"),
    "attention_mask": ("batching", "attention_mask"),
    "pad_to_multiple": ("batching", "pad_to_multiple"),
    "shuffle_window": ("shuffling", "window"),
    "shards_per_group": ("shuffling", "shards_per_group"),
    "device": ("runtime", "device"),
    "decoder": ("runtime", "decoder"),
    "decode_in": ("runtime", "decode_in"),
    "rank": ("runtime", "rank"),
    "world_size": ("runtime", "world_size"),
    "profiler_ranges": ("runtime", "profiler_ranges"),
    "verify": ("reading", "verify"),
    "cache_bytes": ("reading", "cache_bytes"),
    "frame_cache_bytes": ("reading", "frame_cache_bytes"),
}
GROUPS = {"batching": Batching, "shuffling": Shuffling, "runtime": Runtime, "reading": Reading}


@dataclass(frozen=True)
class LoaderOptions:
    """Every option of a loader, resolved: PyTorch's words and the four groups (their copies of PyTorch's words
    filled in, which the chain reads)."""

    torch: TorchOptions
    batching: Batching
    shuffling: Shuffling
    runtime: Runtime
    reading: Reading


def resolve_options(
    torch_given: dict[str, Any], groups: dict[str, Any], ungrouped: dict[str, Any], caller: str = "DataLoader"
) -> LoaderOptions:
    """The loader's options from PyTorch's words given as keywords (`torch_given`: only those given), the groups
    given (None where not) and any other keyword (`ungrouped`). The earlier spellings work and warn once with the
    one spelling: PyTorch's words inside a group (`Batching(batch_size=8)`: `batch_size=8`), the other options as
    plain keywords (`decoder="pyav"`: `runtime=mmdata.Runtime(decoder="pyav")`). A keyword that was never an
    option is a TypeError, as Python gives; an option said twice is an OptionError (which should win is not
    guessed); no batch size and no token budget is an OptionError saying how to give one."""
    unknown = sorted(set(ungrouped) - set(UNGROUPED_KEYWORDS))
    if unknown:
        raise TypeError(f"{caller}() got an unexpected keyword argument '{unknown[0]}'")
    for group, value in groups.items():
        if value is not None and not isinstance(value, GROUPS[group]):
            raise OptionError(f"{group} is a mmdata.{GROUPS[group].__name__}, not {value!r:.60}")
    fields_of: dict[str, dict[str, Any]] = {group: {} for group in GROUPS}
    for keyword, value in ungrouped.items():
        group, name = UNGROUPED_KEYWORDS[keyword]
        if groups.get(group) is not None:
            raise OptionError(f"give {keyword} inside {group}=, not beside it")
        fields_of[group][name] = value
    if ungrouped:
        instead = ", ".join(
            f"{g}=mmdata.{GROUPS[g].__name__}(...)" for g in sorted({UNGROUPED_KEYWORDS[k][0] for k in ungrouped})
        )
        _warn(f"{caller}({', '.join(f'{k}=' for k in ungrouped)}) is the ungrouped form; pass {instead} instead")
    made = {g: groups.get(g) or GROUPS[g](**fields_of[g]) for g in GROUPS}
    torch_words = dict(torch_given)
    for word, (group, name) in GROUPED_TORCH_WORDS.items():
        value = getattr(made[group], name)
        if value is None:
            continue
        if word in torch_words:
            raise OptionError(f"{word} is given twice, as {caller}({word}=...) and in {group}=; give it once: {word}=")
        torch_words[word] = value
        _warn(
            f"{GROUPS[group].__name__}({name}=...) is spelled {caller}({word}=...) now, as PyTorch spells it; pass"
            f" {word}={value!r:.40} to the loader"
        )
    resolved = TorchOptions(**torch_words)
    batching = made["batching"]
    if resolved.batch_size is not None and batching.batch_tokens is not None:
        raise OptionError("give exactly one of batch_size= (samples per batch) or Batching(batch_tokens=...)")
    if resolved.batch_size is None and batching.batch_tokens is None:
        raise OptionError(
            "give the batch: batch_size=... (samples per batch, as torch's DataLoader), or"
            " batching=mmdata.Batching(batch_tokens=...) for token-budgeted packing"
        )
    return LoaderOptions(
        resolved,
        _filled(batching, batch_size=resolved.batch_size),
        _filled(made["shuffling"], mode=resolved.shuffle),
        _filled(made["runtime"], num_workers=resolved.num_workers, prefetch_factor=resolved.prefetch_factor),
        made["reading"],
    )


def plan_settings(options: LoaderOptions) -> PlanSettings:
    """How the planner makes micro-batches from the options (one lane per worker unless lanes are given)."""
    batching, shuffling, torch_options = options.batching, options.shuffling, options.torch
    workers = torch_options.num_workers
    return PlanSettings(
        batching.batch_tokens,
        torch_options.batch_size,
        batching.balance,
        as_shuffle(torch_options.shuffle),
        shuffling.window,
        shuffling.shards_per_group,
        shuffling.lanes or (DEFAULT_LANES if workers == "auto" else max(1, workers)),
        shuffling.open_segments,
        torch_options.drop_last,
    )


@dataclass(frozen=True)
class WorkerCount:
    """How many worker processes read: `first` when the loader starts, and with `auto` (`num_workers="auto"`)
    anywhere from one to `most` as `mmdata.loading.autotune` chooses; a fixed count has first == most."""

    first: int
    most: int
    auto: bool


def worker_count(num_workers: int | Literal["auto"], cpu_budget: int | None) -> WorkerCount:
    """The workers `num_workers` asks for: N is exactly N; "auto" starts with two (one where the budget is one
    core) and may run as many as the CPU budget's cores (default: this rank's share of the cores the process may
    run on, the node's cores over torchrun's LOCAL_WORLD_SIZE)."""
    if num_workers != "auto":
        return WorkerCount(num_workers, num_workers, False)
    most = cpu_budget or host_cores_per_rank()
    return WorkerCount(min(2, most), most, True)


def split_keywords(keywords: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Options set by name (what `mmdata bench` and its sweeps set) as (PyTorch's words, the groups made from the
    rest, None where none is named)."""
    torch_words = {k: v for k, v in keywords.items() if k in TORCH_WORDS}
    fields_of: dict[str, dict[str, Any]] = {group: {} for group in GROUPS}
    for keyword, value in keywords.items():
        if keyword in TORCH_WORDS:
            continue
        if keyword not in UNGROUPED_KEYWORDS:
            known = ", ".join(sorted([*TORCH_WORDS, *UNGROUPED_KEYWORDS]))
            raise OptionError(f"unknown loader option '{keyword}'; choose from {known}")
        group, name = UNGROUPED_KEYWORDS[keyword]
        fields_of[group][name] = value
    return torch_words, {g: GROUPS[g](**fields_of[g]) if fields_of[g] else None for g in GROUPS}


def _filled(group: Any, **values: Any) -> Any:
    """`group` with PyTorch's words it carries for the chain set to their resolved values (no warning)."""
    return dataclasses.replace(group, **values)


def _warn(message: str) -> None:
    warnings.warn(f'{message} (see docs/loading.md, "The loader\'s options")', DeprecationWarning, stacklevel=4)


def _check_counts(**counts: tuple[int, int, int]) -> None:
    """Each keyword's value is a whole number within its given range (None is not one)."""
    for name, (value, least, most) in counts.items():
        option_int(value, name, least, most)


def _check_optional_counts(**counts: tuple[int | None, int, int]) -> None:
    """Each keyword's value is None (the option's own default, worked out later) or a whole number in range."""
    for name, (value, least, most) in counts.items():
        if value is not None:
            option_int(value, name, least, most)
