"""Packed layouts are right by attention itself: packed attention equals each sample attended alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from mmdata.planning.packed_windows import fit_into_bins
from mmdata.planning.packing import pack_values, packed_layout, padded_layout

HEADS, DIM = 2, 16


def random_pack(seed: int) -> list[int]:
    """The lengths of one micro-batch of a window of random sample lengths packed as the planner packs it."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 40, size=60)
    assignment = fit_into_bins(lengths, 96, 24)
    return lengths[assignment == int(rng.integers(24))].tolist()


def per_sample_reference(q, k, v, lengths, causal):
    outputs, start = [], 0
    for length in lengths:
        part = slice(start, start + length)
        outputs.append(F.scaled_dot_product_attention(q[:, :, part], k[:, :, part], v[:, :, part], is_causal=causal))
        start += length
    return torch.cat(outputs, dim=2)


def qkv(total: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(1, HEADS, total, DIM, generator=generator, dtype=torch.float32) for _ in range(3)]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kind", ["causal", "bidirectional"])
@pytest.mark.parametrize("pad_to", [None, 64])
def test_sdpa_with_block_diagonal_mask_equals_attention_per_sample(seed, kind, pad_to):
    lengths = random_pack(seed)
    layout = packed_layout(lengths, pad_to_multiple=pad_to)
    q, k, v = qkv(layout.total, seed)
    mask = torch.from_numpy(layout.attention_mask(kind))
    packed = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    real = layout.total - layout.padding
    expected = per_sample_reference(q, k, v, lengths, kind == "causal")
    assert torch.isfinite(packed).all(), "padding rows attend to themselves, never to nothing"
    assert (packed[:, :, :real] - expected).abs().max().item() < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kind", ["causal", "bidirectional"])
def test_flex_attention_with_document_block_mask_equals_attention_per_sample(seed, kind):
    lengths = random_pack(100 + seed)
    layout = packed_layout(lengths, pad_to_multiple=128)  # FlexAttention works in 128-token blocks
    q, k, v = qkv(layout.total, seed)
    documents = torch.from_numpy(layout.document_ids).long()

    def same_document(batch, head, query, key):
        allowed = documents[query] == documents[key]
        return allowed & (query >= key) if kind == "causal" else allowed

    block_mask = create_block_mask(same_document, None, None, layout.total, layout.total, device="cpu")
    packed = flex_attention(q, k, v, block_mask=block_mask)
    real = layout.total - layout.padding
    expected = per_sample_reference(q, k, v, lengths, kind == "causal")
    assert (packed[:, :, :real] - expected).abs().max().item() < 1e-5


def test_cu_seqlens_positions_and_documents_describe_the_pack():
    layout = packed_layout([3, 1, 2], pad_to_multiple=8)
    assert layout.cu_seqlens.dtype == np.int32 and layout.cu_seqlens.tolist() == [0, 3, 4, 6, 8]
    assert layout.position_ids.tolist() == [0, 1, 2, 0, 0, 1, 0, 1]
    assert layout.document_ids.tolist() == [0, 0, 0, 1, 2, 2, 3, 3]
    assert layout.max_seqlen == 3 and layout.padding == 2 and layout.samples == 3
    values = pack_values([np.ones((3, 2)), np.full((1, 2), 2.0), np.full((2, 2), 3.0)], layout)
    assert values.shape == (8, 2) and values[6:].sum() == 0


def test_padded_layout_masks_keys_past_each_sample():
    layout = padded_layout([3, 1], pad_to_multiple=4)
    assert layout.max_len == 4
    assert layout.key_padding_mask.tolist() == [[True, True, True, False], [True, False, False, False]]
