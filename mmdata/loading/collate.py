"""Stage 6 of the loading chain, collate (runs where the micro-batch was decoded): a read micro-batch
into the tensors a training step takes.

Per stream, "packed" concatenates the samples along time (`<stream>` `[sum T_i, ...]`, with
`<stream>_cu_seqlens`), and "padded" stacks them into `[B, T_max, ...]` (with
`<stream>_lengths`); both carry `<stream>_is_pad`, True where a value lies outside the episode
or is padding. The token layout of the micro-batch (from the samples' token costs) comes with it:
`cu_seqlens`, `max_seqlen`, `position_ids`, `document_ids` and optionally a dense
`attention_mask` when packed; `key_padding_mask` and `position_ids` when padded. Each batch also
names its samples: `sample_index`, `episode_index` (the manifest row in its source), `chunk_index`,
`time`, `task` and `source` (the source's number in a mixture; 0 for a single store). A
`Values(pad_to=...)` stream adds `<stream>_dim_is_pad` `[B, width]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch

from mmdata.errors import OptionError
from mmdata.loading.host_memory import shared_output
from mmdata.loading.micro_batch import MicroBatch
from mmdata.planning.packing.layouts import MaskKind, packed_layout, padded_layout

Layout = Literal["packed", "padded"]
LAYOUTS = ("packed", "padded")


def collate(
    batch: MicroBatch,
    layout: Layout = "packed",
    attention_mask: MaskKind | None = None,
    pad_to_multiple: int | None = None,
) -> dict[str, Any]:
    """The tensors of one micro-batch in `layout`; see the module docstring for the keys."""
    if layout not in LAYOUTS:
        raise OptionError(f"layout is 'packed' or 'padded', not '{layout}'")
    out: dict[str, Any] = {}
    for name, values in batch.values.items():
        whole = _filled_buffer(batch.frame_buffers.get(name), values)
        masks = batch.is_pad[name]
        lengths = [len(v) for v in values]
        if layout == "packed":
            out[name] = whole if whole is not None else _joined(values, stack=False)
            out[f"{name}_is_pad"] = _joined_masks(masks, stack=False)
            out[f"{name}_cu_seqlens"] = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
        else:
            if len(set(lengths)) == 1:
                if whole is not None:
                    out[name] = whole.view(len(values), lengths[0], *whole.shape[1:])
                else:
                    out[name] = _joined(values, stack=True)
                out[f"{name}_is_pad"] = _joined_masks(masks, stack=True)
            else:
                out[name], out[f"{name}_is_pad"] = _stack_padded(
                    [_tensor(v) for v in values], [_tensor(m).to(torch.bool) for m in masks]
                )
            out[f"{name}_lengths"] = torch.tensor(lengths, dtype=torch.int64)
    for name, dim_masks in batch.dim_is_pad.items():
        out[f"{name}_dim_is_pad"] = torch.from_numpy(np.stack(dim_masks))
    costs = [sample.cost for sample in batch.samples]
    if layout == "packed":
        tokens = packed_layout(costs, pad_to_multiple)
        out.update(
            seq_lens=torch.from_numpy(tokens.seq_lens),
            cu_seqlens=torch.from_numpy(tokens.cu_seqlens),
            max_seqlen=tokens.max_seqlen,
            position_ids=torch.from_numpy(tokens.position_ids),
            document_ids=torch.from_numpy(tokens.document_ids),
        )
        if attention_mask is not None:
            out["attention_mask"] = torch.from_numpy(tokens.attention_mask(attention_mask))
    else:
        padded = padded_layout(costs, pad_to_multiple)
        out.update(
            seq_lens=torch.from_numpy(padded.seq_lens),
            key_padding_mask=torch.from_numpy(np.ascontiguousarray(padded.key_padding_mask)),
            position_ids=torch.from_numpy(np.ascontiguousarray(padded.position_ids)),
        )
    out.update(
        sample_index=torch.tensor([s.index for s in batch.samples], dtype=torch.int64),
        episode_index=torch.tensor([s.episode for s in batch.samples], dtype=torch.int64),
        chunk_index=torch.tensor([s.chunk for s in batch.samples], dtype=torch.int64),
        time=torch.tensor([s.start for s in batch.samples], dtype=torch.float64),
        source=torch.tensor([s.source for s in batch.samples], dtype=torch.int64),
        task=list(batch.tasks),
    )
    return out


def _filled_buffer(buffer: torch.Tensor | None, values: Sequence[Any]) -> torch.Tensor | None:
    """`buffer` when the samples' values are, in order, the views of it that fill it exactly (the decode
    stage wrote them there; no sample was replaced since): the collated stream, without a copy."""
    if buffer is None or not all(isinstance(v, np.ndarray) for v in values):
        return None
    address, row_bytes = buffer.data_ptr(), buffer[0].nbytes if len(buffer) else 0
    for v in values:
        if v.ctypes.data != address or not v.flags.c_contiguous or v.shape[1:] != tuple(buffer.shape[1:]):
            return None
        address += len(v) * row_bytes
    return buffer if address == buffer.data_ptr() + len(buffer) * row_bytes else None


def _joined(values: Sequence[Any], stack: bool) -> torch.Tensor:
    """The samples' values stacked (`[B, T, ...]`, equal lengths) or concatenated (`[sum T, ...]`), in a worker's
    shared memory when large. Host arrays are joined by numpy in one call: a tensor made of each first cost
    more than copying them."""
    if not all(isinstance(v, np.ndarray) for v in values):
        tensors = [_tensor(v) for v in values]
        if stack:
            return torch.stack(tensors, out=shared_output(tensors[0], (len(tensors), len(tensors[0]))))
        return torch.cat(tensors, out=shared_output(tensors[0], (sum(len(t) for t in tensors),)))
    first = values[0]
    leading = (len(values), len(first)) if stack else (sum(len(v) for v in values),)
    shared = shared_output(torch.from_numpy(np.ascontiguousarray(first[:0])), leading)
    join = np.stack if stack else np.concatenate
    if shared is None:
        return torch.from_numpy(join(values))
    join(values, out=shared.numpy())
    return shared


def _joined_masks(masks: Sequence[Any], stack: bool) -> torch.Tensor:
    """The samples' `is_pad` masks joined like their values, as bool."""
    if not all(isinstance(m, np.ndarray) for m in masks):
        tensors = [_tensor(m).to(torch.bool) for m in masks]
        return torch.stack(tensors) if stack else torch.cat(tensors)
    joined = (np.stack if stack else np.concatenate)(masks)
    return torch.from_numpy(joined.astype(bool, copy=False))


def _tensor(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    return torch.from_numpy(np.ascontiguousarray(value))


def _stack_padded(tensors: Sequence[torch.Tensor], masks: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples of unequal lengths in `[B, T_max, ...]`, zero-filled, their masks padded with True (equal lengths
    are `_joined`)."""
    longest = max(len(t) for t in tensors)
    first = tensors[0]
    stacked = first.new_zeros((len(tensors), longest, *first.shape[1:]))
    is_pad = torch.ones((len(tensors), longest), dtype=torch.bool, device=masks[0].device)
    for row, (values, mask) in enumerate(zip(tensors, masks)):
        stacked[row, : len(values)] = values
        is_pad[row, : len(mask)] = mask
    return stacked, is_pad
