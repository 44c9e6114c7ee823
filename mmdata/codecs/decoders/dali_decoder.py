"""NVIDIA DALI decoding: NVDEC on the GPU (`mixed`) or DALI's CPU decoder, a whole batch per call.

On the GPU the fixed cost is the decoder session, not the frames: with `reuse_sessions` (the
default there) the requests' segments that share stream parameters are joined into a few long
streams (see `concat`), each decoded by one session with `frames=` picking what the requests
asked for. On the CPU a session is cheap and each request gets its own by default.
Several pipelines run in parallel threads to keep several NVDEC engines busy. GPU frames reach
torch through DLPack, without a trip through host memory.
"""

from __future__ import annotations

import os
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import av
import numpy as np

from mmdata.codecs.decoders.availability import DALI_CPU_CODECS, DALI_GPU_CODECS
from mmdata.codecs.decoders.base import OnError, VideoDecoder
from mmdata.codecs.decoders.concat import JoinedStream, group_by_parameters, join_segments, lone_segment
from mmdata.codecs.decoders.packets import probe_segment
from mmdata.codecs.decoders.requests import ClipRequest
from mmdata.errors import DecodeError, MmdataError

# Every pipeline this process built, by id, held until its decoder lets go of it in this same process.
# A forked child (a DataLoader worker) inherits these objects; were one destroyed there, even as garbage
# its collector found, its destructor would wait on threads that exist only in the parent and crash it.
_HELD_PIPELINES: dict[int, Any] = {}


def _hold(pipeline: Any) -> Any:
    _HELD_PIPELINES[id(pipeline)] = pipeline
    return pipeline


def _let_go(keys: list[int], owner_pid: int) -> None:
    """Destroy the pipelines under `keys`, only in the process that built them."""
    if os.getpid() == owner_pid:
        for key in keys:
            _HELD_PIPELINES.pop(key, None)


class DaliDecoder(VideoDecoder):
    """`fn.decoders.video` over external-source bytes; `device` is "gpu" (NVDEC) or "cpu"."""

    prepares = True  # joining segments runs where the micro-batch is read

    def __init__(
        self,
        device: str = "gpu",
        pipelines: int | None = None,
        batch_size: int | None = None,
        reuse_sessions: bool | None = None,
        device_id: int = 0,
        num_threads: int = 2,
        streams_per_call: int | None = None,
    ):
        super().__init__()
        if device not in ("gpu", "cpu"):
            raise ValueError(f"DALI device must be 'gpu' or 'cpu', not '{device}'")
        self.device = device
        self.name = "dali" if device == "gpu" else "dali-cpu"
        self.codecs = DALI_GPU_CODECS if device == "gpu" else DALI_CPU_CODECS
        # Measured on an H200 (benchmarks/results/decode_gpu_h200.md): joined streams decode fastest
        # spread over 32 single-stream pipelines (NVDEC engines stay busy while each pipeline's host
        # side waits); on the CPU, a few pipelines of several streams.
        self.pipelines = pipelines or (32 if device == "gpu" else 4)
        self.batch_size = batch_size or (1 if device == "gpu" else 8)
        # On the CPU a session costs little and joining costs host time: one session per request is
        # 14-29% faster for clips at gop 4-32 (benchmarks/results/README.md, "DALI on the CPU").
        self.reuse_sessions = device == "gpu" if reuse_sessions is None else reuse_sessions
        self.device_id = device_id
        self.num_threads = num_threads
        self.streams_per_call = streams_per_call or self.pipelines * self.batch_size
        self._built: list[Any] = []
        self._held: list[int] = []  # ids of `_built` in `_HELD_PIPELINES`
        self._owner_pid: int | None = None
        self._pool: ThreadPoolExecutor | None = None

    def describe(self) -> str:
        import nvidia.dali

        reuse = "joined streams" if self.reuse_sessions else "one session per request"
        return (
            f"dali {nvidia.dali.__version__} ({self.device}, {self.pipelines} pipeline(s) x batch {self.batch_size},"
            f" {reuse})"
        )

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.update(_built=[], _held=[], _owner_pid=None, _pool=None)
        return state

    def prepare(self, requests: list[ClipRequest]) -> tuple[list[JoinedStream], dict[int, Exception]]:
        """Host-side work for a batch (joining segments): can run in a loader worker ahead of decode."""
        work: list[JoinedStream] = []
        if not self.reuse_sessions:
            refused: dict[int, Exception] = {}
            for position, request in enumerate(requests):
                if request.frames:
                    try:
                        probe_segment(request)
                        work.append(lone_segment(requests, position))
                    except DecodeError as exc:
                        refused[position] = exc
            return work, refused
        groups, failed = group_by_parameters(requests)
        chunks = max(1, min(self.streams_per_call, len(requests)))
        for group in groups:
            parts = max(1, round(chunks * len(group) / len(requests)))
            for part in np.array_split(np.asarray(group), parts):
                positions = [int(p) for p in part if requests[int(p)].frames]
                if not positions:
                    continue
                try:
                    work.append(join_segments(requests, positions))
                except (DecodeError, av.error.FFmpegError, IndexError) as exc:
                    for position in positions:  # retried one by one, to find the bad segment
                        failed.setdefault(position, exc)
        return work, failed

    def _decode_batch(self, requests: list[ClipRequest], on_error: OnError) -> list[Any]:
        work, failed = self.prepare(requests)
        return self._decode_prepared(requests, work, failed, on_error)

    def decode_prepared(
        self,
        requests: list[ClipRequest],
        prepared: tuple[list[JoinedStream], dict[int, Exception]],
        on_error: OnError = "raise",
    ) -> list[Any]:
        """Frames per request from prepared work; requests that failed to join are retried alone."""
        work, failed = prepared
        started = time.perf_counter()
        try:
            return self.fitted(requests, self._decode_prepared(requests, work, failed, on_error))
        finally:
            self.stats.seconds += time.perf_counter() - started

    def _decode_prepared(
        self, requests: list[ClipRequest], work: list[JoinedStream], failed: dict[int, Exception], on_error: OnError
    ) -> list[Any]:
        results: list[Any] = [None] * len(requests)
        for position, request in enumerate(requests):
            if not request.frames:
                results[position] = self._empty()
        retry = sorted(failed)
        for item, outcome in zip(work, self._run_all(work)):
            if isinstance(outcome, Exception):
                retry.extend(item.requests)
                continue
            self._scatter(requests, item, outcome, results, on_error)
        for position in retry:
            request = requests[position]
            try:
                probe_segment(request)
            except DecodeError as exc:
                self._failed(request, exc, on_error)
                results[position] = None
                continue
            single = lone_segment(requests, position)
            (outcome,) = self._run_all([single])
            if isinstance(outcome, Exception):
                self._failed(request, outcome, on_error)
                results[position] = None
            else:
                self._scatter(requests, single, outcome, results, on_error)
        return results

    def _scatter(
        self, requests: list[ClipRequest], item: JoinedStream, frames: Any, results: list[Any], on_error: OnError
    ) -> None:
        start = 0
        for position, count in zip(item.requests, item.frames_per_request):
            request = requests[position]
            part = frames[start : start + count]
            start += count
            if request.frame_size is not None and count and tuple(part.shape[1:3]) != request.frame_size[::-1]:
                shape = f"{part.shape[2]}x{part.shape[1]}"
                self._failed(request, DecodeError(f"decodes to {shape} frames"), on_error)
                results[position] = None
                continue
            results[position] = part
            self._count(request, 0)
        self.stats.frames_decoded += item.frames_decoded

    def _run_all(self, work: list[JoinedStream]) -> list[Any]:
        """Decode every work item, spread over the pipelines; an item that fails gives its exception."""
        if not work:
            return []
        pipelines = self._pipelines()
        slices = [list(range(i, len(work), len(pipelines))) for i in range(len(pipelines))]
        outcomes: list[Any] = [None] * len(work)

        def run_slice(index: int) -> None:
            for start in range(0, len(slices[index]), self.batch_size):
                positions = slices[index][start : start + self.batch_size]
                try:
                    frames = self._run_pipeline(index, [work[p] for p in positions])
                except Exception as exc:  # DALI raises RuntimeError/IndexError and invalidates the pipeline
                    self._rebuild(index)
                    for position in positions:
                        outcomes[position] = DecodeError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                    continue
                for position, value in zip(positions, frames):
                    outcomes[position] = value

        used = [i for i in range(len(pipelines)) if slices[i]]
        if len(used) == 1:
            run_slice(used[0])
        else:
            list(self._thread_pool().map(run_slice, used))
        return outcomes

    def _run_pipeline(self, index: int, items: list[JoinedStream]) -> list[Any]:
        pipeline = self._built[index]
        pipeline.feed_input("encoded", [np.frombuffer(item.data, dtype=np.uint8) for item in items])
        pipeline.feed_input("frames", [item.frames for item in items])
        (output,) = pipeline.run()
        if self.device == "gpu":
            import torch

            return [torch.from_dlpack(output[i]).clone() for i in range(len(items))]
        return [np.array(output[i]) for i in range(len(items))]

    def _empty(self) -> Any:
        if self.device == "gpu":
            import torch

            return torch.empty((0, 0, 0, 3), dtype=torch.uint8, device=f"cuda:{self.device_id}")
        return np.empty((0, 0, 0, 3), dtype=np.uint8)

    def _pipelines(self) -> list[Any]:
        if self._built and self._owner_pid != os.getpid():
            raise MmdataError(
                f"decoder '{self.name}' already ran DALI in process {self._owner_pid}, and this process was"
                " forked from it; DALI cannot start again in a forked child once initialised (it would hang)."
                " Decode only in the workers (do not decode in the parent before they start), or start workers"
                " with multiprocessing_context='spawn' or 'forkserver'"
            )
        if not self._built:
            self._built = [_hold(self._build()) for _ in range(self.pipelines)]
            self._held = [id(pipeline) for pipeline in self._built]
            self._owner_pid = os.getpid()
            weakref.finalize(self, _let_go, self._held, self._owner_pid)
        return self._built

    def _rebuild(self, index: int) -> None:
        old = self._built[index]
        self._built[index] = _hold(self._build())
        self._held[index] = id(self._built[index])
        _let_go([id(old)], os.getpid())

    def _thread_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.pipelines, thread_name_prefix="mmdata-dali")
        return self._pool

    def _build(self) -> Any:
        from nvidia.dali import fn, pipeline_def, types

        gpu = self.device == "gpu"

        @pipeline_def(  # type: ignore[call-overload, unused-ignore]  # (older DALI stubs lack exec_dynamic)
            batch_size=self.batch_size,
            num_threads=self.num_threads,
            device_id=self.device_id if gpu else None,
            exec_dynamic=True,
            prefetch_queue_depth=1,
        )
        def clip_pipeline():
            encoded = fn.external_source(name="encoded", dtype=types.UINT8, ndim=1)
            frames = fn.external_source(name="frames", dtype=types.INT32, ndim=1)
            return fn.decoders.video(encoded, device="mixed" if gpu else "cpu", frames=frames)

        pipeline = clip_pipeline()
        pipeline.build()
        return pipeline
