"""Adapter runs (``peft=lora``): the split of a model into frozen base groups and trainable
adapter groups, shared by every engine that trains adapters.

The base groups are the usual (embedding, blocks, head) layouts without the adapter weights;
the trainable groups are one ``block.{i}.lora`` group per block. Engines hand only the
trainable groups to ``zo/step.py``, so only adapter weights are ever perturbed or updated;
``param_digest`` covers them and ``base_digest`` the frozen base.
"""
from __future__ import annotations

import torch

from workbench.config import RunConfig
from workbench.engine.codecs.base import base_codec
from workbench.engine.codecs.frozen_form import FrozenForm, matrix_dtype
from workbench.engine.groups import GroupLayout, LazyFlats, adapter_layouts, build_layouts
from workbench.engine.storage import Group, materialise
from workbench.engine.zo.half import weight_dtype
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
    nothing frozen and every (embedding, block, head) group trainable, in fp32 or MeZO's half
    weights (``zo/half.py``)."""
    if cfg.peft == "lora":
        return frozen_groups(adapter, source, cfg, device), adapter_groups(adapter, cfg, device)
    embed, blocks, head = build_layouts(adapter)
    dtype = weight_dtype(cfg)
    groups = [Group(lay, materialise(lay, source, cfg.seed, device, dtype=dtype))
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
    """Every base group on ``device`` (embedding, blocks, head), bound; the blocks hold what
    their ``base_codec`` decodes to (``frozen_block``), exactly what a streamed block computes
    with."""
    embed, blocks, head = build_layouts(adapter)
    groups = [Group(embed, materialise(embed, source, cfg.seed, device)),
              *(frozen_block(lay, source, cfg, device) for lay in blocks),
              Group(head, materialise(head, source, cfg.seed, device))]
    for group in groups:
        group.bind()
    return groups


def frozen_block(lay: GroupLayout, source, cfg: RunConfig, device: torch.device) -> Group:
    """A base block on ``device`` (not bound): fp32 as loaded for ``base_codec=fp32``; else
    encoded and decoded into its ``FrozenForm`` (matrices in the ``amp`` dtype under
    autocast), as ``FrozenTransfer`` decodes a streamed block into its slot."""
    flat = materialise(lay, source, cfg.seed, device)
    dtype = matrix_dtype(cfg.amp, cfg.base_codec)
    if dtype is None or not lay.numel:
        return Group(lay, flat)
    codec, form = base_codec(cfg.base_codec, lay), FrozenForm(lay, dtype)
    wire = torch.empty(codec.nbytes, dtype=torch.uint8, device=device)
    codec.encode(flat, wire)
    del flat  # the fp32 block goes before the form is made
    buf = form.empty(device)
    codec.decode_form(wire, *form.parts(buf))
    return Group(lay, buf, form)


def base_values(groups: list[Group]) -> LazyFlats:
    """The frozen groups' weights as fp32, made one group at a time (a form is decoded when
    it is reached, so a digest never holds the model twice)."""
    return LazyFlats(len(groups), lambda k: groups[k].values())
