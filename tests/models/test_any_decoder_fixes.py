"""What the grid of ``test_any_decoder.py`` found for the types it failed, checked fast: per-layer
config lists cut to the tiny depth, config quirks, one-line refusals, LoRA on GPT-2's ``Conv1D``,
masks a model always materialises, rotary tables per layer type, a norm run on both sides of the
blocks."""
from __future__ import annotations

import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM

from workbench.config import ConfigError
from workbench.models import layout
from workbench.models.adapter import BlockAdapter, Inputs
from workbench.models.build import build_skeleton, check_model_folder
from workbench.models.lora import inject_lora, targets_for
from workbench.models.tiny import tiny_config


def _ids():
    ids = torch.randint(4, 260, (3, 17), generator=torch.Generator().manual_seed(1))
    padded = torch.ones_like(ids)
    padded[1, 11:] = 0
    return ids, padded


@pytest.mark.parametrize("model_type", ["gemma3_text", "laguna", "mellum"])
def test_mixed_layer_types_get_their_own_rotary_tables(model_type):
    """Sliding and full layers with rotary bases of their own (gemma3: 10k and 1M): each block
    gets its type's table, not block 0's (the tiny model's 2 layers are one type; a published
    one mixes them)."""
    config = tiny_config(model_type)
    config.layer_types = ["sliding_attention", "full_attention"]
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(config).eval()
    ids, padded = _ids()
    for mask in (torch.ones_like(ids), padded):
        ref = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        out = BlockAdapter(model).forward(ids, mask)
        assert torch.allclose(out[mask.bool()], ref[mask.bool()], atol=1e-5, rtol=0)


def test_conv1d_projections_are_lora_targets():
    """GPT-2's projections are transformers' Conv1D (weight (in, out)): its fused c_attn is the
    default target, wrapped by peft with fan_in_fan_out."""
    skeleton, _ = build_skeleton("tiny:gpt2")
    assert targets_for(skeleton, "") == ["c_attn"]
    assert targets_for(skeleton, "c_attn,c_proj") == ["c_attn", "c_proj"]
    inject_lora(skeleton, 4, 8.0, "")
    attn = skeleton.transformer.h[0].attn.c_attn
    assert attn.fan_in_fan_out and attn.lora_A["default"].weight.shape == (4, 64)
    assert attn.lora_B["default"].weight.shape == (192, 4)


def test_per_layer_lists_are_cut_to_the_tiny_depth():
    """A config that lists a kind per layer at its published depth (Zamba2's 54) is cut to the
    tiny depth keeping one layer of each kind; GPT-Neo's [pattern, repeats] is a quirk."""
    assert tiny_config("zamba2").layers_block_type == ["linear_attention", "hybrid"]
    assert tiny_config("gpt_neo").attention_layers == ["global", "local"]
    assert tiny_config("dbrx").attn_config.rope_theta == 10000.0
    assert set(layout.CHECKED) >= {"gpt_neo", "dbrx", "dots1", "cohere_compass_text"}


@pytest.mark.parametrize("model_type, why", [
    ("musicgen", "several audio codebooks"), ("zamba", "shared transformer"),
    ("gemma4_assistant", "config rejects the tiny sizes")])
def test_a_tiny_model_that_cannot_be_built_is_refused_in_one_line(model_type, why):
    with pytest.raises(ConfigError) as e:
        check_model_folder(f"tiny:{model_type}")
    (line,) = e.value.problems
    assert line.startswith(f"model: tiny:{model_type}") and why in line and "\n" not in line


@pytest.mark.parametrize("model_type", ["deepseek_v32", "doge"])
def test_a_mask_the_model_always_materialises_reaches_its_blocks(model_type):
    """A sparse-attention indexer (DeepSeek-V3.2) or a dynamic mask (Doge) reads the 4D mask,
    which the model's own code builds even where SDPA's causal path would do."""
    skeleton, _ = build_skeleton(f"tiny:{model_type}")
    adapter = BlockAdapter(skeleton)
    ids, _ = _ids()
    _, ctx = adapter.embed(Inputs(ids, torch.ones_like(ids), padded=False))
    assert isinstance(ctx.kwargs["attention_mask"], torch.Tensor)
    assert ctx.kwargs["attention_mask"].dim() == 4


def test_a_weightless_norm_before_and_after_the_blocks_is_in_the_head():
    """NanoChat's forward runs its parameter-free norm before the blocks and again after."""
    skeleton, _ = build_skeleton("tiny:nanochat")
    found = layout.find_layout(skeleton)
    assert found.head == [skeleton.model.norm, skeleton.lm_head]


@pytest.mark.parametrize("model_type", ["xglm", "lara_mini", "bloom", "recurrent_gemma"])
def test_the_pieces_compute_the_models_own_logits(model_type):
    """XGLM hands its blocks the mask positionally; LaraMini's linear-attention layers get no
    rotary table; BLOOM builds ALiBi from the 2D mask; RecurrentGemma soft-caps its logits."""
    skeleton, _ = build_skeleton(f"tiny:{model_type}")
    torch.manual_seed(0)
    with torch.no_grad():
        for p in skeleton.parameters():
            p.normal_(0.0, 0.05) if p.dim() >= 2 else None
    ids, padded = _ids()
    for mask in (torch.ones_like(ids), padded):
        ref = skeleton(input_ids=ids, attention_mask=mask, use_cache=False).logits
        out = BlockAdapter(skeleton).forward(ids, mask)
        assert torch.allclose(out[mask.bool()], ref[mask.bool()], atol=1e-5, rtol=0)


def test_a_hyper_connection_head_gets_the_last_token_with_its_streams(monkeypatch):
    """DeepSeek-V4's head mixes its 4 residual streams (B, T, 4, D) after its blocks, in the
    order its forward calls them (norm(hc_head(h))); the last-token logits are the full ones'.
    Its compressed-attention layers have no mask here yet (the type is refused), so the head
    is checked on a stack of its sliding layers only."""
    config = tiny_config("deepseek_v4")
    config.layer_types = ["sliding_attention"] * config.num_hidden_layers
    monkeypatch.setattr(layout, "CHECKED", layout.CHECKED | {"deepseek_v4"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        skeleton = AutoModelForCausalLM.from_config(config)
    adapter = BlockAdapter(skeleton)
    assert [type(m).__name__ for m in adapter.head_modules][:2] == [
        "DeepseekV4HyperHead", "DeepseekV4RMSNorm"]
    ids, padded = _ids()
    hidden, ctx = adapter.embed(Inputs(ids, padded))
    for block in adapter.blocks:
        hidden = adapter.run_block(block, hidden, ctx)
    full = adapter.head(hidden)[torch.arange(3), ctx.last_index]
    assert torch.allclose(adapter.head(hidden, ctx), full, atol=1e-6, rtol=0)


def test_a_composite_type_shrinks_the_part_its_causal_lm_runs():
    """Qwen3.5's causal LM runs the text model of its text + vision config: that part is the
    one made tiny."""
    config = tiny_config("qwen3_5")
    assert type(config).__name__ == "Qwen3_5Config"
    assert config.text_config.hidden_size == 64 and config.text_config.num_hidden_layers == 2


@pytest.mark.parametrize("model_type, why", [
    ("dory", "recurrent loops"), ("inkling2_text", "block attention residuals"),
    ("zaya", "router's hidden states")])
def test_a_model_that_is_not_one_pass_through_its_blocks_is_refused_in_one_line(
        model_type, why):
    with pytest.raises(ConfigError) as e:
        check_model_folder(f"tiny:{model_type}")
    (line,) = e.value.problems
    assert line.startswith(f"model: tiny:{model_type}") and why in line and "\n" not in line


def test_a_part_that_needs_a_missing_library_is_refused_in_one_line():
    """Gemma 3n's vision tower is timm's: without timm, one line, not an ImportError."""
    import importlib.util

    if importlib.util.find_spec("timm") is not None:
        pytest.skip("timm is installed")
    with pytest.raises(ConfigError) as e:
        check_model_folder("tiny:gemma3n")
    (line,) = e.value.problems
    assert line.startswith("model: tiny:gemma3n") and "timm" in line and "\n" not in line
