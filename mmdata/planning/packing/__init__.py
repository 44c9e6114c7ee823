"""Packing variable-length samples into dense token-budgeted micro-batches, balanced over ranks.

Works on token counts alone, before anything is read: `token_costs` -> `plan_packing` ->
per-micro-batch `packed_layout` / `padded_layout`.
"""

from mmdata.planning.packing.cost import Chunked, fit_to_budget, token_costs
from mmdata.planning.packing.layouts import PackedLayout, PaddedLayout, pack_values, packed_layout, padded_layout
from mmdata.planning.packing.padded_plan import PaddedPlan, plan_padded
from mmdata.planning.packing.plan import PackingConfig, PackingPlan, plan_packing
from mmdata.planning.packing.plan_stats import PlanStats, plan_stats

__all__ = [
    "Chunked",
    "PackedLayout",
    "PackingConfig",
    "PackingPlan",
    "PaddedLayout",
    "PaddedPlan",
    "PlanStats",
    "fit_to_budget",
    "pack_values",
    "packed_layout",
    "padded_layout",
    "plan_padded",
    "plan_packing",
    "plan_stats",
    "token_costs",
]
