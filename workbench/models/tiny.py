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

from huggingface_hub.errors import StrictDataclassError

from workbench.presets import TINY

#: What a config class raises for values it rejects (its strict validators raise the second).
_CONFIG_ERRORS = (ValueError, TypeError, StrictDataclassError)

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


#: Config values a family needs beyond ``SIZES`` for its tiny model to build, each with why (the
#: class's own default does not build, or a validator rejects a shrunk size).
CONFIG_QUIRKS: dict[str, tuple[dict, str]] = {
    "gpt_neo": ({"attention_types": [[["global", "local"], 1]]},
                "its per-layer attention kinds are given as [pattern, repeats], not a list"),
    "dbrx": ({"attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0}},
             "its attention reads rope_theta and clip_qkv from attn_config, where published "
             "configs carry them (its default has neither)"),
    "dots1": ({"n_shared_experts": 1}, "its default leaves the shared experts None, which its "
              "MoE multiplies by the expert size (published configs set it)"),
    "lfm2_moe": ({"layer_types": ["conv", "full_attention"]}, "its default names no layer "
                 "types, which its blocks index (published configs list them)"),
    "cohere_compass_text": ({"rope_parameters": {"full_attention": {
        "rope_type": "default", "rope_theta": 10000.0}}}, "its rotary tables are per layer "
        "type and its default gives none (published configs give them)"),
    "reformer": ({"is_decoder": True, "axial_pos_embds_dim": [32, 32],
                  "axial_pos_shape": [16, 32]}, "its causal LM asks for is_decoder, as "
                 "published causal configs set it; its axial positions must sum to the hidden "
                 "size and multiply to the positions"),
    "zaya": ({"num_experts_per_tok": 1}, "its validator takes one expert per token only"),
}


def tiny_config(model_type: str):
    """The Hugging Face config of ``tiny:<model_type>`` (eval semantics: its own defaults).

    Raises:
        ValueError: one line naming ``model`` when transformers has no causal LM of that type,
            or when its causal-LM class takes another config than its type's (a sub-model).
    """
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if model_type not in causal_lm_types():
        raise ValueError(f"model: tiny:{model_type} names no causal-LM model_type of this "
                         "transformers (see transformers' MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)")
    cls = CONFIG_MAPPING[model_type]  # not instantiated: some defaults fail their validators
    _check_causal_lm_config(model_type, cls, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    part = _text_part(cls, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    if part is not None:  # a composite whose causal LM runs one part: that part is shrunk
        key, sub = part
        try:
            return cls(**{key: _shrunk(model_type, sub).to_dict()})
        except _CONFIG_ERRORS as e:
            raise _rejects(model_type, e) from None
    return _shrunk(model_type, cls)


def _rejects(model_type: str, error: Exception) -> ValueError:
    why = " ".join(str(error).split())  # a validator's message spans lines
    return ValueError(f"model: tiny:{model_type}'s config rejects the tiny sizes: {why}")


def _text_part(cls, class_name: str):
    """(key, config class) of the sub-config a composite type's causal-LM class is built from
    (Qwen3.5's text model beside its vision tower), or None."""
    import transformers

    takes = getattr(getattr(transformers, class_name, None), "config_class", cls)
    subs = [(k, c) for k, c in (getattr(cls, "sub_configs", None) or {}).items() if c is takes]
    return subs[0] if takes is not cls and len(subs) == 1 else None


def _shrunk(model_type: str, cls):
    """``cls`` built with the tiny sizes (``SIZES``, ``CONFIG_QUIRKS``)."""
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
    kwargs.update(CONFIG_QUIRKS.get(model_type, ({}, ""))[0])
    try:
        return cls(**kwargs)
    except _CONFIG_ERRORS as e:  # a validator: per-layer lists left at the published depth?
        first = e
    per_layer = _per_layer_lists(cls, kwargs, takes, alias)
    try:
        if per_layer:
            return cls(**kwargs, **per_layer)
    except _CONFIG_ERRORS:
        pass
    raise _rejects(model_type, first)


def _per_layer_lists(cls, kwargs: dict, takes, alias: dict) -> dict:
    """Lists a config gives one entry per layer (``layers_block_type``, ...), at the family's
    default depth, cut to the tiny depth: the first layer of each kind first (so a hybrid
    stack keeps one layer of each where there are as many layers as kinds), then the rest in
    order. Empty when the default config does not build either."""
    layers_key = next((k for k in ("num_hidden_layers", alias.get("num_hidden_layers"))
                       if k in kwargs), None)
    if layers_key is None:
        return {}
    n = kwargs[layers_key]
    try:
        full = cls(**{k: v for k, v in kwargs.items() if k != layers_key})
    except _CONFIG_ERRORS:
        return {}
    depth = getattr(full, layers_key)
    out = {}
    for key, value in vars(full).items():
        if key in kwargs or key not in takes or not isinstance(value, (list, tuple)) \
                or len(value) != depth or depth <= n:
            continue
        firsts = sorted({v: i for i, v in reversed(list(enumerate(value)))}.values())[:n]
        rest = [i for i in range(depth) if i not in firsts][:n - len(firsts)]
        out[key] = [value[i] for i in sorted(firsts + rest)]
    return out


def _check_causal_lm_config(model_type: str, cls, class_name: str) -> None:
    """Refuse, in one line, a type in ``REFUSED_TINY`` (its tiny model cannot be built or run
    as a decoder: MusicGen's decoder is a part of the composite its type names)."""
    import transformers

    if model_type in REFUSED_TINY:
        takes = getattr(getattr(transformers, class_name, None), "config_class", cls)
        part = f" takes a {takes.__name__}, a part of the {cls.__name__} its type names:" \
            if takes is not cls else ""
        raise ValueError(f"model: tiny:{model_type}'s causal LM ({class_name}){part} "
                         f"{REFUSED_TINY[model_type]}")


#: Types whose tiny model is refused, with why.
REFUSED_TINY = {
    **dict.fromkeys(("musicgen", "musicgen_melody"), "its decoder predicts several audio "
                    "codebooks per position (one LM head each), not one token"),
    "zamba": "ties one shared transformer across its hybrid layers, which needs more hybrid "
             "layers than a 2-block model has (and hybrid layers take two masks)",
}


def supported_types() -> list[str]:
    """The model types ``tiny:<model_type>`` (and a folder or hub id of that type) can train
    here: those that passed the check of their parts (``layout.CHECKED``) and that the installed
    transformers knows."""
    from workbench.models.layout import CHECKED

    return sorted(CHECKED & set(causal_lm_types()))
