"""One model-agnostic block adapter: embedding -> transformer blocks -> final norm + LM head.

A decoder-only Hugging Face causal LM is split into three parts that can run piecewise, so an
engine can place each block where it likes. Nothing is rewritten: the embedding part runs the
model's own code up to the first block (a forward pre-hook on block 0 captures the block inputs:
hidden states, attention mask, rotary embeddings) and stops there; blocks are called as they are;
the head applies the model's own final modules. A family is a handful of attribute paths.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class FamilySpec:
    """Attribute paths of one model family, relative to the ``*ForCausalLM`` module."""

    base: str  # module whose forward runs embedding + blocks
    layers: str  # the ModuleList of transformer blocks
    embed: tuple[str, ...]  # modules whose parameters form the embedding group
    head: tuple[str, ...]  # modules applied after the blocks, in order


FAMILIES: dict[str, FamilySpec] = {
    "opt": FamilySpec(
        base="model.decoder",
        layers="model.decoder.layers",
        embed=("model.decoder.embed_tokens", "model.decoder.embed_positions",
               "model.decoder.project_in"),
        head=("model.decoder.final_layer_norm", "model.decoder.project_out", "lm_head"),
    ),
    # Llama and the families that copy its layout.
    "llama": FamilySpec(base="model", layers="model.layers", embed=("model.embed_tokens",),
                        head=("model.norm", "lm_head")),
}
MODEL_TYPES = {"opt": "opt", "llama": "llama", "mistral": "llama", "qwen2": "llama",
               "qwen3": "llama", "smollm3": "llama"}


def family_of(model: nn.Module) -> FamilySpec:
    model_type = getattr(model.config, "model_type", None)
    if model_type not in MODEL_TYPES:
        raise ValueError(f"model: architecture {model_type!r} is not supported "
                         f"(supported: {', '.join(sorted(MODEL_TYPES))})")
    return FAMILIES[MODEL_TYPES[model_type]]


def _get(root: nn.Module, path: str) -> nn.Module | None:
    obj: Any = root
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


class _Captured(Exception):
    """Raised by the block-0 pre-hook to stop the base forward once the block inputs exist."""

    def __init__(self, args: tuple, kwargs: dict):
        super().__init__()
        self.block_args, self.block_kwargs = args, kwargs


@dataclass
class BlockContext:
    """Inputs every block shares for one batch (mask, positions, rotary embeddings)."""

    kwargs: dict[str, Any]
    last_index: torch.Tensor  # (B,) index of each row's last real token


class BlockAdapter:
    """Splits ``model`` into embed / blocks / head.

    Args:
        model: a Hugging Face ``*ForCausalLM`` of a supported family.
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.spec = family_of(model)
        self.base = _get(model, self.spec.base)
        self.blocks: list[nn.Module] = list(_get(model, self.spec.layers))
        self.embed_modules = [m for p in self.spec.embed if (m := _get(model, p)) is not None]
        self.head_modules = [m for p in self.spec.head if (m := _get(model, p)) is not None]

    # --- the three parts -------------------------------------------------------------------
    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, BlockContext]:
        """Token ids (B, T) -> hidden states (B, T, D) entering block 0, and the block context."""
        hook = self.blocks[0].register_forward_pre_hook(_raise_captured, with_kwargs=True)
        try:
            self.base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        except _Captured as c:
            # Take the inputs and drop the exception: its traceback holds the forward's frames
            # (and their tensors) in a reference cycle that only the garbage collector breaks.
            args, kwargs = c.block_args, dict(c.block_kwargs)
            c.__traceback__ = None
        else:  # pragma: no cover - a family whose base never reaches block 0
            raise RuntimeError("the model's forward never reached its first block")
        finally:
            hook.remove()
        hidden = args[0] if args else kwargs.pop("hidden_states")
        last = attention_mask.sum(dim=1) - 1
        return hidden, BlockContext(kwargs=kwargs, last_index=last)

    def run_block(self, block: nn.Module, hidden: torch.Tensor, ctx: BlockContext) -> torch.Tensor:
        """(B, T, D) -> (B, T, D) through one block with its current weights."""
        out = block(hidden, **ctx.kwargs)
        return out[0] if isinstance(out, tuple) else out

    def head(self, hidden: torch.Tensor, ctx: BlockContext | None = None) -> torch.Tensor:
        """Final modules. With ``ctx``: logits (B, V) at each row's last real token only, which
        is all a prompt-classification loss needs; without: logits (B, T, V)."""
        if ctx is not None:
            hidden = hidden[torch.arange(hidden.shape[0], device=hidden.device), ctx.last_index]
        for module in self.head_modules:
            hidden = module(hidden)
        return hidden

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The whole model piecewise: logits (B, T, V). Used to check the split."""
        hidden, ctx = self.embed(input_ids, attention_mask)
        for block in self.blocks:
            hidden = self.run_block(block, hidden, ctx)
        return self.head(hidden)


def _raise_captured(module: nn.Module, args: tuple, kwargs: dict) -> None:
    raise _Captured(args, kwargs)
