"""One model-agnostic block adapter: embedding -> transformer blocks -> final norm + LM head.

A decoder-only Hugging Face causal LM is split into three parts that can run piecewise, so an
engine can place each block where it likes. Nothing is rewritten: the embedding part runs the
model's own code up to the first block (a forward pre-hook on block 0 captures the block inputs:
hidden states, attention mask, rotary embeddings) and stops there; blocks are called as they are;
the head applies the model's own final modules. Where the parts are is read from the model
(``layout.py``); models whose layers mix attention types (sliding / global) get a mask per type,
built once per batch, and each block the mask of its own type.

No host sync: left to itself, Hugging Face's mask code reads the attention mask back from the
GPU (``bool(mask.sum() == mask.numel())``) to decide whether SDPA may run unmasked. Here the
batch says on the host whether it is padded; the adapter builds the block mask with that
decision already made, hands the model positions and a prepared 4D mask (which its mask code
returns untouched), and keeps the context for the next pass over the same batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import inspect
import re

import torch
from torch import nn
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from workbench.models.layout import Refused, find_layout, transform_logits

#: The mask builders' cache argument: ``cache`` from transformers 5.24 (where the old name
#: ``past_key_values`` warns that it is deprecated), ``past_key_values`` before.
_CACHE_ARG = "cache" if "cache" in inspect.signature(create_causal_mask).parameters \
    else "past_key_values"


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
    position_ids: torch.Tensor | None = None  # (B or 1, T), handed to the model's forward
    model_mask: torch.Tensor | dict | None = None  # 4D (per layer type when mixed): what the
    # model's own mask code passes through
    masks: dict[str, torch.Tensor | None] | None = None  # mixed layer types: each type's mask
    # mixed layer types: what the model hands the first block of each type, by type
    per_type: dict[str, dict[str, Any]] | None = None


class BlockAdapter:
    """Splits ``model`` into embed / blocks / head.

    Args:
        model: a Hugging Face ``*ForCausalLM`` of a supported family.
    """

    def __init__(self, model: nn.Module):
        self.model = model
        layout = find_layout(model)
        self.base, self.quirk = layout.base, layout.quirk
        self.blocks: list[nn.Module] = layout.blocks
        self.embed_modules, self.head_modules = layout.embed, layout.head
        cfg = model.config
        types = list(getattr(cfg, "layer_types", None) or ())[:len(self.blocks)]
        if len(set(types)) > 1 and not set(types) <= set(_MASKS) | set(_NO_MASK):
            raise Refused(f"layer types {sorted(set(types) - set(_MASKS) - set(_NO_MASK))}: the "
                          f"adapter builds masks for {', '.join(_MASKS)} layers only")
        # mixed types: each block's type, whose mask it gets (None: one mask serves all)
        self._types = {id(b): t for b, t in zip(self.blocks, types)} if len(set(types)) > 1 \
            else None
        sliding = set(types) == {"sliding_attention"} or cfg.model_type == "mistral"
        # tokens (keys) a query sees in a sliding layer; None: every earlier token
        self.window: int | None = getattr(cfg, "sliding_window", None) \
            if sliding or self._types else None
        self._sdpa = getattr(cfg, "_attn_implementation", None) == "sdpa"
        # a base whose own mask code never takes SDPA's causal path (a sparse-attention indexer
        # or a dynamic mask reads the 4D mask; ALiBi is added onto it): its blocks always get it
        self._always_4d = _materializes_mask(type(self.base))
        accepted = inspect.signature(self.base.forward).parameters
        self._base_kwargs = {k: v for k, v in (("use_cache", False),) if k in accepted}
        self._last: tuple[Any, BlockContext] | None = None  # the last batch and its context
        self._hidden_dim: int | None = None  # dims of the hidden states the blocks pass on
        self._pair: bool | None = None  # the base unpacks (hidden, weights) from each block

    # --- the three parts -------------------------------------------------------------------
    def embed(self, batch) -> tuple[torch.Tensor, BlockContext]:
        """``batch`` (``input_ids`` and ``attention_mask`` (B, T), ``padded``: bool known on the
        host) -> hidden states (B, T, D) entering block 0, and the block context. The context
        is built on the first call for a batch and reused by later calls with the same batch
        object (the + and - passes of a step), so a step builds its mask once and never
        reads from the GPU. A batch whose ``padded`` is None has it read from its mask: a
        host sync when that mask is on a GPU."""
        ids, mask = batch.input_ids, batch.attention_mask
        if self._last is not None and self._last[0] is batch:
            ctx = self._last[1]
            return self._run_base(ids, ctx)[0], ctx
        hidden, ctx = self._context(batch)
        self._hidden_dim = hidden.dim()
        return hidden, ctx

    def _context(self, batch) -> tuple[torch.Tensor, BlockContext]:
        ids, mask = batch.input_ids, batch.attention_mask
        padded = batch.padded if batch.padded is not None else bool((mask == 0).any())
        if self.quirk.base_mask == "2d":  # the base builds the blocks' mask itself
            ctx = BlockContext({}, mask.sum(dim=1) - 1, self._positions(mask), mask)
            hidden, ctx.kwargs = self._run_base(ids, ctx)
            self._last = (batch, ctx)
            return hidden, ctx
        if self._types is None:
            kind = "sliding_attention" if self.window else "full_attention"
            model_mask = self._mask(kind, batch, padded)
            masks = None
        else:  # the model's mask code takes a prepared mask per layer type as a dict
            masks = {kind: self._mask(kind, batch, padded) for kind in set(self._types.values())}
            model_mask = {k: _STAND_IN(mask) if m is None else m for k, m in masks.items()}
        ctx = BlockContext({}, mask.sum(dim=1) - 1, self._positions(mask),
                           _STAND_IN(mask) if model_mask is None else model_mask, masks)
        hidden, ctx.kwargs = self._run_base(ids, ctx, by_type=self._types is not None)
        if model_mask is None:  # the blocks get None (SDPA's causal path)
            ctx.kwargs["attention_mask"] = None
        self._last = (batch, ctx)
        return hidden, ctx

    def _mask(self, kind: str, batch, padded: bool) -> torch.Tensor | None:
        """The 4D mask of one layer type for ``batch``, or None where SDPA's causal path is the
        same (no padding and, for sliding layers, no row longer than the window; eager
        attention, used where a model has no SDPA, has no causal path: always a mask)."""
        ids, mask = batch.input_ids, batch.attention_mask
        if kind in _NO_MASK:
            return None
        if kind in _RECURRENT or self.quirk.mask == "padding":
            # as transformers' create_recurrent_attention_mask gives them
            return mask if padded else None
        window = self.window if kind == "sliding_attention" else None
        if self._sdpa and not self._always_4d \
                and not (padded or (window is not None and ids.shape[1] >= window)):
            return None
        # Hugging Face's own mask, told not to look for the unmasked shortcut (the look is the
        # sync); only the shape, dtype and device of ``inputs_embeds`` are read
        build = create_sliding_window_causal_mask if window else create_causal_mask
        return build(config=self.model.config,
                     inputs_embeds=ids.new_empty((*ids.shape, 0), dtype=torch.float32),
                     attention_mask=mask if padded else None,
                     allow_is_causal_skip=False, **{_CACHE_ARG: None})

    def _positions(self, mask: torch.Tensor) -> torch.Tensor:
        if self.quirk.positions == "cumsum":  # as OPT's own forward computes them
            return (torch.cumsum(mask, dim=1) * mask - 1).long()
        return torch.arange(mask.shape[1], device=mask.device).unsqueeze(0)

    def _run_base(self, input_ids: torch.Tensor, ctx: BlockContext,
                  by_type: bool = False) -> tuple[torch.Tensor, dict[str, Any]]:
        """The model's own forward up to block 0: (hidden (B, T, D), block 0's kwargs). A 4D
        mask and explicit positions leave its mask code nothing to compute or check. With
        ``by_type`` (mixed layer types), the forward runs its loop over stand-ins of the blocks
        that pass the hidden states through, up to the first block of each type, and
        ``ctx.per_type`` keeps what that block is handed (a rotary table of its type's base,
        None where its type takes none, ...)."""
        if by_type:
            return self._run_base_by_type(input_ids, ctx)
        hook = self.blocks[0].register_forward_pre_hook(_raise_captured, with_kwargs=True)
        try:
            self.base(input_ids=input_ids, attention_mask=ctx.model_mask,
                      position_ids=ctx.position_ids, **self._base_kwargs)
        except _Captured as c:
            # Take the inputs and drop the exception: its traceback holds the forward's frames
            # (and their tensors) in a reference cycle that only the garbage collector breaks.
            args, kwargs = c.block_args, dict(c.block_kwargs)
            c.__traceback__ = None
        else:  # pragma: no cover - a family whose base never reaches block 0
            raise RuntimeError("the model's forward never reached its first block")
        finally:
            hook.remove()
        return _by_name(self.blocks[0], args, kwargs)

    def _run_base_by_type(self, input_ids: torch.Tensor,
                          ctx: BlockContext) -> tuple[torch.Tensor, dict[str, Any]]:
        firsts: dict[str, int] = {}
        for i, block in enumerate(self.blocks):
            firsts.setdefault(self._types[id(block)], i)
        seen: dict[int, tuple[tuple, dict]] = {}
        name = next(n for n, m in self.base.named_children()
                    if isinstance(m, nn.ModuleList) and list(m) == self.blocks)
        real = getattr(self.base, name)
        # what a block returns: its hidden states, or (hidden states, attention weights) for a
        # forward that unpacks two (Bamba's); tried in turn, the one that ran is kept
        for pair in ((self._pair,) if self._pair is not None else (False, True)):
            setattr(self.base, name, nn.ModuleList(
                _StandIn(b, i, seen, i == max(firsts.values()), pair)
                for i, b in enumerate(self.blocks)))
            try:
                self.base(input_ids=input_ids, attention_mask=ctx.model_mask,
                          position_ids=ctx.position_ids, **self._base_kwargs)
            except _Captured as c:
                c.__traceback__ = None
                self._pair = pair
                break
            except (ValueError, TypeError):
                if pair:
                    raise
            else:  # pragma: no cover - a family whose base stops before its last block type
                raise RuntimeError("the model's forward never reached a block of each type")
            finally:
                setattr(self.base, name, real)
        inputs = {}
        for kind, i in firsts.items():
            hidden, kwargs = _by_name(self.blocks[i], *seen[i])
            inputs[kind] = kwargs
            if i == 0:
                first = hidden, kwargs
        ctx.per_type = inputs
        return first

    def run_block(self, block: nn.Module, hidden: torch.Tensor, ctx: BlockContext) -> torch.Tensor:
        """(B, T, D) -> (B, T, D) through one block with its current weights."""
        if ctx.masks is None:
            kwargs = ctx.kwargs
        else:
            kind = self._types[id(block)]
            kwargs = {**(ctx.per_type or {}).get(kind, ctx.kwargs),
                      "attention_mask": ctx.masks[kind]}
        out = block(hidden, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    def head(self, hidden: torch.Tensor, ctx: BlockContext | None = None) -> torch.Tensor:
        """Final modules. With ``ctx``: logits (B, V) at each row's last real token only, which
        is all a prompt-classification loss needs; without: logits (B, T, V)."""
        if ctx is not None:
            rows = torch.arange(hidden.shape[0], device=hidden.device)
            hidden = hidden[rows, ctx.last_index]
        # a token per row, (B, ...): run as a length-1 sequence, so a head that mixes streams
        # (DeepSeek-V4's hyper-connections, hidden (B, T, streams, D)) finds its time axis
        one = self._hidden_dim is not None and hidden.dim() == self._hidden_dim - 1
        if one:
            hidden = hidden.unsqueeze(1)
        for module in self.head_modules:
            hidden = module(hidden)
        logits = transform_logits(self.model.config, hidden)
        return logits.squeeze(1) if one else logits

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The whole model piecewise: logits (B, T, V). Used to check the split."""
        hidden, ctx = self.embed(Inputs(input_ids, attention_mask))
        for block in self.blocks:
            hidden = self.run_block(block, hidden, ctx)
        return self.head(hidden)


@dataclass
class Inputs:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    padded: bool | None = None


#: Layer types whose masks the adapter builds (``_mask``): a 4D mask for attention layers; for
#: linear-attention and state-space layers the 2D padding mask, None when nothing is padded (what
#: transformers' ``create_recurrent_attention_mask`` gives them).
_MASKS = ("full_attention", "sliding_attention", "linear_attention", "conv",
          "indexed_attention")
#: Of those, the layers that get the 2D padding mask (LFM2's short convolutions too).
_RECURRENT = ("linear_attention", "conv")
#: Layer types of hybrid stacks that take no mask (Nemotron-H's MLP and MoE layers get None
#: from the model's own mask mapping).
_NO_MASK = ("mlp", "moe")


def _materializes_mask(cls: type) -> bool:
    """True when ``cls.forward`` builds its causal mask with ``allow_is_causal_skip=False``."""
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    return re.search(r"allow_is_causal_skip[\"']?\s*[=:]\s*False", source) is not None


def _STAND_IN(mask: torch.Tensor) -> torch.Tensor:
    """What gets an unmasked batch past the model's mask code (the blocks then get None)."""
    return mask.new_ones((1, 1, 1, 1), dtype=torch.bool)


class _StandIn(nn.Module):
    """Stands in for block ``index`` while the base runs: records what it is handed and passes
    the hidden states through (the last one needed stops the forward). Other attributes are the
    block's, for a forward that reads them (a layer's type, ...)."""

    def __init__(self, block: nn.Module, index: int, seen: dict, last: bool,
                 pair: bool = False):
        super().__init__()
        object.__setattr__(self, "_wrapped", (block, index, seen, last))  # not a submodule
        object.__setattr__(self, "_pair", pair)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "_wrapped")[0], name)

    def forward(self, *args, **kwargs):
        _, index, seen, last = object.__getattribute__(self, "_wrapped")
        seen[index] = (args, kwargs)
        if last:
            raise _Captured(args, kwargs)
        hidden = args[0] if args else kwargs["hidden_states"]
        return (hidden, None) if object.__getattribute__(self, "_pair") else hidden


def _by_name(block: nn.Module, args: tuple, kwargs: dict) -> tuple[torch.Tensor, dict]:
    """What a block was handed as (hidden states, the rest by parameter name): a family that
    passes its mask positionally (XGLM: ``layer(hidden, attention_mask, ...)``) gets it back
    by name."""
    bound = inspect.signature(block.forward).bind_partial(*args, **kwargs).arguments
    params = inspect.signature(block.forward).parameters
    named: dict[str, Any] = {}
    for key, value in bound.items():
        if params[key].kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        elif params[key].kind is not inspect.Parameter.VAR_POSITIONAL:
            named[key] = value
    return named.pop(next(iter(params))), named


def _raise_captured(module: nn.Module, args: tuple, kwargs: dict) -> None:
    raise _Captured(args, kwargs)
