"""LoRA adapters through ``peft``: which modules get them, and their initial weights.

``peft.inject_adapter_in_model`` wraps each target ``nn.Linear`` (or transformers' ``Conv1D``,
GPT-2's transposed linear, which peft adapts with ``fan_in_fan_out``) in its own ``LoraLayer``
(base layer + low-rank A, B), in place, on the model skeleton: no forward is rewritten here.
The engines then see the adapter weights as ordinary parameters (names containing ``lora_``)
and the wrapped base weight as ``<module>.base_layer.weight``; ``checkpoint_name`` maps that
back to the name a checkpoint stores it under.

Initial weights are peft's rule, made reproducible: A ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming
uniform with a = sqrt(5), as ``nn.Linear``), B = 0, so training starts from the base model.
A is drawn on the CPU from a generator seeded by (run seed, group id), so every engine and
device starts from the same adapter.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from workbench.models.build import group_id

#: Default targets, the first set whose every name is a linear module of the model: attention
#: query and value (LoRA's paper), else the fused query-key-value projection a family uses, the
#: up-projections of latent attention's query and key-value (DeepSeek's MLA, with or without a
#: query rank), a state-space block's input projection (Mamba; peft refuses its out_proj), or
#: GPT-2's fused ``c_attn`` (a ``Conv1D`` there, a Linear in GPT-BigCode).
DEFAULT_TARGETS = (("q_proj", "v_proj"), ("query_key_value",), ("qkv_proj",), ("Wqkv",),
                   ("q_b_proj", "kv_b_proj"), ("q_proj", "kv_b_proj"), ("in_proj",),
                   ("c_attn",))
LORA_MARK = "lora_"  # every adapter parameter's name contains it (lora_A, lora_B)


def targets_for(model: nn.Module, lora_targets: str) -> list[str]:
    """The module names given adapters: ``lora_targets`` split on commas, or the family's
    default (``DEFAULT_TARGETS``). Raises ValueError naming the setting when a target matches
    no linear module (``nn.Linear`` or transformers' ``Conv1D``)."""
    linear = {n.rsplit(".", 1)[-1] for n, m in model.named_modules()
              if isinstance(m, _linear_types())}
    default = next((t for t in DEFAULT_TARGETS if set(t) <= linear), ())
    names = [t.strip() for t in lora_targets.split(",")] if lora_targets else list(default)
    missing = [t for t in names if t not in linear]
    if missing or not names:
        raise ValueError(f"lora_targets: {', '.join(missing) or '(none)'} matches no linear "
                         f"module of this model (linear modules: {', '.join(sorted(linear))})")
    return names


def check_lora_targets(cfg) -> None:
    """Under ``peft=lora``, every ``lora_targets`` name (or the family's default) is a linear
    module of the model: checked on its meta-device skeleton (no weights, milliseconds), before
    a run directory is made.

    Raises:
        ConfigError: a name that matches no linear module, with the ones there are.
    """
    from workbench.config import ConfigError
    from workbench.models.build import build_skeleton

    if cfg.peft != "lora":
        return
    skeleton, _ = build_skeleton(cfg.model)
    try:
        targets_for(skeleton, cfg.lora_targets)
    except ValueError as e:
        raise ConfigError([str(e)]) from None


def inject_lora(model: nn.Module, rank: int, alpha: float, lora_targets: str) -> None:
    """Wrap the target modules of ``model`` (a skeleton, usually on meta) with peft's LoRA
    layers, adapter weights on meta too (the engines materialise them with ``init_lora``)."""
    from peft import LoraConfig, inject_adapter_in_model

    targets = targets_for(model, lora_targets)
    from transformers.pytorch_utils import Conv1D

    # Conv1D stores its weight (in, out): peft adapts it with fan_in_fan_out (and warns when
    # that is not set); a model whose targets are all Conv1D gets it set
    wrapped = [m for n, m in model.named_modules() if n.rsplit(".", 1)[-1] in targets]
    conv1d = bool(wrapped) and all(isinstance(m, Conv1D) for m in wrapped)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, bias="none",
                        target_modules=targets, fan_in_fan_out=conv1d)
    with torch.device("meta"):
        inject_adapter_in_model(config, model)


def _linear_types() -> tuple[type, ...]:
    """The module types LoRA wraps: ``nn.Linear`` and transformers' ``Conv1D``."""
    from transformers.pytorch_utils import Conv1D

    return (nn.Linear, Conv1D)


def is_adapter(name: str) -> bool:
    """True for a parameter name of an adapter weight."""
    return LORA_MARK in name


def checkpoint_name(name: str) -> str:
    """A wrapped base weight's name as the model's checkpoint knows it."""
    return name.replace(".base_layer.", ".")


def init_lora(group: str, named: list[tuple[str, torch.Tensor]], seed: int) -> None:
    """Fill a group of adapter weights in place: A kaiming-uniform, B zero (see module doc)."""
    gen = torch.Generator().manual_seed((seed * 1_000_003 + group_id(group)) & (2**63 - 1))
    with torch.no_grad():
        for name, t in named:
            if ".lora_A." in name:
                bound = 1.0 / math.sqrt(t.shape[1])
                t.copy_(torch.rand(t.shape, generator=gen).mul_(2 * bound).sub_(bound))
            else:
                t.zero_()


class LoRAInit:
    """The ``WeightSource`` of adapter groups (``init_lora``)."""

    def fill(self, group: str, named, seed: int) -> None:
        init_lora(group, list(named), seed)
