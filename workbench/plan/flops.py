"""FLOP counts of a preset's shapes: the arithmetic both the planner and the calibration use.

Below both (it imports only the presets), so neither has to import the other for it.
"""
from __future__ import annotations

from workbench.presets import Preset


def block_flops(p: Preset, rows: int, t: int, causal: bool = True) -> float:
    """FLOPs of one block forward over ``rows`` x ``t`` tokens: 2 per weight per token + QK^T
    and AV (half when causal)."""
    attention = 4.0 * rows * t * t * p.hidden * (0.5 if causal else 1.0)
    return 2.0 * p.block_params() * rows * t + attention
