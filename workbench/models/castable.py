"""Which matrices autocast casts: what compute-dtype slots may hold pre-cast.

``slot_dtype=compute`` (``engine/stream/compute_slots.py``) holds every matrix of a streamed block
(each parameter with 2+ dimensions, the layout's decay prefix) already rounded to the compute
dtype, which equals the fp32-slot run only where the forward feeds that weight to an op autocast
casts. A weight of ``nn.Linear`` or of transformers' ``Conv1D`` always is (``F.linear`` /
``addmm``). Other matrices may not be: an experts module's fused 3-D weights go through grouped
matmuls outside autocast's lists, a router may upcast its weight to fp32, a state-space layer
reads its convolution weight by hand (mixtral, qwen3_moe, jamba, nemotron_h and qwen3_next gave
other bits with compute slots). Those models keep fp32 slots.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the planner imports this module and never torch
    from torch import nn


def _cast_owner(module: "nn.Module", slot: str) -> bool:
    from torch import nn
    from transformers.pytorch_utils import Conv1D

    return slot == "weight" and isinstance(module, (nn.Linear, Conv1D))


def uncast_matrices(modules: "list[nn.Module]") -> list[str]:
    """Names of the matrices (2+ dimensions) in ``modules`` that are not the weight of an
    ``nn.Linear`` or ``Conv1D`` (empty: compute-dtype slots are exact for them)."""
    out = []
    for top in modules:
        for name, module in top.named_modules():
            for slot, p in module.named_parameters(recurse=False):
                if p.dim() >= 2 and not _cast_owner(module, slot):
                    out.append(f"{name}.{slot}" if name else slot)
    return out


def uncast_entries(layouts: list) -> list[str]:
    """``uncast_matrices`` over the entries of engine group layouts (``engine/groups.py``:
    each entry's owners are (module, slot) pairs)."""
    return [e.name for lay in layouts for e in lay.entries
            if len(e.shape) >= 2 and not all(_cast_owner(m, s) for m, s in e.owners)]


@functools.lru_cache(maxsize=None)
def model_uncast(model: str) -> tuple[str, ...]:
    """``uncast_matrices`` of ``model``'s blocks: none for the layouts the preset formulas
    know (OPT, Llama); any other on its skeleton (a preset on the meta device: seconds for the
    largest; cached)."""
    from workbench.presets import PRESETS

    preset = PRESETS.get(model)
    if preset is not None and preset.family in ("opt", "llama"):
        return ()
    from workbench.models.build import build_skeleton
    from workbench.models.layout import find_layout

    skeleton, _ = build_skeleton(model)
    return tuple(uncast_matrices(list(find_layout(skeleton).blocks)))
