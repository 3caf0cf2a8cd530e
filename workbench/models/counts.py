"""Parameters of a model's three parts (embedding, each block, head), counted on the model
itself: the planner's figures for any layout its formulas (``presets.Preset``) do not know."""
from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path

from torch import nn

from workbench.presets import Preset, lookup

Counts = tuple[int, tuple[int, ...], int]


def part_counts(model: nn.Module) -> Counts:
    """Parameters of (embedding, each block, head) as the engine groups them: each tensor in
    the first part that holds it (a tied LM head's weight is the embedding's)."""
    from workbench.models.layout import find_layout

    layout, seen = find_layout(model), set()

    def count(modules: list[nn.Module]) -> int:
        n = 0
        for module in modules:
            for p in module.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    n += p.numel()
        return n

    embed = count(layout.embed)
    blocks = tuple(count([b]) for b in layout.blocks)
    return embed, blocks, count(layout.head)


@functools.lru_cache(maxsize=None)
def folder_counts(config_file: Path) -> Counts:
    """``part_counts`` of the model a ``config.json`` describes, built on the meta device (no
    weights are read or allocated; seconds for the largest published models)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(config_file.parent)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return part_counts(model)


def counted(preset: Preset, counts: Counts) -> Preset:
    """``preset`` with its parts' real parameter counts (and so its real depth)."""
    return replace(preset, num_layers=len(counts[1]), counts=counts)


@functools.lru_cache(maxsize=None)
def tiny_preset(model: str) -> Preset:
    """``tiny:<model_type>``'s preset with its parts' parameters counted on the built model
    (kilobytes, on the CPU): a layout the preset formulas do not know is counted, not guessed."""
    from workbench.models.build import build_skeleton

    return counted(lookup(model), part_counts(build_skeleton(model)[0]))
