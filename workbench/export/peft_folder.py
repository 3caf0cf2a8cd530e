"""What a ``peft=lora`` run exports: a PEFT adapter folder, or the base with the adapter merged.

The adapter folder is what ``peft``'s ``save_pretrained`` writes: ``adapter_config.json`` (a
``LoraConfig`` of the run's rank, alpha and target modules, task CAUSAL_LM) and
``adapter_model.safetensors`` whose keys are the model's adapter parameters under the
``PeftModel`` prefix, adapter name left out (``base_model.model.<module>.lora_A.weight``).
``PeftModel.from_pretrained(base, DIR)`` then computes what the workbench computed, given the
base the run trained on.

The merged model is that base with each adapter folded into its target's weight as
``merge_and_unload`` folds it: W + (B @ A) * alpha / r, in fp32. The base is the one the run
computed with: for ``base_codec=fp32`` the model's own weights, otherwise their decoded
encoding (``engine/peft.py``'s ``frozen_block``), so the merged model computes what the run
did; ``base_digest`` checks it is that base.
"""
from __future__ import annotations

from pathlib import Path

import torch

from workbench.engine.groups import GroupLayout

ADAPTER = "default"  # the adapter name peft gives an injected adapter (left out of saved keys)
PREFIX = "base_model.model."  # what ``PeftModel`` puts before the model's own names


def peft_key(name: str) -> str:
    """An adapter parameter's name in the workbench -> its key in adapter_model.safetensors."""
    return PREFIX + name.replace(f".{ADAPTER}.", ".")


def target_modules(layouts: list[GroupLayout]) -> list[str]:
    """The module names (last part) carrying adapters, from the adapter groups' entries."""
    return sorted({e.name.split(".lora_")[0].rsplit(".", 1)[-1]
                   for lay in layouts for e in lay.entries})


def write_adapter_config(folder: Path, config: dict, layouts: list[GroupLayout],
                         base: str, revision: str | None = None) -> None:
    """``adapter_config.json`` through peft's own ``LoraConfig`` (``base``: a hub id, or the
    folder beside the adapter; ``revision``: the base's Hub commit, where known)."""
    from peft import LoraConfig

    LoraConfig(r=int(config["lora_rank"]), lora_alpha=float(config["lora_alpha"]),
               lora_dropout=0.0, bias="none", target_modules=target_modules(layouts),
               task_type="CAUSAL_LM", base_model_name_or_path=base,
               revision=revision).save_pretrained(str(folder))


def merge_block(base: GroupLayout, flat: torch.Tensor, adapter: GroupLayout,
                lora: torch.Tensor, scaling: float) -> None:
    """Fold block ``adapter``'s LoRA weights (``lora`` (n,), fp32) into the block's base
    weights ``flat`` ((n,), fp32, of layout ``base``) in place, as peft's merge does."""
    views = dict(base.named_views(flat))
    parts = dict(adapter.named_views(lora))
    for name, a in parts.items():
        if f".lora_A.{ADAPTER}." not in name:
            continue
        module = name.split(".lora_A.")[0]
        b = parts[name.replace(".lora_A.", ".lora_B.")]
        views[f"{module}.weight"].add_((b @ a) * scaling)
