"""Packing variable-length samples by token cost: what a sample costs (`cost`), the Numba bin-packing kernels
(`kernels`) that `planning.packed_windows` packs each window of an epoch's order with, and the collated layouts of a
micro-batch (`layouts`: packed with `cu_seqlens`, or padded, with attention masks).
"""

from mmdata.planning.packing.cost import TokensPer, token_costs
from mmdata.planning.packing.layouts import PackedLayout, PaddedLayout, pack_values, packed_layout, padded_layout

__all__ = [
    "PackedLayout",
    "PaddedLayout",
    "TokensPer",
    "pack_values",
    "packed_layout",
    "padded_layout",
    "token_costs",
]
