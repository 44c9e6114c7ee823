"""The loader's options, grouped by what they decide: how samples become batches (`Batching`), in what
order (`Shuffling`), where the work runs (`Runtime`) and how stores are read (`Reading`).

`DataLoader`, `LeRobotLoader` and `mmdata bench` take the same objects. Each checks its values when
it is made (type, finite, in range), so a wrong option fails where it is written, not steps later.
What to sample (the store or mixture, the spec, the episodes), the seed and what to do on errors
are the loader's own arguments.
"""

from __future__ import annotations

import numbers
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from mmdata.checks import option_bool, option_int
from mmdata.codecs.decoders import BACKEND_NAMES, VideoDecoder
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
    """How samples become micro-batches: exactly one of `batch_size` (that many samples of similar cost,
    "padded" layout by default) or `batch_tokens` (packed by token cost, `tokens_per` stream: tokens per
    frame, per value, per second of audio, 1 by default; "packed" layout by default). `balance` evens the
    ranks' "tokens" or "attention" cost; `attention_mask` and `pad_to_multiple` shape the collated batch
    (see `mmdata.loading.collate`)."""

    batch_size: int | None = None
    batch_tokens: int | None = None
    tokens_per: Mapping[str, float] = field(default_factory=dict)
    layout: Layout | None = None
    balance: Balance = "tokens"
    attention_mask: MaskKind | None = None
    pad_to_multiple: int | None = None

    def __post_init__(self):
        if (self.batch_tokens is None) == (self.batch_size is None):
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


@dataclass(frozen=True)
class Shuffling:
    """The order of an epoch's samples (`mmdata.planning.orders`): `mode` "blocks" (runs of about a stored
    segment's samples, `open_segments` of them dealt in turn, each rank's steps cut into `lanes` lanes taken in
    turn; a lane's steps go to one worker when `lanes` is a multiple of `num_workers`, so that its frame cache
    decodes each frame about once; None gives one lane per worker, an order that then depends on the worker
    count), "locality" (shards shuffled, then samples within groups of `shards_per_group` shards), "global" (one
    permutation of every sample), "none" (manifest and time order), or "auto" (the default: "blocks" where the
    spec reads a camera, else "locality"). Every order is planned per rank in the time and memory of its own steps,
    whatever the epoch's size. `True` / `False` are torch's ("auto" / "none"). `window` bounds the samples the
    packer looks over at once."""

    mode: Shuffle | bool = "auto"
    window: int = 8192
    shards_per_group: int = 8
    open_segments: int = 8
    lanes: int | None = 8

    def __post_init__(self):
        object.__setattr__(self, "mode", as_shuffle(self.mode))
        _check_counts(
            shuffle_window=(self.window, 1, 1 << 40),
            shards_per_group=(self.shards_per_group, 1, 1 << 40),
            open_segments=(self.open_segments, 1, 1 << 20),
        )
        _check_optional_counts(lanes=(self.lanes, 1, 1024))


@dataclass(frozen=True)
class Runtime:
    """Where the work runs. `num_workers` processes read and (by default) decode, each `prefetch_factor`
    batches ahead; `device` receives the batches. `decoder` is a backend name (see
    `mmdata.codecs.decoders.make_video_decoder`; "auto" decodes on the GPU in the main process when `device`
    is a CUDA device and the measured work suits it, else in the workers on the fastest CPU backend) or a
    built `VideoDecoder`; `decode_in` overrides where ("main": workers send encoded segments and the main
    process decodes each micro-batch in one decoder call). `rank` / `world_size` default to torch.distributed's
    (or torchrun's environment). `profiler_ranges` marks every stage for the PyTorch profiler and Nsight."""

    num_workers: int = 0
    prefetch_factor: int = 2
    device: str | torch.device = "cpu"
    decoder: str | VideoDecoder = "auto"
    decode_in: DecodeIn | None = None
    rank: int | None = None
    world_size: int | None = None
    profiler_ranges: bool = False

    def __post_init__(self):
        _check_counts(num_workers=(self.num_workers, 0, 1024), prefetch_factor=(self.prefetch_factor, 1, 1024))
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


# The keyword arguments `DataLoader` took before the options were grouped: (group, field) of each.
LEGACY_KEYWORDS: dict[str, tuple[str, str]] = {
    "batch_size": ("batching", "batch_size"),
    "batch_tokens": ("batching", "batch_tokens"),
    "tokens_per": ("batching", "tokens_per"),
    "layout": ("batching", "layout"),
    "balance": ("batching", "balance"),
    "attention_mask": ("batching", "attention_mask"),
    "pad_to_multiple": ("batching", "pad_to_multiple"),
    "shuffle": ("shuffling", "mode"),
    "shuffle_window": ("shuffling", "window"),
    "shards_per_group": ("shuffling", "shards_per_group"),
    "num_workers": ("runtime", "num_workers"),
    "prefetch_factor": ("runtime", "prefetch_factor"),
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


def plan_settings(batching: Batching, shuffling: Shuffling, num_workers: int) -> PlanSettings:
    """How the planner makes micro-batches from these options (one lane per worker unless lanes are given)."""
    return PlanSettings(
        batching.batch_tokens,
        batching.batch_size,
        batching.balance,
        shuffling.mode,
        shuffling.window,
        shuffling.shards_per_group,
        shuffling.lanes or max(1, num_workers),
        shuffling.open_segments,
    )


def grouped_options(given: dict[str, Any], keywords: dict[str, Any], caller: str = "DataLoader") -> dict[str, Any]:
    """The option groups, from the groups `given` (None where not given) and the keywords of the ungrouped
    signature (`batch_size=8, num_workers=2, ...`), which still work and warn once that they are deprecated.

    A keyword that was never an option is a TypeError, as Python gives; a keyword beside its own group
    is an OptionError (which one should win is not guessed).
    """
    unknown = sorted(set(keywords) - set(LEGACY_KEYWORDS))
    if unknown:
        raise TypeError(f"{caller}() got an unexpected keyword argument '{unknown[0]}'")
    for keyword in keywords:
        group = LEGACY_KEYWORDS[keyword][0]
        if given.get(group) is not None:
            raise OptionError(f"give {keyword} inside {group}=, not beside it")
    if keywords:
        groups = sorted({LEGACY_KEYWORDS[keyword][0] for keyword in keywords})
        instead = ", ".join(f"{group}=mmdata.{GROUPS[group].__name__}(...)" for group in groups)
        warnings.warn(
            f"{caller}({', '.join(f'{k}=' for k in keywords)}) is the ungrouped form; pass {instead} instead"
            ' (see docs/loading.md, "The loader\'s options")',
            DeprecationWarning,
            stacklevel=3,
        )
    made = group_keywords(keywords)
    grouped = {}
    for group, kind in GROUPS.items():
        value = given.get(group)
        if value is None:
            value = made[group]
        elif not isinstance(value, kind):
            raise OptionError(f"{group} is a mmdata.{kind.__name__}, not {value!r:.60}")
        grouped[group] = value
    if grouped["batching"] is None:
        raise OptionError(
            "give exactly one of batch_tokens (token-budgeted packing) or batch_size (samples per batch):"
            " batching=mmdata.Batching(batch_size=...)"
        )
    return grouped


def group_keywords(keywords: dict[str, Any]) -> dict[str, Any]:
    """The option groups made from keywords named as in the ungrouped form (what `mmdata bench` and its
    sweeps set by name); a group none of them names is its default (`batching`: None)."""
    fields: dict[str, dict[str, Any]] = {group: {} for group in GROUPS}
    for keyword, value in keywords.items():
        if keyword not in LEGACY_KEYWORDS:
            raise OptionError(f"unknown loader option '{keyword}'; choose from {', '.join(sorted(LEGACY_KEYWORDS))}")
        group, name = LEGACY_KEYWORDS[keyword]
        fields[group][name] = value
    return {
        group: kind(**fields[group]) if group != "batching" or fields[group] else None for group, kind in GROUPS.items()
    }


def _check_counts(**counts: tuple[int, int, int]) -> None:
    """Each keyword's value is a whole number within its given range (None is not one)."""
    for name, (value, least, most) in counts.items():
        option_int(value, name, least, most)


def _check_optional_counts(**counts: tuple[int | None, int, int]) -> None:
    """Each keyword's value is None (the option's own default, worked out later) or a whole number in range."""
    for name, (value, least, most) in counts.items():
        if value is not None:
            option_int(value, name, least, most)
