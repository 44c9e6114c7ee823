"""Batch layouts for one micro-batch: packed (sequences end to end) or padded (one row each).

The packed layout gives what the common attention kernels take: `cu_seqlens` (int32, n + 1,
for flash-attn varlen and Megatron THD), `max_seqlen`, `position_ids` restarting at every
sample, `document_ids` (for FlexAttention block masks) and, on request, a dense block-diagonal
boolean mask for SDPA. Padding to a multiple (static shapes, CUDA graphs) becomes a segment of
its own that no real token attends to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

MaskKind = Literal["causal", "bidirectional"]


@dataclass
class PackedLayout:
    """Where each sample sits in a packed sequence of `total` tokens (`padding` of them filler)."""

    seq_lens: np.ndarray
    cu_seqlens: np.ndarray
    max_seqlen: int
    position_ids: np.ndarray
    document_ids: np.ndarray
    total: int
    padding: int

    @property
    def samples(self) -> int:
        """Real samples (the padding segment, when present, is the last entry of `seq_lens`)."""
        return len(self.seq_lens) - (1 if self.padding else 0)

    def attention_mask(self, kind: MaskKind = "causal") -> np.ndarray:
        """Dense `[T, T]` boolean mask (True = may attend): block-diagonal over documents.

        Padding tokens attend only to themselves, so no real token sees them and their own rows
        stay finite in a softmax.
        """
        same = self.document_ids[:, None] == self.document_ids[None, :]
        if kind == "causal":
            same &= np.tri(self.total, dtype=bool)
        elif kind != "bidirectional":
            raise ValueError(f"mask kind is 'causal' or 'bidirectional', not '{kind}'")
        if self.padding:
            pad = np.arange(self.total) >= self.total - self.padding
            same[pad] = False
            same[pad, pad] = True
        return same


def packed_layout(lengths: Sequence[int], pad_to_multiple: int | None = None) -> PackedLayout:
    """The packed layout of samples of `lengths` tokens, optionally padded to a multiple."""
    seq_lens = np.asarray(lengths, dtype=np.int64)
    if len(seq_lens) == 0:
        raise ValueError("a micro-batch needs at least one sample")
    if seq_lens.min() < 1:
        raise ValueError(f"sample lengths must be positive, got {int(seq_lens.min())}")
    real = int(seq_lens.sum())
    padding = 0
    if pad_to_multiple:
        if pad_to_multiple < 1:
            raise ValueError(f"pad_to_multiple must be positive, not {pad_to_multiple}")
        padding = -real % pad_to_multiple
    if padding:
        seq_lens = np.append(seq_lens, padding)
    cu_seqlens = np.concatenate([[0], np.cumsum(seq_lens)]).astype(np.int32)
    document_ids = np.repeat(np.arange(len(seq_lens), dtype=np.int32), seq_lens)
    position_ids = (np.arange(cu_seqlens[-1]) - np.repeat(cu_seqlens[:-1], seq_lens)).astype(np.int64)
    return PackedLayout(
        seq_lens=seq_lens.astype(np.int32),
        cu_seqlens=cu_seqlens,
        max_seqlen=int(seq_lens.max()),
        position_ids=position_ids,
        document_ids=document_ids,
        total=int(cu_seqlens[-1]),
        padding=padding,
    )


@dataclass
class PaddedLayout:
    """`[B, T_max]` rows, one per sample, with a key-padding mask (True = real token)."""

    seq_lens: np.ndarray
    max_len: int
    key_padding_mask: np.ndarray
    position_ids: np.ndarray


def padded_layout(lengths: Sequence[int], pad_to_multiple: int | None = None) -> PaddedLayout:
    """The padded layout of samples of `lengths` tokens; `T_max` optionally rounded up."""
    seq_lens = np.asarray(lengths, dtype=np.int64)
    if len(seq_lens) == 0 or seq_lens.min() < 1:
        raise ValueError("a padded batch needs at least one sample, each of positive length")
    width = int(seq_lens.max())
    if pad_to_multiple:
        width += -width % pad_to_multiple
    positions = np.broadcast_to(np.arange(width), (len(seq_lens), width))
    mask = positions < seq_lens[:, None]
    return PaddedLayout(seq_lens.astype(np.int32), width, mask, np.where(mask, positions, 0))


def pack_values(values: Sequence[np.ndarray], layout: PackedLayout) -> np.ndarray:
    """Samples' values `[L_i, ...]` concatenated along time, zero-filled over the padding."""
    if sum(len(v) for v in values) + layout.padding != layout.total:
        raise ValueError("values do not match the layout's sample lengths")
    parts = list(values)
    if layout.padding:
        parts.append(np.zeros((layout.padding, *values[0].shape[1:]), dtype=values[0].dtype))
    return np.concatenate(parts)
