"""``model=tiny:<model_type>``: a tiny random model of any causal-LM architecture transformers
knows, built from its own config class with the sizes shrunk (``presets.TINY``: 2 blocks,
hidden 64, 4 heads over 2 key/value heads of 16, 4 experts choosing 2 for mixture-of-experts
types, the byte tokenizer's 260 tokens). For tests, demos and planning.

A size is set under whatever name the config class takes it (``n_embd`` for ``hidden_size``
where its ``attribute_map`` says so); a key the class does not take is left at its default, so
the model stays one its own ``__init__`` checks.
"""
from __future__ import annotations

import inspect

from torch import nn

from workbench.presets import TINY

#: Config keys shrunk, and their values (several names of one size: each family spells it).
SIZES = {
    "num_hidden_layers": TINY["num_layers"], "hidden_size": TINY["hidden"],
    "num_attention_heads": TINY["heads"], "num_key_value_heads": TINY["kv_heads"],
    "head_dim": TINY["head_dim"], "intermediate_size": TINY["ffn"], "ffn_dim": TINY["ffn"],
    "moe_intermediate_size": TINY["expert_ffn"],
    "shared_expert_intermediate_size": TINY["expert_ffn"],
    "num_experts": TINY["experts"], "num_local_experts": TINY["experts"],
    "n_routed_experts": TINY["experts"], "num_experts_per_tok": TINY["experts_per_token"],
    "n_group": 1, "topk_group": 1,  # DeepSeek's expert groups: one group of the 4 experts
    "vocab_size": TINY["vocab"], "max_position_embeddings": TINY["max_positions"],
    # the byte tokenizer's specials (``models/tokenizer.py``): <pad> 0, <s> 1, </s> 2
    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
}


def causal_lm_types() -> list[str]:
    """Every ``model_type`` transformers maps to a causal-LM class, sorted."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def tiny_config(model_type: str):
    """The Hugging Face config of ``tiny:<model_type>`` (eval semantics: its own defaults).

    Raises:
        ValueError: one line naming ``model`` when transformers has no causal LM of that type.
    """
    from transformers import AutoConfig

    if model_type not in causal_lm_types():
        raise ValueError(f"model: tiny:{model_type} names no causal-LM model_type of this "
                         "transformers (see transformers' MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)")
    cls = type(AutoConfig.for_model(model_type))
    takes = inspect.signature(cls.__init__).parameters
    alias = getattr(cls, "attribute_map", {})
    kwargs = {}
    for key, value in SIZES.items():
        name = key if key in takes else alias.get(key)
        if name in takes:
            kwargs[name] = value
    return cls(**kwargs)


def part_counts(model: nn.Module) -> tuple[int, tuple[int, ...], int]:
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
