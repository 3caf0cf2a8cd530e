"""The tiny model of each type has every kind of layer its family has: attention and
state-space, dense and mixture-of-experts, sliding and full attention, as its published depth
lays them out, and its attention windows are shorter than the sequences the per-type checks
run (so a sliding layer masks differently from a full one there).

The reference is independent of the tiny config's cuts: the same family built at its own
default depth (the tiny widths, on the meta device), its blocks told apart by the classes of
their modules and the window each attention module keeps. A representative set runs by
default; every supported type is ``slow``."""
from __future__ import annotations

import warnings

import pytest
import torch

from workbench.models import tiny
from workbench.models.layout import _block_list
from workbench.models.tiny import WINDOW, supported_types, tiny_config

#: Module attributes that tell one kind of attention layer from another.
KIND_ATTRS = ("sliding_window", "is_sliding", "layer_type", "attention_type",
              "use_sliding_window", "window_size")
#: The families the issue found short of a kind (and gpt_oss's 128-token window), and one of
#: each other sort of stack.
REPRESENTATIVE = ["jamba", "granitemoehybrid", "qwen3_next", "recurrent_gemma", "lfm2",
                  "gemma3_text", "cohere2", "gpt_oss", "deepseek_v3", "nemotron_h"]
#: The per-type checks' sequence lengths (tests/models/test_any_decoder.py): 16 and 17 tokens.
SHORTEST_CHECKED = 16


def block_kinds(config) -> list[frozenset[str]]:
    """A kind per block of ``config``'s model (built on the meta device): its modules' class
    names, each with the window attributes it has."""
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(config)
    kinds = []
    for block in _block_list(model)[1]:
        names = set()
        for module in block.modules():
            tag = type(module).__name__
            for attr in KIND_ATTRS:
                value = getattr(module, attr, None)
                if value is not None and isinstance(value, (bool, int, str)):
                    tag += f"[{attr}={value}]"
            names.add(tag)
        kinds.append(frozenset(names))
    return kinds


def default_depth_config(model_type: str):
    """``tiny:<model_type>``'s sizes at the family's own default depth (no layer count set,
    no per-layer lists cut, no quirk changing which layers are which)."""
    sizes, quirks = dict(tiny.SIZES), dict(tiny.CONFIG_QUIRKS)
    del sizes["num_hidden_layers"]
    own = quirks.get(model_type)
    if own is not None:  # a quirk that sets which layers are which is the thing under test
        keep = {k: v for k, v in own[0].items()
                if k not in LAYER_PLAN_KEYS and "layer" not in k and "block" not in k}
        quirks[model_type] = (keep, own[1])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tiny, "SIZES", sizes)
        mp.setattr(tiny, "CONFIG_QUIRKS", quirks)
        mp.setattr(tiny, "_per_layer_lists", lambda *a: {})
        return tiny_config(model_type)


#: Quirk keys that place kinds of layer (left out of the default-depth reference).
LAYER_PLAN_KEYS = ("attn_layer_period", "attn_layer_offset", "expert_layer_period",
                   "expert_layer_offset", "first_k_dense_replace")


def check_kinds(model_type: str) -> None:
    config = tiny_config(model_type)
    have = set(block_kinds(config))
    try:
        reference = default_depth_config(model_type)
    except ValueError:  # the family's default depth does not build with the tiny widths
        pytest.skip(f"{model_type}: its default depth does not build with the tiny sizes")
    want = set(block_kinds(reference))
    missing = [sorted(k - frozenset.intersection(*(want | have))) for k in want - have]
    assert not missing, f"{model_type}: the tiny model lacks these kinds of layer: {missing}"
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key in tiny.WINDOW_KEYS:
        window = getattr(text, key, None)
        if isinstance(window, int) and not isinstance(window, bool):
            assert window <= WINDOW < SHORTEST_CHECKED, (model_type, key, window)


@pytest.mark.parametrize("model_type", REPRESENTATIVE)
def test_representative_tiny_models_have_every_kind_of_layer(model_type):
    check_kinds(model_type)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", supported_types())
def test_every_tiny_model_has_every_kind_of_layer(model_type):
    check_kinds(model_type)


def test_jamba_has_its_attention_layer_and_a_window_is_shorter_than_a_sequence():
    """The kinds by name, for the families the check above found short: Jamba's attention
    layer beside its Mamba ones, full beside sliding attention, RecurrentGemma's attention."""
    jamba = tiny_config("jamba")
    assert sorted(set(jamba.layers_block_type)) == ["attention", "mamba"]
    assert set(tiny_config("gemma3_text").layer_types) == {"sliding_attention", "full_attention"}
    assert set(tiny_config("qwen3_next").layer_types) == {"linear_attention", "full_attention"}
    assert tiny_config("recurrent_gemma").block_types == ["recurrent", "attention"]
    assert tiny_config("gpt_oss").sliding_window == WINDOW


@pytest.mark.parametrize("model_type", ["jamba", "gemma3_text"])
def test_an_exported_hybrid_runs_transformers_cached_forward_and_generate(model_type, tmp_path,
                                                                          one_thread):
    """Tiny Jamba with its attention layer (it had none, and transformers' default forward
    failed on the export: "get_seq_length can only be called on Attention layers") and Gemma
    3 with full beside sliding layers, exported by the command line: the cached forward and
    ``generate`` agree with the cacheless forward (the grid runs this for every type)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
    from test_any_decoder import check_export

    check_export(f"tiny:{model_type}", tmp_path, cli=True)
