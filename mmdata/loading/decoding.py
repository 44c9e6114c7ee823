"""Stage 4 of the loading chain, decode: each camera's frames of a micro-batch in one decoder call.

Runs in the workers (CPU backends), or split: the decoder's host-side preparation in the workers
(for DALI: joining segments into streams) and the decoding in the main process, where a GPU decoder
takes the whole micro-batch at once. The segments of the micro-batch's samples are merged first
(segments of the same source and geometry decode once), then each sample's frames are gathered
from the outputs in the order it asked for them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from mmdata.codecs.decoders import ClipRequest, VideoDecoder, make_video_decoder
from mmdata.codecs.unit_float import unit_float as unit_float_frame
from mmdata.errors import DecodeError, SampleError
from mmdata.loading.frame_cache import FrameCache
from mmdata.loading.host_memory import host_frames
from mmdata.loading.micro_batch import MicroBatch, OnError, PendingVideo
from mmdata.loading.timing import Stage, timed
from mmdata.planning.mixture import Filler, OpenSource
from mmdata.planning.specs import Frames, Spec
from mmdata.store.handle import FrameRequests, assemble_frames_at


def loader_decoder(
    choice: str | VideoDecoder, spec: Spec, sources: list[OpenSource], device: torch.device, workers: int
) -> VideoDecoder:
    """The decoder a loader of `spec` over `sources` decodes with: `choice` itself, checked against the cameras'
    codecs, or the backend it names ("auto": the fastest measured for the codecs, frame size and device)."""
    cameras = [
        source.store.schema.video(source.streams[name])
        for name, stream in spec.streams.items()
        if isinstance(stream, Frames)
        for source in sources
        if name in source.streams
    ]
    codecs = sorted({camera.codec for camera in cameras})
    if isinstance(choice, VideoDecoder):
        choice.check_codecs(codecs)
        return choice
    frames = max((len(s.offsets) for s in spec.streams.values() if isinstance(s, Frames)), default=None)
    smallest = (min(c.width for c in cameras), min(c.height for c in cameras)) if cameras else None
    return make_video_decoder(
        choice,
        codecs,
        device="cuda" if device.type == "cuda" else "cpu",
        frames_per_request=frames,
        frame_size=smallest,
        device_id=device.index or 0,
        **({"helpers": max(1, workers)} if choice == "hybrid" else {}),
    )


def prepare_video(
    decoder: VideoDecoder,
    batch: MicroBatch,
    name: str,
    plans: list[FrameRequests | None],
    sources: Sequence[int],
    frame: Filler,
    channels_first: bool = False,
    segment_data: Mapping[Hashable, bytes] | None = None,
    unit_float: bool = False,
) -> None:
    """Merge a camera's requests across the micro-batch and do the decoder's host-side preparation; the
    camera is then pending in `batch` until `finish_video`. `segment_data` gives the bytes of the merged
    segments per `segment_key` where the plans' requests do not hold them (a segment the frame cache
    serves needs none)."""
    with timed(batch.seconds, Stage.DECODE_PREPARE, batch.cpu_seconds):
        live = {p: plan for p, plan in enumerate(plans) if plan is not None and p not in batch.failed}
        requests = [request for plan in live.values() for request in plan.requests]
        scopes = [sources[p] for p, plan in live.items() for _ in plan.requests]
        converts = channels_first and decoder.writes_channels_first
        merged, located = merge_requests(requests, scopes, segment_data, converts)
        keys: list[Hashable | None] = [None] * len(merged)
        for (m, _), scope, request in zip(located, scopes, requests):
            if request.where is not None:
                keys[m] = segment_key(scope, request)
        prepared = decoder.prepare(merged) if decoder.prepares else None
        kept = [live.get(p) for p in range(len(plans))]
        batch.pending[name] = PendingVideo(
            kept,
            merged,
            located,
            prepared,
            frame.shape,
            channels_first,
            keys,
            decoded_channels_first=converts,
            unit_float=unit_float,
        )


def segment_key(source: int, request: ClipRequest) -> Hashable:
    """What identifies a request's decoded frames: its source, segment (episode, stream, number) and delivered
    geometry, as a flat tuple: hashed and compared without a call into Python (a `SegmentRef` in it cost two
    per dictionary look-up, and the frame cache looks keys up for every frame)."""
    where = request.where
    assert where is not None
    return (source, where.episode, where.stream, where.segment, request.geometry)


def finish_video(decoder: VideoDecoder, batch: MicroBatch, on_error: OnError, cache: FrameCache | None = None) -> None:
    """Decode every pending camera of the micro-batch (one decoder call each) and fill in its values;
    with a `cache`, frames kept from earlier micro-batches are taken from it and the frames the next
    steps need are decoded in the same pass and kept (see `mmdata.loading.frame_cache`)."""
    for name, pending in list(batch.pending.items()):
        with timed(batch.seconds, Stage.DECODE, batch.cpu_seconds):
            _finish_camera(decoder, batch, name, pending, on_error, cache)
        del batch.pending[name]


def _finish_camera(
    decoder: VideoDecoder,
    batch: MicroBatch,
    name: str,
    pending: PendingVideo,
    on_error: OnError,
    cache: FrameCache | None,
):
    try:
        if pending.prepared is not None:
            outputs = decoder.decode_prepared(pending.merged, pending.prepared, on_error)
        elif cache is not None and cache.enabled:
            outputs = decode_with_cache(decoder, pending.merged, pending.keys, cache, on_error)
        else:
            outputs = decoder.decode(pending.merged, on_error)
    except DecodeError as exc:
        key = exc.where.episode if exc.where is not None else None
        culprit = next((s for s in batch.samples if s.key == key), batch.samples[0])
        raise SampleError(f"shard '{culprit.shard}', {exc}") from exc
    values: list[Any] = [None] * len(pending.plans)
    masks: list[Any] = [None] * len(pending.plans)
    like = next((out for out in outputs if out is not None), None)
    buffer = _host_buffer(pending, outputs)
    if buffer is not None:
        batch.frame_buffers[name] = buffer
        buffer = buffer.numpy()
    cursor, row = 0, 0
    for p, plan in enumerate(pending.plans):
        if plan is None:
            continue
        sources = pending.sources[cursor : cursor + len(plan.requests)]
        cursor += len(plan.requests)
        into = buffer[row : row + len(plan.positions)] if buffer is not None else None
        row += len(plan.positions)
        if not plan.requests:  # the sample's source has no such camera
            blank = _blank_frames(len(plan.positions), pending.frame_shape, like, into, pending.unit_float)
            values[p], masks[p] = blank, plan.is_pad
            continue
        if any(outputs[m] is None for m, _ in sources):
            where = ", ".join(str(r.where) for r, (m, _) in zip(plan.requests, sources) if outputs[m] is None)
            batch.failed[p] = f"shard '{batch.samples[p].shard}', {where}: video does not decode"
            continue
        values[p] = gather_frames(outputs, sources, plan.positions, pending.transposes, into, pending.unit_float)
        masks[p] = plan.is_pad
    batch.values[name], batch.is_pad[name] = values, masks


def _host_buffer(pending: PendingVideo, outputs: list[Any]) -> Any:
    """One tensor (uint8, or float32 for `unit_float`) for the camera's frames of every live sample, in order, when
    they are decoded on the host at the shape the stream delivers (else None: each sample's frames are gathered on
    their own)."""
    host = [out for out in outputs if out is not None]
    if not host or not all(isinstance(out, (np.ndarray, list)) for out in host):
        return None
    shape = tuple(pending.frame_shape)
    for out in host:
        frame = out[0] if len(out) else None
        if frame is None or frame.dtype != np.uint8:
            return None
        delivered = (frame.shape[2], *frame.shape[:2]) if pending.transposes else frame.shape
        if tuple(delivered) != shape:
            return None
    count = sum(len(plan.positions) for plan in pending.plans if plan is not None)
    return host_frames(count, shape, np.float32 if pending.unit_float else np.uint8)


def decode_with_cache(
    decoder: VideoDecoder,
    requests: list[ClipRequest],
    keys: list[Hashable | None],
    cache: FrameCache,
    on_error: OnError,
) -> list[Any]:
    """Each request's frames (an array, or a list of frames where they come from the cache or from a
    larger decode): from the cache when every one of them is kept, else decoded, together with the frames
    of the same segment the next steps need (kept for them)."""
    outputs: list[Any] = [None] * len(requests)
    decode, owners = [], []
    for m, (request, key) in enumerate(zip(requests, keys)):
        kept = cache.cached(key) if key is not None else {}
        if key is not None and all(frame in kept for frame in request.frames):
            outputs[m] = _joined([kept[frame] for frame in request.frames])
            cache.stats.served += len(request.frames)
            continue
        ahead = cache.wanted_ahead(key, _frame_bytes(request)) - set(request.frames) if key is not None else set()
        decode.append(dataclasses.replace(request, frames=tuple(sorted({*request.frames, *ahead}))))
        owners.append((m, len(ahead)))
    for (m, frames_ahead), request, frames in zip(owners, decode, decoder.decode(decode, on_error)):
        if frames is None:
            continue
        row_of = {frame: row for row, frame in enumerate(request.frames)}
        if keys[m] is not None:
            cache.keep_decoded(keys[m], request.frames, frames)
        cache.stats.ahead += frames_ahead
        outputs[m] = frames if frames_ahead == 0 else _joined([frames[row_of[frame]] for frame in requests[m].frames])
    return outputs


def _frame_bytes(request: ClipRequest) -> int:
    """The bytes of one frame the request delivers (RGB at its geometry or the camera's size; 0: unknown)."""
    if request.geometry is not None:
        height, width = request.geometry.size
    else:
        width, height = request.display_size or request.frame_size or (0, 0)
    return width * height * 3


def _joined(frames: list[Any]) -> Any:
    """A request's frames taken one by one, as gathering takes them: host frames as a list (each is copied
    into place later), device frames as one tensor."""
    if not frames or isinstance(frames[0], np.ndarray):
        return frames
    joined = frames[0].new_empty((len(frames), *frames[0].shape))
    for row, frame in enumerate(frames):
        joined[row] = frame
    return joined


def _blank_frames(
    count: int, shape: tuple[int, ...], like: Any, into: np.ndarray | None = None, unit_float: bool = False
) -> Any:
    """Black frames standing in for a camera a source lacks, where the decoded frames live."""
    if into is not None:
        into[...] = 0
        return into
    if like is None or isinstance(like, (np.ndarray, list)):
        return np.zeros((count, *shape), np.float32 if unit_float else np.uint8)
    return like.new_zeros((count, *shape))


def gather_frames(
    outputs: list[Any],
    sources: list[tuple[int, np.ndarray]],
    positions: np.ndarray,
    transpose: bool = False,
    into: np.ndarray | None = None,
    unit_float: bool = False,
) -> Any:
    """One sample's frames, in the order it asked for them, from the micro-batch's merged decoder
    outputs: its requests' frames are `outputs[m][picks]` for each (m, picks) of `sources`,
    concatenated, then taken at `positions`. Host frames (arrays or lists of frames) are copied once,
    straight into place (`into` when given; with `transpose`, from `[H, W, 3]` to `[3, H, W]` on the way; with
    `unit_float`, divided by 255 into float32 on the way)."""
    first = outputs[sources[0][0]]
    if not isinstance(first, (np.ndarray, list)):
        frames = assemble_frames_at(positions, [outputs[m][picks] for m, picks in sources])
        frames = frames.permute(0, 3, 1, 2).contiguous() if transpose else frames
        return frames.to(torch.float32).div_(255) if unit_float else frames
    picked = [outputs[m][pick] for m, picks in sources for pick in picks.tolist()]
    shape = picked[0].shape
    shape = (shape[2], shape[0], shape[1]) if transpose else shape
    frames = into if into is not None else np.empty((len(positions), *shape), np.float32 if unit_float else np.uint8)
    for row, position in enumerate(positions.tolist()):
        if unit_float:
            unit_float_frame(picked[position], frames[row], transpose)
        else:
            frames[row] = picked[position].transpose(2, 0, 1) if transpose else picked[position]
    return frames


def merge_requests(
    requests: Sequence[ClipRequest],
    scopes: Sequence[int] | None = None,
    segment_data: Mapping[Hashable, bytes] | None = None,
    channels_first: bool = False,
) -> tuple[list[ClipRequest], list[tuple[int, np.ndarray]]]:
    """One request per segment (of one source, `scopes`, and one delivered geometry), for the union of
    the frames the samples ask of it, with its bytes from `segment_data` where the request has none, asking
    for `channels_first` frames.

    Windows of a shuffled micro-batch often share a segment (a 32-frame segment holds 3.2 s of
    10 Hz anchors); decoding it once serves them all. Returns the merged requests and, per
    original request, (merged index, positions of its frames in that request's output).
    """
    scopes = scopes if scopes is not None else [0] * len(requests)

    def key_of(request: ClipRequest, scope: int) -> Any:
        return segment_key(scope, request) if request.where is not None else id(request)

    keys = [key_of(request, scope) for request, scope in zip(requests, scopes)]
    groups: dict[Any, list[ClipRequest]] = {}
    for request, key in zip(requests, keys):
        groups.setdefault(key, []).append(request)
    data = segment_data or {}
    merged, rows_of = [], []
    for key, group in groups.items():
        union = sorted({frame for request in group for frame in request.frames})
        first = group[0]
        segment = first.data or data.get(key, b"")
        if tuple(union) == first.frames and segment is first.data and channels_first == first.channels_first:
            merged.append(first)  # one sample's request, as it is (a frame cache serving it needs no bytes)
        else:
            merged.append(dataclasses.replace(first, frames=tuple(union), data=segment, channels_first=channels_first))
        rows_of.append({frame: row for row, frame in enumerate(union)})
    index_of = {key: m for m, key in enumerate(groups)}
    located = []
    for request, key in zip(requests, keys):
        m = index_of[key]
        located.append((m, np.array([rows_of[m][frame] for frame in request.frames], np.int64)))
    return merged, located
