"""Where a decoder's parts are, read from the model itself: no per-model table of paths.

The blocks are the ``nn.ModuleList`` whose entries are the classes the model names in
``_no_split_modules`` (the convention ``accelerate`` uses to place blocks). The base is the
module that owns that list: its forward runs the embedding and then the blocks. Which of the
base's other parameterized children run before the blocks and which after is read from the
order in which its ``forward`` names them (``self.embed_positions`` before ``self.layers``,
``self.norm`` after); the embedding part is ``get_input_embeddings()`` plus those before, the
head part those after plus ``get_output_embeddings()``.

A model that does not fit is refused with one line naming why (``Refused``). ``QUIRKS`` holds
what the model's structure cannot say, each entry with its reason, and only where a test
(``tests/models/test_any_decoder.py``) shows it is needed.
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass

import torch
from torch import nn


class Refused(ValueError):
    """A model the block adapter cannot split; the message is one line naming the reason."""


@dataclass(frozen=True)
class Quirk:
    """What one family does that its module structure does not show."""

    # position ids as the family's own forward computes them from a 2D mask (B, T): "cumsum"
    # (count of real tokens so far, minus one) or "arange" (0..T-1 for every row)
    positions: str = "arange"
    # what its blocks take as attention_mask: "causal" (a 4D mask, or None on SDPA's causal
    # path) or "padding" (the 2D padding mask, None when nothing is padded)
    mask: str = "causal"
    # what the base's own forward is handed as attention_mask: "prepared" (the adapter's 4D
    # mask, which its mask code passes through) or "2d" (the batch's padding mask: a base
    # that builds more than the mask from it, BLOOM's ALiBi; its blocks get what it builds,
    # and its mask code may read the mask back: a host sync on a GPU)
    base_mask: str = "prepared"
    reason: str = ""


QUIRKS: dict[str, Quirk] = {
    "opt": Quirk(positions="cumsum", reason="OPT's learned positions count the real tokens "
                 "(cumsum of the mask), so a left-padded row starts at position 0"),
    **dict.fromkeys(("mamba", "falcon_mamba", "mamba2"), Quirk(
        mask="padding", reason="state-space blocks only: the model hands each block the 2D "
        "padding mask as given (no layer_types names them)")),
    "bloom": Quirk(base_mask="2d", reason="BLOOM's base builds its ALiBi biases from the 2D "
                   "padding mask (a 4D one does not unpack)"),
}

#: Types whose blocks are not one pass of hidden states through a list, refused with why.
REFUSED: dict[str, str] = {
    "dory": "its forward runs a span of its blocks several times (recurrent loops), not each "
            "block once",
    "zaya": "each block hands the next its router's hidden states beside the hidden states "
            "(and its base scales the embeddings with weights of its own)",
    "hy_v4": "its shared sparse-attention layers read the top-k indices an earlier full "
             "indexer layer computed, which blocks run one at a time do not hand on",
    **dict.fromkeys(("inkling2_text", "inkling2_loop_text"), "each block reads the stack of "
                    "every earlier block's output (block attention residuals), not one hidden "
                    "state"),
}

#: The types whose parts, found as above, compute what the model itself computes: each passed
#: ``tests/models/test_any_decoder.py`` built tiny (its forward against the model's own, padded
#: and not; zo-offload's digest and losses against MeZO's under each scheduler knob, fp32, 3
#: steps; resume exact; fo overfitting a batch; LoRA's targets; the planner's part counts).
#: 130 of the 196 causal-LM types of transformers 5.24, each built with every kind of layer its
#: family has (DeepSeek-V4's compressed attention, Llama 4's chunked attention, Inkling's
#: hybrid layers, HY-V4's shared sparse attention and Qwen4-exp's indexed attention, absent
#: from their earlier tiny models, are not run here); the slow grid of that test checks that
#: this is exactly the set that passes. Any other type is
#: refused: the grid found types whose parts are found but whose piecewise logits differ, or
#: that fail to run, and a wrong model must not train silently.
CHECKED = frozenset({
    "afmoe", "apertus", "apertus1p5_text", "arcee", "aria_text", "axk1", "axk2", "bailing_hybrid",
    "bamba", "bart", "beam", "bigbird_pegasus", "bitnet", "bloom", "codegen", "cohere", "cohere2",
    "cohere2_moe", "cohere_compass_text", "cwm", "dbrx", "deepseek_v2", "deepseek_v3",
    "deepseek_v32", "diffllama", "doge", "dots1", "dots3_note_text", "ernie4_5",
    "ernie4_5_moe", "exaone", "exaone4", "exaone_moe", "falcon", "falcon_h1", "falcon_mamba",
    "flex_olmo", "flint", "gemma", "gemma2", "gemma3_text", "gemma4_unified_text", "glm", "glm4",
    "glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "gpt-sw3", "gpt2", "gpt_bigcode", "gpt_neo",
    "gpt_neox", "gpt_neox_japanese", "gpt_oss", "gptj", "granite", "granite_swa", "granitemoe",
    "granitemoe_swa", "granitemoehybrid", "granitemoeshared", "helium", "hunyuan_v1_dense",
    "hunyuan_v1_moe", "hy_v3", "hyperclovax", "internlm3", "iquestcoder",
    "jais2", "jamba", "jetmoe", "kimi_linear", "kolibri1", "laguna", "lara_mini", "lfm2",
    "lfm2_moe", "lfm3", "llama", "mamba", "mamba2", "mbart", "mellum",
    "mimo_v2_flash", "minicpm3", "minimax", "minimax_m2", "minimax_m3_vl_text", "ministral",
    "ministral3", "mistral", "mixtral", "moshi", "mpt", "nanochat", "nemotron", "nemotron_h",
    "olmo", "olmo2", "olmo3", "olmo_hybrid", "olmoe", "opt", "persimmon", "phi", "phi3", "phimoe",
    "qwen2", "qwen2_moe", "qwen3", "qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5_text",
    "qwen3_moe", "qwen3_next", "recurrent_gemma", "rwkv",
    "sarvam_mla", "sarvam_moe", "seed_oss", "smollm3", "solar_open", "stablelm", "starcoder2",
    "trocr", "vaultgemma", "xglm", "xlstm", "youtu"
})

#: Logit transforms a ``*ForCausalLM`` applies after its LM head, by the config key that turns
#: each on: soft-capping cap * tanh(z / cap) (gemma2/3, cohere2, ...; xLSTM names its cap
#: output_logit_soft_cap, RecurrentGemma logits_soft_cap), z * logit_scale (cohere),
#: z / logits_scaling (granite), Inkling's hidden / logits_mup_width_multiplier before its
#: bias-free head (the same as dividing z) and its cut to unpadded_vocab_size. The test that
#: runs every type against its full forward finds any other.
LOGIT_KEYS = ("final_logit_softcapping", "output_logit_soft_cap", "logits_soft_cap", "logit_scale",
              "logits_scaling", "logits_mup_width_multiplier", "unpadded_vocab_size")


@dataclass(frozen=True)
class Layout:
    """The parts of one ``*ForCausalLM``."""

    base: nn.Module  # its forward runs embedding + blocks
    blocks: list[nn.Module]
    embed: list[nn.Module]  # input embeddings first, then the rest in the order forward names them
    head: list[nn.Module]  # what runs after the last block, in order, then the output embeddings
    quirk: Quirk


def find_layout(model: nn.Module) -> Layout:
    """Split ``model`` into base, blocks, embedding and head modules (no forward is run; the
    model may be on the meta device).

    Raises:
        Refused: one line naming what does not fit (no block list, several, an encoder
            stack, parameters outside the three parts, ...).
    """
    config = model.config
    if config.model_type in REFUSED:
        raise Refused(f"type {config.model_type!r}: {REFUSED[config.model_type]}")
    if getattr(config, "is_encoder_decoder", False):
        raise Refused("an encoder-decoder model (the adapter runs decoder-only models)")
    path, layers = _block_list(model)
    base_path, _, attr = path.rpartition(".")
    base = model.get_submodule(base_path)
    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    if not isinstance(outputs, nn.Module):
        raise Refused("no output embeddings (get_output_embeddings() is None)")
    children = {n: m for n, m in base.named_children() if n != attr}
    if inputs is None or all(inputs is not m for m in children.values()):
        raise Refused(f"{path}'s owner does not hold the input embeddings (an encoder stack "
                      "or a wrapper the adapter cannot run up to its first block)")
    before, after = _split_by_forward(type(base), attr, children)
    # Before block 0 the base's own forward runs everything; only the trained parts are listed.
    # After the last block the adapter runs the head itself: a final norm without weights
    # (OLMo's) is part of it too.
    before = [m for m in before if next(m.parameters(), None) is not None]
    embed = [inputs] + [m for m in before if m is not inputs]
    head = [m for m in after if m is not outputs] + [outputs]
    _check_covered(model, [*embed, layers, *head])
    if config.model_type not in CHECKED:  # found, but not yet shown to compute right
        raise Refused(f"type {config.model_type!r} has not passed the check of its parts "
                      f"against its own forward ({len(CHECKED)} types have: "
                      "workbench.models.layout.CHECKED)")
    return Layout(base, list(layers), embed, head, QUIRKS.get(config.model_type, Quirk()))


def _block_list(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The one ModuleList of ``_no_split_modules`` blocks: (its path, the list)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    if not names:
        raise Refused("the model names no _no_split_modules, so its blocks are unknown")
    lists = [(p, m) for p, m in model.named_modules()
             if isinstance(m, nn.ModuleList) and len(m) and p
             and all(type(b).__name__ in names for b in m)]
    if not lists:
        raise Refused(f"no ModuleList of its blocks ({', '.join(sorted(names))})")
    if len(lists) > 1:
        raise Refused(f"several block lists ({', '.join(p for p, _ in lists)}): a multimodal "
                      "or multi-stack model")
    return lists[0]


def _split_by_forward(cls: type, attr: str,
                      children: dict[str, nn.Module]) -> tuple[list[nn.Module], list[nn.Module]]:
    """The children the base's forward names before ``self.<attr>`` and those it names after,
    each in the order the forward first names them there (a child without parameters that it
    never names is left out; a parameterized one is refused: when it runs is unknown). A child
    named on both sides runs on both (NanoChat's weightless norm before and after its blocks);
    a parameterized one would be trained as two parts, and is refused."""
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        raise Refused(f"{cls.__name__}.forward has no readable source") from None

    def named(name: str) -> list[int]:
        return [m.start() for m in re.finditer(rf"self\.{re.escape(name)}\b", source)]

    at = next(iter(named(attr)), -1)
    if at < 0:
        raise Refused(f"{cls.__name__}.forward never names self.{attr}")
    where = {n: named(n) for n in children}
    unnamed = [n for n, i in where.items()
               if not i and next(children[n].parameters(), None) is not None]
    if unnamed:
        raise Refused(f"{cls.__name__}.forward never names its parameterized "
                      f"{', '.join(unnamed)}, so when they run is unknown")
    before = sorted((i[0], n) for n, i in where.items() if i and i[0] < at)
    # after the blocks, in the order the calls end: self.norm(self.hc_head(h)) runs hc_head
    # first (DeepSeek-V4's hyper-connection head)
    after = sorted((_call_end(source, min(j for j in i if j > at)), n)
                   for n, i in where.items() if i and i[-1] > at)
    both = {n for _, n in before} & {n for _, n in after}
    if any(next(children[n].parameters(), None) is not None for n in both):
        raise Refused(f"{cls.__name__}.forward runs {', '.join(sorted(both))} both before and "
                      "after its blocks")
    return [children[n] for _, n in before], [children[n] for _, n in after]


def _call_end(source: str, at: int) -> int:
    """Where the call ``self.<name>(...)`` starting at ``at`` closes (its start when the name is
    not called there)."""
    i = source.index(".", at) + 1
    while i < len(source) and (source[i].isalnum() or source[i] == "_"):
        i += 1
    if i >= len(source) or source[i] != "(":
        return at
    depth = 0
    for j in range(i, len(source)):
        depth += {"(": 1, ")": -1}.get(source[j], 0)
        if depth == 0:
            return j
    return at


def _check_covered(model: nn.Module, parts: list[nn.Module]) -> None:
    """Every parameter of ``model`` is in one of ``parts``: none is left untrained."""
    covered = {id(p) for m in parts for p in m.parameters()}
    stray = [n for n, p in model.named_parameters() if id(p) not in covered]
    if stray:
        raise Refused(f"parameters outside embedding, blocks and head: {', '.join(stray[:3])}")


def transform_logits(config, logits: torch.Tensor) -> torch.Tensor:
    """What the ``*ForCausalLM`` does to its LM head's output (``LOGIT_KEYS``); (..., V)."""
    cap = next((c for c in (getattr(config, k, None) for k in LOGIT_KEYS[:3]) if c), None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    scale = getattr(config, "logit_scale", None)
    if isinstance(scale, (int, float)) and scale != 1:
        logits = logits * scale
    for key in ("logits_scaling", "logits_mup_width_multiplier"):
        divisor = getattr(config, key, None)
        if isinstance(divisor, (int, float)) and divisor != 1:
            logits = logits / divisor
    keep = getattr(config, "unpadded_vocab_size", None)
    if isinstance(keep, int) and keep < logits.shape[-1]:
        logits = logits[..., :keep]
    return logits
