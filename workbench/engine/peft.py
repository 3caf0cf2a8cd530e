"""Adapter runs (``peft=lora``): the split of a model into frozen base groups and trainable
adapter groups, shared by every engine that trains adapters.

The base groups are the usual (embedding, blocks, head) layouts without the adapter weights;
the trainable groups are one ``block.{i}.lora`` group per block. Engines hand only the
trainable groups to ``zo_step.py``, so only adapter weights are ever perturbed or updated;
``param_digest`` covers them and ``base_digest`` the frozen base.
"""
from __future__ import annotations

import torch

from workbench.config import RunConfig
from workbench.engine.base_codecs import round_trip
from workbench.engine.codecs import HALF
from workbench.engine.groups import GroupLayout, adapter_layouts, build_layouts
from workbench.engine.zo_common import Group, materialise
from workbench.models.adapter import BlockAdapter
from workbench.models.lora import LoRAInit, inject_lora


def block_adapter(model, cfg: RunConfig) -> BlockAdapter:
    """The model's block adapter, with LoRA layers injected first when ``cfg.peft`` asks."""
    if cfg.peft == "lora":
        inject_lora(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets)
    return BlockAdapter(model)


def model_groups(adapter: BlockAdapter, source, cfg: RunConfig,
                 device: torch.device) -> tuple[list[Group], list[Group]]:
    """(frozen, trainable) groups of a model held whole on ``device``, bound: with
    ``peft=lora`` the base (``frozen_groups``) and the adapters (``adapter_groups``), else
    nothing frozen and every (embedding, block, head) group trainable."""
    if cfg.peft == "lora":
        return frozen_groups(adapter, source, cfg, device), adapter_groups(adapter, cfg, device)
    embed, blocks, head = build_layouts(adapter)
    groups = [Group(lay, materialise(lay, source, cfg.seed, device))
              for lay in (embed, *blocks, head)]
    for group in groups:
        group.bind()
    return [], groups


def adapter_groups(adapter: BlockAdapter, cfg: RunConfig, device: torch.device) -> list[Group]:
    """The trainable adapter groups, initialised (``models/lora.py``) on ``device``, bound."""
    groups = [Group(lay, materialise(lay, LoRAInit(), cfg.seed, device))
              for lay in adapter_layouts(adapter)]
    for group in groups:
        group.bind()
    return groups


def frozen_groups(adapter: BlockAdapter, source, cfg: RunConfig,
                  device: torch.device) -> list[Group]:
    """Every base group on ``device`` (embedding, blocks, head), bound; the blocks hold the
    values their ``base_codec`` decodes to, exactly what a streamed block computes with. A
    bf16 / fp16 base under the matching ``amp`` on CUDA is kept in that dtype (half the memory;
    autocast casts an fp32 copy of those values to the same dtype anyway, and runs layer norms
    in fp32 either way; CPU autocast leaves layer norms mixed-dtype, so there it stays fp32)."""
    embed, blocks, head = build_layouts(adapter)
    on_cuda = device.type == "cuda"
    half = HALF.get(cfg.base_codec) if on_cuda and cfg.amp == cfg.base_codec else None
    groups = []
    for k, lay in enumerate((embed, *blocks, head)):
        flat = materialise(lay, source, cfg.seed, device)
        if 0 < k <= len(blocks):
            round_trip(cfg.base_codec, lay, flat)
            if half is not None:
                flat = flat.to(half)
        groups.append(Group(lay, flat))
        groups[-1].bind()
    return groups


def layouts_of(groups: list[Group]) -> list[GroupLayout]:
    return [g.layout for g in groups]
