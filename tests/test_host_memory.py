"""A worker's decoded frames reach the main process through its ring of shared memory: spans take whole
chunks, follow each other round the ring, are refused (never waited for) when there is no room, are freed in
whatever order their tensors go, and come back out exactly; batches are the same whether they travel through
the ring or, when it has no room, torch's shared memory."""

from __future__ import annotations

import pickle
import platform
import resource
import subprocess
import sys

import numpy as np
import pytest
import torch

import mmdata
import mmdata.loading.feed as feed
from mmdata.loading import host_memory
from mmdata.loading.host_memory import SHARED_TENSOR_BYTES, ArenaSpan, FrameArena, shared_output
from tests.test_frame_cache import WINDOWS
from tests.test_loader import assert_same_batches


def sent(arena: FrameArena, worker: int, shape: tuple[int, ...], value: int) -> ArenaSpan:
    """A worker's span of `shape` filled with `value`, as it leaves in a batch."""
    view = arena.allocate(worker, shape)
    assert view is not None
    view[...] = value
    return arena.spans_of({"cam": torch.from_numpy(view)})["cam"]


def test_spans_come_back_exactly_and_the_ring_refuses_rather_than_overwrites():
    arena = FrameArena(workers=2, bytes_per_worker=1024)  # 16 chunks of 64 bytes
    first = arena.allocate(1, (4, 100))  # 7 chunks
    first[...] = np.arange(400).reshape(4, 100) % 251
    span = arena.spans_of({"cam": torch.from_numpy(first)})["cam"]
    assert isinstance(span, ArenaSpan) and span.worker == 1 and span.shape == (4, 100)
    assert arena.allocate(1, (10, 100)) is None, "7 + 16 chunks do not fit in 16 while the first is in flight"
    second = arena.allocate(1, (5, 100))  # 8 chunks, after the first
    second[...] = 7
    taken = arena.take(span)
    assert torch.equal(taken, torch.from_numpy(np.arange(400).reshape(4, 100) % 251))
    assert arena.allocate(1, (4, 100)) is None, "the first is still in use by the tensor taken from it"
    del taken  # the last tensor on the first span is gone: its chunks are free
    wrapped = arena.allocate(1, (4, 100))
    assert wrapped is not None and wrapped.ctypes.data == first.ctypes.data
    assert (second == 7).all(), "the span still in flight is untouched"
    assert arena.allocate(0, (11, 100)) is None, "larger than the ring"


def test_a_span_freed_out_of_order_is_room_again_at_once_and_a_batch_kept_for_good_holds_only_its_own():
    arena = FrameArena(workers=1, bytes_per_worker=512)  # 8 chunks of 64 bytes
    held = [arena.take(sent(arena, 0, (2, 64), number)) for number in range(3)]  # chunks 0-1, 2-3, 4-5
    del held[1]  # the middle batch is dropped first
    assert arena.allocate(0, (4, 64)) is None, "two free chunks at the end and two in the middle: not four in a row"
    kept_for_good = held.pop(0)
    for round_ in range(20):  # the training loop keeps the first batch, and goes on
        held.append(arena.take(sent(arena, 0, (2, 64), round_)))
        del held[0]
    assert (kept_for_good.numpy() == 0).all(), "the batch kept is untouched"
    assert (held[0].numpy() == 19).all()


def test_a_span_a_worker_allocated_but_did_not_send_is_free_again():
    arena = FrameArena(workers=1, bytes_per_worker=512)
    unsent = arena.allocate(0, (8, 64))  # the whole ring, for a batch that failed before it was sent
    assert unsent is not None and arena.allocate(0, (1, 64)) is None
    arena.spans_of({"state": torch.zeros(3)})
    assert arena.allocate(0, (8, 64)) is not None


def test_a_span_that_leaves_inside_an_array_stays_taken():
    arena = FrameArena(workers=1, bytes_per_worker=512)
    view = arena.allocate(0, (8, 64))
    arena.spans_of({"frames": view[:2]})  # an array viewing it leaves in the message, pickled later
    assert arena.allocate(0, (1, 64)) is None


def test_free_runs_are_found_after_the_cursor_then_from_the_start():
    taken = np.array([0, 0, 1, 0, 0, 0, 1, 0], np.uint8)
    assert host_memory._free_run(taken, 2, 3) == 3
    assert host_memory._free_run(taken, 2, 5) == 0, "chunk 7 alone is too short: wrap to the start"
    assert host_memory._free_run(taken, 3, 7) == 3
    assert host_memory._free_run(taken, 4, 0) is None
    assert host_memory._free_run(np.zeros(4, np.uint8), 4, 2) == 0


def test_an_arena_that_reaches_a_process_without_its_memory_gives_no_room():
    arena = pickle.loads(pickle.dumps(FrameArena(workers=1, bytes_per_worker=1000)))
    assert arena.allocate(0, (10,)) is None


def test_a_worker_tensor_that_is_not_a_whole_span_travels_as_a_tensor_and_its_span_stays_taken():
    arena = FrameArena(workers=1, bytes_per_worker=1000)
    view = arena.allocate(0, (10, 10))
    part = torch.from_numpy(view)[5:]
    assert isinstance(arena.spans_of({"cam": part})["cam"], torch.Tensor)
    assert arena.allocate(0, (14, 64)) is None, "its chunks stay taken: torch copies the part when it pickles it"


def test_a_workers_ring_holds_the_batches_it_may_have_in_flight_within_its_bounds():
    assert feed.ring_bytes(None, 2, 2) == feed.ARENA_BYTES_PER_WORKER
    assert feed.ring_bytes(20 << 20, 2, 2) == 6 * (20 << 20)
    assert feed.ring_bytes(1 << 30, 2, 2) == feed.MAX_ARENA_BYTES_PER_WORKER


def test_the_rings_stay_within_their_total_and_a_refused_mapping_means_no_rings(monkeypatch):
    monkeypatch.setattr(feed, "MAX_ARENA_BYTES", 32 << 20)
    arena = feed.frame_arena(16, feed.MAX_ARENA_BYTES_PER_WORKER)
    assert arena is not None and arena.capacity * 16 <= 32 << 20

    def refused(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr("mmdata.loading.host_memory.mmap.mmap", refused)
    assert feed.frame_arena(2, 1 << 20) is None


def loader_batches(store, workers: int) -> list[dict]:
    return list(
        mmdata.DataLoader(
            str(store), WINDOWS, batch_size=4, num_workers=workers, seed=3, runtime=mmdata.Runtime(decoder="pyav")
        )
    )


def test_a_worker_puts_only_large_tensors_in_shared_memory_small_ones_cross_inside_the_message(monkeypatch):
    monkeypatch.setattr(host_memory, "current_worker", lambda: 0)  # as inside a loader worker
    like = torch.zeros((0, 16, 14), dtype=torch.float32)
    rows = SHARED_TENSOR_BYTES // (16 * 14 * 4)
    assert shared_output(like, (rows - 1,)) is None  # state and action of a batch: no shared-memory file each
    large = shared_output(like, (rows + 1,))
    assert large is not None and large.is_shared() and tuple(large.shape) == (rows + 1, 16, 14)
    monkeypatch.setattr(host_memory, "current_worker", lambda: None)
    assert shared_output(like, (rows + 1,)) is None  # the main process allocates as usual


@pytest.mark.slow
@pytest.mark.parametrize("ring_bytes", [64 << 20, 1000], ids=["through-the-ring", "ring-too-small"])
def test_batches_from_workers_are_the_in_process_batches_through_the_ring_or_without_it(
    stores, monkeypatch, ring_bytes
):
    taken = []
    original = FrameArena.take

    def counted(self, span, pin_memory=False):
        taken.append(span)
        return original(self, span, pin_memory)

    monkeypatch.setattr(feed, "ring_bytes", lambda frame_bytes, prefetch_factor, ahead: ring_bytes)
    monkeypatch.setattr(FrameArena, "take", counted)
    assert_same_batches(loader_batches(stores["wds"], 2), loader_batches(stores["wds"], 0))
    if ring_bytes > 1000:
        assert len(taken) >= 2 * 4, "both cameras of every batch came through the rings"
    else:
        assert not taken


@pytest.mark.slow
def test_a_batch_the_training_loop_keeps_for_good_leaves_the_rings_to_every_later_batch(stores, monkeypatch):
    on_the_rings = set()
    original = FrameArena.take

    def noted(self, span, pin_memory=False):
        frames = original(self, span, pin_memory)
        on_the_rings.add(frames.data_ptr())
        return frames

    # rings with room for a dozen batches: a kept batch that stopped a ring would send the rest elsewhere
    monkeypatch.setattr(feed, "ring_bytes", lambda frame_bytes, prefetch_factor, ahead: 12 * (frame_bytes or 1 << 20))
    monkeypatch.setattr(FrameArena, "take", noted)
    loader = mmdata.DataLoader(
        str(stores["wds"]), WINDOWS, batch_size=4, num_workers=2, seed=3, runtime=mmdata.Runtime(decoder="pyav")
    )
    kept, batches, through_the_rings = None, 0, 0
    while batches < 60:
        for batch in loader:
            if kept is None:  # the first batch, kept for good (a warm-up loop's last batch is)
                kept, as_it_came = batch, {name: batch[name].clone() for name in ("cam_high", "cam_wrist")}
            batches += 1
            through_the_rings += all(batch[name].data_ptr() in on_the_rings for name in ("cam_high", "cam_wrist"))
    loader.close()
    assert through_the_rings == batches, "both cameras of every batch came through the rings"
    assert all(torch.equal(kept[name], frames) for name, frames in as_it_came.items()), "nothing wrote over it"


_REALLOCATION = """
import ctypes, os, resource, sys, types
import mmdata.loading.feed as feed
if sys.argv[1] == "worker":  # what a pool worker does first
    feed.StepSource.start_in_worker(types.SimpleNamespace(arena=None), 0)
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes, libc.memset.argtypes = (ctypes.c_void_p,), (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t)
size = 96 << 20
block = libc.malloc(size); libc.memset(block, 1, size); libc.free(block)  # a segment's frames, let go
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
block = libc.malloc(size); libc.memset(block, 2, size)  # the next segment's frames
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.slow
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the allocator policy is glibc's (mallopt)")
def test_a_loader_worker_decodes_into_memory_it_freed_not_into_fresh_pages_the_kernel_must_zero():
    def faults(role: str) -> int:
        run = subprocess.run([sys.executable, "-c", _REALLOCATION, role], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        return int(run.stdout.split()[-1])

    pages = (96 << 20) // resource.getpagesize()
    in_worker, elsewhere = faults("worker"), faults("main")
    assert in_worker <= pages // 100, f"a worker faulted {in_worker} pages in for a block it had just freed"
    assert elsewhere > max(10 * in_worker, 10), "without the worker's policy the block is mapped afresh"


def test_float_frames_cross_the_ring_as_spans_of_their_own_type():
    arena = FrameArena(workers=1, bytes_per_worker=4096)
    view = arena.allocate(0, (2, 3, 4), np.float32)
    view[...] = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 255
    sent_batch = arena.spans_of({"cam": torch.from_numpy(view)})
    span = sent_batch["cam"]
    assert isinstance(span, ArenaSpan) and span.dtype == "float32" and span.nbytes == 96
    taken = arena.take(span)
    assert taken.dtype == torch.float32 and torch.equal(
        taken, torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) / 255
    )
