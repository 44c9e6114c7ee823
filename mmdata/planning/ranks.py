"""Who this process is in a distributed job: its rank and the world size."""

from __future__ import annotations

import os

from mmdata.errors import OptionError


def rank_and_world(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """Explicit arguments when given; else `torch.distributed` when initialised; else torchrun's
    `RANK` / `WORLD_SIZE` environment; else a single process (0, 1)."""
    if rank is None or world_size is None:
        found_rank, found_world = _from_torch() or _from_environment() or (0, 1)
        rank = found_rank if rank is None else rank
        world_size = found_world if world_size is None else world_size
    if world_size < 1:
        raise OptionError(f"world_size must be at least 1, not {world_size}")
    if not 0 <= rank < world_size:
        raise OptionError(f"rank {rank} is outside a world of {world_size} ranks")
    return int(rank), int(world_size)


def _from_torch() -> tuple[int, int] | None:
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def _from_environment() -> tuple[int, int] | None:
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return None
