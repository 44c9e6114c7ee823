"""Where a batch's host tensors are allocated, and how a worker's decoded frames reach the main process.

A camera's frames of a micro-batch are written straight into the memory they will leave the worker in.
Inside a DataLoader worker that is the worker's ring in a `FrameArena`: shared memory the main process
mapped once, before the workers started, so a batch costs neither a new shared-memory file, a file
descriptor passed over a socket, nor the page faults of fresh pages on both sides (together about as
much as decoding the frames). The main process hands the frames on as tensors on the ring itself and
frees a span when the last tensor viewing it is gone, in any order: a batch the training loop keeps
holds its own span, not the ring. A batch the ring has no room for, and every other tensor, goes
through torch's shared memory as usual (`shared_output`).
"""

from __future__ import annotations

import ctypes
import math
import mmap
import platform
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mmdata.loading.worker_pool import current_worker

# Shared memory per worker for frames in flight, at least (a few batches of 8 policy windows: three 224x224
# frames each take 3.6 MB) and at most (sized from the batch; a larger batch goes through torch's own).
ARENA_BYTES_PER_WORKER = 64 << 20
MAX_ARENA_BYTES_PER_WORKER = 1 << 30
MAX_ARENA_BYTES = 8 << 30  # all workers' rings together
_ALIGNMENT = 64
_byte_bounds = getattr(getattr(np.lib, "array_utils", None), "byte_bounds", None) or getattr(np, "byte_bounds")  # noqa: B009 (numpy 2 / 1)
# A ring is cut into about this many chunks (each a multiple of _ALIGNMENT bytes): a span takes whole chunks.
CHUNKS_PER_RING = 1024
# glibc's mallopt parameters (malloc.h): the free memory at the heap's top it keeps, and how many blocks it may
# map on their own (0: every block comes from the heap, whose freed memory is reused)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
KEPT_FREE_BYTES = (1 << 31) - 1  # mallopt takes an int
# Tensors at least this large cross from workers in shared memory; smaller ones inside the pickled message.
SHARED_TENSOR_BYTES = 1 << 18


def shared_output(like: torch.Tensor, leading: tuple[int, ...]) -> torch.Tensor | None:
    """In a DataLoader worker, an uninitialised tensor of shape `leading + like.shape[1:]` in shared memory
    (`out=` for torch.cat/stack). None elsewhere, and for a tensor under `SHARED_TENSOR_BYTES`, which crosses
    inside the message (a shared-memory file of its own would cost five system calls here and more there)."""
    shape = (*leading, *like.shape[1:])
    small = math.prod(shape) * like.element_size() < SHARED_TENSOR_BYTES
    if like.device.type != "cpu" or small or current_worker() is None:
        return None
    storage = like._typed_storage()._new_shared(math.prod(shape), device=like.device)
    return like.new(storage).resize_(shape)


@dataclass(frozen=True)
class ArenaSpan:
    """Frames a worker left in its ring: where they start, and their shape (they fill whole chunks)."""

    worker: int
    start: int
    shape: tuple[int, ...]
    dtype: str = "uint8"

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


class FrameArena:
    """One ring of shared memory per worker for decoded frames on their way to the main process.

    Made by the main process before it forks the workers, which inherit the mapping (a worker started
    another way gets a copy without rings and uses torch's shared memory). Each ring is cut into chunks,
    each with a flag shared by both sides: a worker takes the next free run of chunks a camera's frames
    need and sends `ArenaSpan`s in place of the tensors; the main process makes each a tensor on the ring
    (`take`) and frees its chunks when the last tensor viewing it is gone, in whatever order that happens,
    so a batch the training loop keeps for good holds only its own chunks. A worker never waits for room:
    a batch that does not fit gets shared memory of its own.
    """

    def __init__(self, workers: int, bytes_per_worker: int = ARENA_BYTES_PER_WORKER):
        self.workers, self.capacity = workers, bytes_per_worker
        self.chunk = max(_ALIGNMENT, -(-bytes_per_worker // CHUNKS_PER_RING // _ALIGNMENT) * _ALIGNMENT)
        chunks = bytes_per_worker // self.chunk
        memory = mmap.mmap(-1, workers * (bytes_per_worker + chunks), flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        whole = np.frombuffer(memory, np.uint8)  # holds the mapping for as long as a view of it lives
        self._rings: np.ndarray | None = whole[: workers * bytes_per_worker].reshape(workers, bytes_per_worker)
        # per worker and chunk: 1 while a span holds it (set by the worker, cleared by the main process)
        self._taken: np.ndarray | None = whole[workers * bytes_per_worker :].reshape(workers, chunks)
        self._cursor = 0  # in a worker: the chunk after its last span, where it looks for room first
        self._recent: dict[int, ArenaSpan] = {}  # in a worker: spans allocated since the last `spans_of`

    def __getstate__(self) -> dict[str, Any]:
        return {"workers": self.workers, "capacity": self.capacity, "chunk": self.chunk,
                "_rings": None, "_taken": None, "_cursor": 0, "_recent": {}}  # fmt: skip

    def allocate(self, worker: int, shape: tuple[int, ...], dtype: np.dtype | type = np.uint8) -> np.ndarray | None:
        """Room for `shape` of `dtype` in `worker`'s ring (None when there is none free, or no ring here)."""
        if self._rings is None or self._taken is None:
            return None
        dtype = np.dtype(dtype)
        size = math.prod(shape) * dtype.itemsize
        count = self._chunks(size)
        first = _free_run(self._taken[worker], count, self._cursor)
        if first is None:
            return None
        self._taken[worker, first : first + count] = 1
        self._cursor = first + count
        start = first * self.chunk
        view = self._rings[worker, start : start + size].view(dtype).reshape(shape)
        self._recent[view.ctypes.data] = ArenaSpan(worker, start, tuple(shape), dtype.name)
        return view

    def spans_of(self, batch: dict[str, Any]) -> dict[str, Any]:
        """In a worker: `batch` with each tensor that fills a span of the ring replaced by that span. A span
        allocated since the last call that no tensor or array of the batch views is free again at once; one
        that leaves as part of one (pickled with the message, later) stays taken."""
        recent, self._recent = self._recent, {}
        spans = {}
        for name, value in batch.items():
            span = recent.get(value.data_ptr()) if isinstance(value, torch.Tensor) else None
            fills = value.numel() * value.element_size() == span.nbytes if span is not None else False
            if span is not None and fills and value.is_contiguous():
                spans[name] = ArenaSpan(span.worker, span.start, tuple(value.shape), span.dtype)
                del recent[value.data_ptr()]
        leaving = [memory for value in batch.values() if (memory := _memory_of(value)) is not None]
        for span in recent.values():
            if not any(self._overlaps(span, memory) for memory in leaving):
                self._free(span)
        return {**batch, **spans}

    def take(self, span: ArenaSpan, pin_memory: bool = False) -> torch.Tensor:
        """In the main process: the span's frames as a tensor on the ring itself, its chunks freed when the
        last tensor viewing it is gone (with `pin_memory`, copied into pinned memory and freed now)."""
        if self._rings is None or self._taken is None:
            raise RuntimeError("a frame arena span reached a process without the arena's memory")
        view = self._rings[span.worker, span.start : span.start + span.nbytes].view(span.dtype).reshape(span.shape)
        if pin_memory:
            frames = torch.empty(span.shape, dtype=torch.from_numpy(view[:0]).dtype, pin_memory=True)
            frames.numpy()[...] = view
            self._free(span)
            return frames
        weakref.finalize(view, self._free, span)
        return torch.from_numpy(view)

    def _free(self, span: ArenaSpan) -> None:
        """The span's chunks are free for the worker again (each flag has one writer at a time)."""
        assert self._taken is not None
        first = span.start // self.chunk
        self._taken[span.worker, first : first + self._chunks(span.nbytes)] = 0

    def _chunks(self, size: int) -> int:
        """The chunks `size` bytes take."""
        return -(-size // self.chunk)

    def _overlaps(self, span: ArenaSpan, memory: tuple[int, int]) -> bool:
        assert self._rings is not None
        low = self._rings[span.worker].ctypes.data + span.start
        return memory[0] < low + span.nbytes and low < memory[1]


def _memory_of(value: Any) -> tuple[int, int] | None:
    """The host memory [low, high) a batch value views (a tensor's whole storage, an array's extent), if any."""
    if isinstance(value, torch.Tensor) and value.device.type == "cpu":
        storage = value.untyped_storage()
        return storage.data_ptr(), storage.data_ptr() + storage.nbytes()
    if isinstance(value, np.ndarray):
        return _byte_bounds(value)
    return None


def _free_run(taken: np.ndarray, count: int, cursor: int) -> int | None:
    """The first chunk of `count` free ones in a row, looking from `cursor` to the end and then from the
    start (next fit: spans follow each other round the ring as they are freed in order)."""
    chunks = len(taken)
    if count > chunks or count < 1:
        return None
    position, wrapped = (cursor if cursor + count <= chunks else 0), cursor + count > chunks
    while True:
        if position + count > chunks:
            if wrapped:
                return None
            position, wrapped = 0, True
        if wrapped and position >= cursor:  # every start from the cursor on was looked at before wrapping
            return None
        held = np.flatnonzero(taken[position : position + count])
        if not len(held):
            return position
        position += int(held[-1]) + 1


def keep_freed_memory_mapped() -> bool:
    """Make this process's allocator reuse the memory it frees rather than hand it back to the system.

    A loader worker decodes frames into new arrays (0.9 MB each at 480x640, a segment's run tens of MB) and
    frees them when the frame cache lets them go. glibc maps blocks that large on their own and unmaps them
    when freed, so every decoded frame was written into fresh pages the kernel first had to zero: a sixth of a
    worker's CPU at 480x640. Here large blocks come from the heap and up to 2 GiB of its free top is kept, so
    from its second epoch a worker decodes into memory it already has; its peak memory is unchanged (the frame
    cache's bound holds it). For processes mmdata owns (loader workers) only. True where applied (glibc).
    """
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, KEPT_FREE_BYTES))


_worker_arena: tuple[FrameArena, int] | None = None


def use_arena(arena: FrameArena | None, worker: int) -> None:
    """Make `host_frames` in this (worker) process allocate from `worker`'s ring of `arena`."""
    global _worker_arena
    _worker_arena = (arena, worker) if arena is not None else None


def host_frames(count: int, frame_shape: tuple[int, ...], dtype: np.dtype | type = np.uint8) -> torch.Tensor:
    """Room for `count` frames of `frame_shape` (uint8, or float32 in [0, 1]), uninitialised: a batch's camera,
    decoded samples written straight into it (in a worker: its ring of the frame arena, else torch's shared
    memory)."""
    shape = (count, *frame_shape)
    if _worker_arena is not None and current_worker() is not None:
        arena, worker = _worker_arena
        view = arena.allocate(worker, shape, dtype)
        if view is not None:
            return torch.from_numpy(view)
    like = torch.from_numpy(np.empty((0, *frame_shape), dtype))
    shared = shared_output(like, (count,))
    return shared if shared is not None else torch.from_numpy(np.empty(shape, dtype))
