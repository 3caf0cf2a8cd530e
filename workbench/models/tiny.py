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
    # multi-head latent attention (DeepSeek-V2/V3 and the types copying it): its own head sizes
    "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": TINY["head_dim"],
    "kv_lora_rank": 32, "q_lora_rank": 48,
    "rotary_dim": TINY["head_dim"],  # GPT-J / CodeGen rotate this many of each head's dims
    # Mamba-2 scans (Falcon-H1, Nemotron-H, Bamba, ...) pad every sequence to a whole chunk:
    # 256 tokens by default, 16x a test batch's length, and most of their reference scan's time
    "chunk_size": 16, "mamba_chunk_size": 16,
    # Gemma 3n/4's per-layer input embeddings: a second table as wide as the vocabulary
    "vocab_size_per_layer_input": TINY["vocab"], "hidden_size_per_layer_input": 16,
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
    if "expand" in takes and "num_heads" in takes and "num_heads" not in kwargs:
        # Mamba-2's state-space heads: hidden x expand = heads x head_dim, checked by its config
        expand = takes["expand"].default
        kwargs["num_heads"] = TINY["hidden"] * expand // TINY["head_dim"]
    if "kv_lora_rank" in takes and "num_key_value_heads" in kwargs:
        # latent attention expands its keys and values to every head: grouping them again
        # (heads / key-value heads) would double them
        kwargs["num_key_value_heads"] = TINY["heads"]
    return cls(**kwargs)


def supported_types() -> list[str]:
    """The model types ``tiny:<model_type>`` (and a folder or hub id of that type) can train
    here: those that passed the check of their parts (``layout.CHECKED``) and that the installed
    transformers knows."""
    from workbench.models.layout import CHECKED

    return sorted(CHECKED & set(causal_lm_types()))
