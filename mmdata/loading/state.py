"""A loader's resumable state: small, plain, and checked against the loader it is loaded into."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import xxhash

from mmdata.sharding.epoch_plan import ResumeError, Stretch

STATE_FORMAT = "mmdata.loader"
STATE_VERSION = 1


@dataclass
class LoaderState:
    """Where a run stands: the epoch, the stretches of it run so far (world size, steps), and what
    the plan was made from (`fingerprint`: data, spec and batching, not world size or workers)."""

    seed: int
    epoch: int
    fingerprint: str
    stretches: list[Stretch] = field(default_factory=list)
    samples_consumed: int = 0

    @property
    def steps_in_epoch(self) -> int:
        return sum(stretch.steps for stretch in self.stretches)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "seed": self.seed,
            "epoch": self.epoch,
            "stretches": [[s.world_size, s.steps] for s in self.stretches],
            "samples_consumed": self.samples_consumed,
            "world_size": self.stretches[-1].world_size if self.stretches else None,
            "fingerprint": self.fingerprint,
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> LoaderState:
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ResumeError("this is not an mmdata.DataLoader state (no 'format': 'mmdata.loader')")
        if state.get("version") != STATE_VERSION:
            raise ResumeError(f"loader state version {state.get('version')}; this mmdata reads {STATE_VERSION}")
        try:
            stretches = [Stretch(int(w), int(s)) for w, s in state["stretches"]]
            return cls(
                int(state["seed"]),
                int(state["epoch"]),
                str(state["fingerprint"]),
                stretches,
                int(state["samples_consumed"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ResumeError(f"the loader state is incomplete or damaged: {exc!r}") from exc


def fingerprint(*parts: Any) -> str:
    """A short hash of everything the plan of an epoch depends on, besides seed, epoch and world size."""
    text = json.dumps(parts, sort_keys=True, default=repr)
    return xxhash.xxh64_hexdigest(text.encode())
