"""Two decoders sharing each batch in proportion to how fast each has been: NVDEC and the host's cores together.

A batch's requests are cut in two, in plan order: the first backend takes a prefix worth its share
of the batch's frames, the second the rest. Each side's frames per second, measured on every batch
it decodes, update the shares, so the split follows what each really delivers on this machine, for
this data. Outputs come back in the requests' order; frames the second backend decodes on the host
go to the first one's device.

Two ways to run it. `decode()` decodes both parts at once in the calling process (the second in a
thread). In a `DataLoader` that decodes in the main process, `prepare()` runs in each worker: it
decodes the tail there, on the worker's core, and `decode_prepared()` decodes the head in the main
process (on the GPU). The share then travels back to the workers through one shared value, and
`helpers` (the loader's workers, each decoding tails at once) enters the balance.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from mmdata.codecs.decoders.base import OnError, VideoDecoder
from mmdata.codecs.decoders.requests import ClipRequest, DecodeStats
from mmdata.errors import DecodeError


class RateSplit:
    """Shares of work between two backends: `first_share` of the frames to the first until both have
    been measured, then in proportion to their rates (frames per second, an exponential moving
    average with weight `smoothing` on the newest batch), so that both finish together."""

    def __init__(self, first_share: float = 0.5, smoothing: float = 0.3, helpers: int = 1):
        if not 0 < first_share < 1:
            raise ValueError(f"first_share is a fraction strictly between 0 and 1, not {first_share}")
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing is in (0, 1], not {smoothing}")
        if helpers < 1:
            raise ValueError(f"helpers is at least 1, not {helpers}")
        self.initial = first_share
        self.smoothing = smoothing
        self.helpers = helpers
        self.rates: list[float | None] = [None, None]

    @property
    def first_share(self) -> float:
        """The first side's share of the frames: both finish together when the second side's rate counts
        once per helper decoding at the same time (the loader's workers)."""
        first, second = self.rates
        if first is None or second is None:
            return self.initial
        return first / (first + self.helpers * second)

    def observe(self, side: int, frames: int, seconds: float) -> None:
        """Fold one batch's rate into `side`'s estimate (nothing is learnt from an empty or instant batch)."""
        if frames <= 0 or seconds <= 0:
            return
        rate, known = frames / seconds, self.rates[side]
        self.rates[side] = rate if known is None else known + self.smoothing * (rate - known)

    def cut(self, costs: Sequence[int], share: float | None = None) -> int:
        """How many leading requests the first backend takes: the prefix whose cost is nearest its share
        (`share`, or the current `first_share`)."""
        total = float(sum(costs))
        if not len(costs) or total <= 0:
            return len(costs)
        reachable = np.concatenate([[0.0], np.cumsum(costs)])
        return int(np.argmin(np.abs(reachable - (self.first_share if share is None else share) * total)))


class HybridDecoder(VideoDecoder):
    """Decodes each batch with `first` and `second` at once, split by `RateSplit` (see the module)."""

    fits_geometry = True  # each side fits its own outputs
    prepares = True  # the worker decodes the tail and prepares the head (see the module)

    def __init__(self, first: VideoDecoder, second: VideoDecoder, split: RateSplit | None = None):
        super().__init__()
        self.first, self.second = first, second
        self.split = split or RateSplit()
        self.name = f"hybrid({first.name}+{second.name})"
        self.device = first.device
        self.codecs = frozenset(first.codecs & second.codecs)
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()
        self._worker_counts = [0, 0, 0]  # requests, frames, skipped decoded by loader workers (prepare)
        # the share the workers cut at, written where the rates are learnt (shared memory crosses to workers)
        import torch

        self._published = torch.full((1,), self.split.first_share, dtype=torch.float64).share_memory_()

    def describe(self) -> str:
        return (
            f"hybrid: {self.first.describe()} + {self.second.describe()},"
            f" {self.split.first_share:.0%} of the frames to the first"
        )

    def _decode_batch(self, requests: list[ClipRequest], on_error: OnError) -> list[Any]:
        cut = self.split.cut([len(r.frames) for r in requests])
        head, tail = requests[:cut], requests[cut:]
        helper = self._helper().submit(_timed, self.second, tail, on_error) if tail else None
        head_outputs, head_seconds = _timed(self.first, head, on_error) if head else ([], 0.0)
        tail_outputs, tail_seconds = helper.result() if helper is not None else ([], 0.0)
        self._absorb()
        return self._learnt_and_joined(head, tail, head_outputs, tail_outputs, head_seconds, tail_seconds)

    def prepare(self, requests: list[ClipRequest]) -> tuple:
        """In a loader's worker: decode the tail of the batch here, at the share last published, and prepare
        the head for the first backend (see the module's docstring)."""
        cut = self.split.cut([len(r.frames) for r in requests], float(self._published[0]))
        head, tail = requests[:cut], requests[cut:]
        # the head's reads overlap the tail's decoding
        preparing = self._helper().submit(self.first.prepare, head) if head and self.first.prepares else None
        failure: DecodeError | None = None
        try:
            tail_outputs, tail_seconds = _timed(self.second, tail, "raise") if tail else ([], 0.0)
        except DecodeError as exc:  # kept for the main process, which raises or skips as its on_error says
            failure = exc
            tail_outputs, tail_seconds = _timed(self.second, tail, "skip")
        head_prepared = preparing.result() if preparing is not None else None
        return cut, tail_outputs, tail_seconds, failure, head_prepared

    def decode_prepared(self, requests: list[ClipRequest], prepared: tuple, on_error: OnError = "raise") -> list[Any]:
        """In the main process: decode the head, learn both sides' rates, publish the new share, and return
        every request's frames in order."""
        cut, tail_outputs, tail_seconds, failure, head_prepared = prepared
        if failure is not None and on_error == "raise":
            raise failure
        head, tail = list(requests[:cut]), list(requests[cut:])
        started = time.perf_counter()
        if not head:
            head_outputs: list[Any] = []
        elif head_prepared is not None:
            head_outputs = self.first.decode_prepared(head, head_prepared, on_error)
        else:
            head_outputs = self.first.decode(head, on_error)
        head_seconds = time.perf_counter() - started
        self._absorb(tail, tail_outputs)
        self.stats.seconds += head_seconds
        return self._learnt_and_joined(head, tail, head_outputs, tail_outputs, head_seconds, tail_seconds)

    def _learnt_and_joined(self, head, tail, head_outputs, tail_outputs, head_seconds, tail_seconds) -> list[Any]:
        """Both sides' rates learnt from this batch, the new share published, and the outputs in request
        order (the second side's host frames on the first's device)."""
        self.split.observe(0, sum(len(r.frames) for r in head), head_seconds)
        self.split.observe(1, sum(len(r.frames) for r in tail), tail_seconds)
        self._published[0] = self.split.first_share
        device_id = getattr(self.first, "device_id", 0)
        return [*head_outputs, *(_to_device(frames, head_outputs, self.device, device_id) for frames in tail_outputs)]

    def _helper(self) -> ThreadPoolExecutor:
        """The thread the second backend decodes in; made per process (a forked worker makes its own)."""
        if self._pool is None or self._pid != os.getpid():
            self._pool, self._pid = ThreadPoolExecutor(1, thread_name_prefix="mmdata-hybrid"), os.getpid()
        return self._pool

    def _absorb(self, elsewhere: Sequence[ClipRequest] = (), outputs: Sequence[Any] = ()) -> None:
        """This decoder's totals: both sides' here, plus the requests a worker decoded `elsewhere` (counted by
        what they delivered); its own `seconds` count the wall time of whole batches."""
        total = DecodeStats(seconds=self.stats.seconds)
        self._worker_counts[0] += len(elsewhere)
        self._worker_counts[1] += sum(len(r.frames) for r, o in zip(elsewhere, outputs) if o is not None)
        self._worker_counts[2] += sum(o is None for o in outputs)
        for side in (self.first.stats, self.second.stats):
            total.requests += side.requests
            total.frames_delivered += side.frames_delivered
            total.frames_decoded += side.frames_decoded
            total.skipped += side.skipped
            total.skipped_where += side.skipped_where[: max(0, 100 - len(total.skipped_where))]
        total.requests += self._worker_counts[0]
        total.frames_delivered += self._worker_counts[1]
        total.frames_decoded += self._worker_counts[1]
        total.skipped += self._worker_counts[2]
        self.stats = total

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_pool"] = None
        return state


def _timed(decoder: VideoDecoder, requests: list[ClipRequest], on_error: OnError) -> tuple[list[Any], float]:
    started = time.perf_counter()
    outputs = decoder.decode(requests, on_error)
    return outputs, time.perf_counter() - started


def _to_device(frames: Any, like: list[Any], device: str, device_id: int) -> Any:
    """Host frames of the second backend on the device the first one's frames live on."""
    if frames is None or device == "cpu" or not isinstance(frames, np.ndarray):
        return frames
    import torch

    target = next((f.device for f in like if isinstance(f, torch.Tensor)), None)
    return torch.from_numpy(frames).to(target or torch.device("cuda", device_id), non_blocking=True)
