"""A loader's resumable state: small, plain, and checked against the loader it is loaded into."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mmdata.checks import as_int
from mmdata.errors import ResumeError
from mmdata.planning.loader_plan import LoaderPlan
from mmdata.planning.planner import EpochPlan, Stretch
from mmdata.store.handle import Store

STATE_FORMAT = "mmdata.loader"
STATE_VERSION = 3
# States of an earlier version were saved by orders whose steps are no longer made (version 1: before the one
# planner; version 2: the "blocks" order dealt its groups across the ends of lanes).
RETIRED_VERSIONS = {
    1: "an mmdata before 2026-12 (its orders made other steps)",
    2: "an mmdata of early 2026-12 (its 'blocks' order dealt blocks across lanes: other steps)",
}
MAX_WORLD_SIZE = 1 << 20
MAX_EPOCH = (1 << 31) - 1
MAX_STRETCHES = 4096  # world-size changes within one epoch (each resize adds one; replaying them costs each its plan)
MAX_STORES = 1 << 16  # the stores (sources) a state counts episodes of
BIG = 1 << 62  # seeds, steps and sample counts


@dataclass
class LoaderState:
    """Where a run stands: the epoch, the stretches of it run so far (world size, steps), and what
    the plan was made from (`fingerprint`: data, spec and batching, not world size or workers)."""

    seed: int
    epoch: int
    fingerprint: str
    stretches: list[Stretch] = field(default_factory=list)
    _samples_consumed: int = 0
    _counting: EpochPlan | None = field(default=None, repr=False, compare=False)

    @property
    def samples_consumed(self) -> int:
        """Samples all ranks consumed since the epoch began, counted when asked (after every step it would cost
        the "blocks" order under a token budget a window packed in the training loop's process)."""
        if self._counting is not None and self.stretches:
            self._samples_consumed = self._counting.samples_consumed(self.stretches[-1].steps)
        self._counting = None
        return self._samples_consumed

    @samples_consumed.setter
    def samples_consumed(self, value: int) -> None:
        self._samples_consumed, self._counting = value, None

    def advance(self, plan: EpochPlan, world_size: int) -> None:
        """Count one step of `plan` (the epoch's plan at `world_size`) as consumed, and move the plan to where the
        state now stands; after the epoch's last step, point at the start of the next epoch."""
        if not self.stretches or self.stretches[-1].world_size != world_size:
            self.stretches = list(plan.stretches)
        last = self.stretches[-1]
        self.stretches[-1] = Stretch(last.world_size, last.steps + 1)
        self._counting = plan
        plan.stretches = list(self.stretches)
        if self.stretches[-1].steps == len(plan.plan):
            self.epoch += 1
            self.stretches = []
            self.samples_consumed = 0

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
        version = state.get("version")
        if version in RETIRED_VERSIONS:
            epoch = state.get("epoch")
            next_epoch = f"loader.set_epoch({epoch + 1})" if isinstance(epoch, int) else "loader.set_epoch(...)"
            raise ResumeError(
                f"the loader state was saved by {RETIRED_VERSIONS[version]}, whose steps this mmdata no longer makes"
                f" (loader state version {version}; this one reads {STATE_VERSION}). To go on from the next epoch,"
                f" build the loader and call {next_epoch} instead of load_state_dict; to finish that epoch exactly,"
                " resume it with the mmdata that saved it"
            )
        if version != STATE_VERSION:
            raise ResumeError(f"loader state version {version!r:.40}; this mmdata reads {STATE_VERSION}")
        try:
            listed = state["stretches"]
            if not isinstance(listed, list) or len(listed) > MAX_STRETCHES:
                raise ValueError(f"'stretches' is not a list of at most {MAX_STRETCHES} [world size, steps] pairs")
            if any(not isinstance(pair, list | tuple) or len(pair) != 2 for pair in listed):
                raise ValueError("a stretch is not a [world size, steps] pair")
            stretches = [
                Stretch(as_int(w, "a stretch's world size", 1, MAX_WORLD_SIZE), as_int(s, "a stretch's steps", 0, BIG))
                for w, s in listed
            ]
            episodes = state.get("episodes")
            if episodes is not None and (not isinstance(episodes, list) or len(episodes) > MAX_STORES):
                raise ValueError(f"'episodes' is not a list of at most {MAX_STORES} episode counts")
            for count in episodes or []:
                as_int(count, "a store's episode count", 0, BIG)
            fingerprint = state["fingerprint"]
            if not isinstance(fingerprint, str):
                raise ValueError(f"fingerprint is {type(fingerprint).__name__}, not text")
            return cls(
                as_int(state["seed"], "seed", 0, BIG),
                as_int(state["epoch"], "epoch", 0, MAX_EPOCH),
                fingerprint,
                stretches,
                as_int(state["samples_consumed"], "samples_consumed", 0, BIG),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ResumeError(f"the loader state is incomplete or damaged: {exc}") from exc


def check_resumable(loaded: LoaderState, saved_counts: list[int] | None, plan: LoaderPlan, stores: list[Store]) -> None:
    """Refuse a state a loader of `plan` over `stores` cannot go on from, saying why and how to go on: one made
    over other episodes (`saved_counts`, each store's episodes when it was saved: an append), or for other data
    or settings."""
    if loaded.fingerprint == plan.fingerprint:
        return
    counts = [len(store) for store in stores]
    if saved_counts not in (None, counts):
        grown = [
            f"'{store.url}' held {then} episodes then and holds {now} now"
            for store, then, now in zip(stores, saved_counts, counts)
            if then != now
        ]
        raise ResumeError(
            f"the saved loader state was made over other episodes ({'; '.join(grown) or saved_counts}: episodes"
            " were appended, deleted by `mmdata edit`, or the store replaced); its epoch was planned over the"
            " episodes of then and cannot go on over others. To go on with every episode from the next epoch,"
            f" build the loader and call loader.set_epoch({loaded.epoch + 1}) instead of load_state_dict; to"
            " finish that epoch exactly, resume on the store as it was (a copy made before the change)"
        )
    raise ResumeError(
        "the saved loader state was made for other data or other sampling/batching settings"
        " (dataset manifest, spec, episode filter, tokens_per, batch size or shuffle differ);"
        " build the loader as before, or start the run fresh"
    )


class RunPosition:
    """Where a loader's run stands (its `state`) and the plan of the epoch there, made once per position: the
    planner's plans for `world_size` ranks, resumable from a saved state and moved on step by step."""

    def __init__(self, plan: LoaderPlan, seed: int, world_size: int):
        self.plan, self.world_size = plan, world_size
        self.state = LoaderState(seed, 0, plan.fingerprint)
        self._cached: tuple[tuple, EpochPlan] | None = None

    def epoch_plan(self) -> tuple[EpochPlan, bool]:
        """The plan of the current epoch at this world size, and whether it was made now (not kept)."""
        key = self._key(self.state.epoch, self.state.stretches)
        made = self._cached is None or self._cached[0] != key
        if made:
            self._cached = (key, self.plan.planner.epoch_plan(*key))
        assert self._cached is not None
        return self._cached[1], made

    def set_epoch(self, epoch: int) -> bool:
        """Stand at the start of `epoch`; whether that moved the position."""
        if epoch == self.state.epoch:
            return False
        self.state.epoch, self.state.stretches, self.state.samples_consumed = int(epoch), [], 0
        return True

    def to_dict(self, stores: list[Store]) -> dict[str, Any]:
        """The state to save, with each store's episode count (to say why it no longer fits after an append)."""
        state = self.state.to_dict()
        if not self.state.stretches:
            state["world_size"] = self.world_size
        state["episodes"] = [len(store) for store in stores]
        return state

    def load(self, state: dict[str, Any], stores: list[Store]) -> None:
        """Stand where `state` (a `to_dict`) says, refused with the reason where this plan cannot go on from it."""
        loaded = LoaderState.from_dict(state)
        check_resumable(loaded, state.get("episodes"), self.plan, stores)
        self.state = loaded

    def advance(self, plan: EpochPlan) -> None:
        """Count one step of `plan` as consumed; the kept plan stands where the state does, so a feed started from
        it (after a close) begins at the next step, not at the step the plan was made at."""
        epoch = self.state.epoch
        self.state.advance(plan, self.world_size)
        self._cached = (self._key(epoch, plan.stretches), plan)

    def _key(self, epoch: int, stretches: list[Stretch]) -> tuple:
        """What an epoch's plan is made from: (seed, epoch, the stretches run so far, world size)."""
        return (self.state.seed, epoch, tuple(stretches), self.world_size)
