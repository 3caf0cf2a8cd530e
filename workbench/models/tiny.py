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
    # BART-likes' causal LM is their decoder, while their num_hidden_layers names the encoder's
    # depth (which transformers sizes their cache by): both tiny, as in published configs
    "decoder_layers": TINY["num_layers"],
    "num_attention_heads": TINY["heads"], "num_key_value_heads": TINY["kv_heads"],
    "head_dim": TINY["head_dim"], "intermediate_size": TINY["ffn"], "ffn_dim": TINY["ffn"],
    "moe_intermediate_size": TINY["expert_ffn"],
    "shared_expert_intermediate_size": TINY["expert_ffn"],
    "shared_experts_intermediate_size": TINY["expert_ffn"],
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
    # Families whose kinds of layer follow counts or periods rather than a list per layer
    # (which ``_per_layer_lists`` cuts): set so every kind the published depth has is there.
    "jamba": ({"num_hidden_layers": 3, "attn_layer_period": 3, "attn_layer_offset": 2,
               "expert_layer_period": 2, "expert_layer_offset": 1},
              "its attention layer comes every 8th from the 5th: none in 2 layers (Mamba dense, "
              "Mamba MoE, attention dense: its three kinds)"),
    "deepseek_v3": ({"first_k_dense_replace": 1}, "its first 3 layers are dense: no routed "
                    "experts in 2 layers"),
    "afmoe": ({"num_hidden_layers": 3, "layer_types": [
        "sliding_attention", "sliding_attention", "full_attention"]}, "its first layer is "
        "dense, then experts under sliding and full attention: three kinds"),
    "flint": ({"num_hidden_layers": 3, "mlp_only_layers": [0], "layer_types": [
        "full_attention", "sliding_attention", "full_attention"]}, "its first 2 layers are "
        "dense, then experts under sliding and full attention: three kinds"),
    "bamba": ({"attn_layer_indices": [1]}, "its default places no attention layer (published "
              "configs do: Bamba-9B's at 9, 18, 27), and transformers' cache then fails"),
    "granitemoehybrid": ({"layer_types": ["linear_attention", "full_attention"]}, "its default "
                         "has Mamba layers only (published configs, Granite-4.0-H's, mix in "
                         "attention), and transformers' cache then fails"),
    "dots3_note_text": ({"swa_num_attention_heads": 4, "swa_num_key_value_heads": 4,
                         "swa_q_lora_rank": 48, "swa_kv_lora_rank": 32, "swa_head_dim": 16,
                         "swa_qk_nope_head_dim": 8, "swa_v_head_dim": 16}, "its sliding "
                        "layers take their attention sizes under swa_ names (64 heads of 256)"),
    "recurrent_gemma": ({"block_types": ["recurrent", "attention"]}, "its layers cycle "
                        "recurrent, recurrent, attention: no attention in 2 layers"),
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
    kwargs.update(_short_windows(cls, kwargs, takes))
    try:
        cls(**kwargs)
    except _CONFIG_ERRORS as e:  # a validator: per-layer lists left at the published depth?
        first = e
    else:
        first = None
    per_layer = _per_layer_lists(cls, kwargs, takes, alias)
    try:
        # every kind of layer the family has, where its config lists a kind per layer
        return cls(**{**kwargs, **per_layer})
    except _CONFIG_ERRORS as e:
        if first is None:
            raise _rejects(model_type, e) from None
    raise _rejects(model_type, first)


#: The tiny attention window: shorter than the sequences the checks run (16-17 tokens), so a
#: sliding layer masks differently from a full one there.
WINDOW = 8
#: Config keys that give an attention window, by family (the same length under other names).
WINDOW_KEYS = ("sliding_window", "window_size", "sliding_window_size", "attention_window_size")


def _short_windows(cls, kwargs: dict, takes) -> dict:
    """``WINDOW`` for each window key whose default is a longer window (a window the family
    leaves off, None, stays off)."""
    try:
        defaults = cls(**kwargs)
    except _CONFIG_ERRORS:
        defaults = None
    out = {}
    for key in WINDOW_KEYS:
        if key in kwargs or key not in takes:
            continue
        value = getattr(defaults, key, takes[key].default)
        if isinstance(value, int) and not isinstance(value, bool) and value > WINDOW:
            out[key] = WINDOW
    return out


def _per_layer_lists(cls, kwargs: dict, takes, alias: dict) -> dict:
    """Lists a config gives one entry per layer (``layers_block_type``, ``layer_types``, ...),
    at the family's default depth, cut to a tiny depth that keeps every kind of layer: the
    first layer of each kind (the entries of all the lists at one index), then the next
    layers in order up to the tiny depth; the depth is raised to the number of kinds where
    there are more kinds. Empty when the default config has no such list, or does not build."""
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
    lists = {key: value for key, value in vars(full).items()
             if key not in kwargs and key in takes and isinstance(value, (list, tuple))
             and len(value) == depth and depth > n}
    if not lists:
        return {}
    kinds = [tuple(str(v[i]) for v in lists.values()) for i in range(depth)]
    firsts = sorted({k: i for i, k in reversed(list(enumerate(kinds)))}.values())
    rest = [i for i in range(depth) if i not in firsts][:max(n - len(firsts), 0)]
    keep = sorted(firsts + rest)
    out = {key: [value[i] for i in keep] for key, value in lists.items()}
    if len(keep) != n:
        out[layers_key] = len(keep)
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
