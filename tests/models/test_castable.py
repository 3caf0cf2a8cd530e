"""Which block matrices compute-dtype slots may hold pre-cast (``models/castable.py``): a model
with a matrix autocast may not cast keeps fp32 slots under ``auto``, is refused under
``slot_dtype=compute``, and the planner plans what the engine builds."""
from __future__ import annotations

import pytest
import torch

from workbench.config import ConfigError, RunConfig
from workbench.engine.groups import build_layouts
from workbench.engine.stream.blocks import exact_in_compute
from workbench.models.adapter import BlockAdapter
from workbench.models.build import build_skeleton
from workbench.models.castable import model_uncast, uncast_entries, uncast_matrices
from workbench.models.shape import shape_of
from workbench.plan.zo import transfer_kind

SR = dict(method="zo-offload", codec="bf16", master="compressed-sr", amp="bf16")


def _blocks(model: str):
    return build_layouts(BlockAdapter(build_skeleton(model)[0]))[1]


@pytest.mark.parametrize("model", ["tiny-opt", "tiny-llama", "tiny:gpt2", "tiny:phi3"])
def test_dense_blocks_are_linear_weights_only(model):
    assert uncast_entries(_blocks(model)) == [] and model_uncast(model) == ()


@pytest.mark.parametrize("model, name", [("tiny:mixtral", "experts.gate_up_proj"),
                                         ("tiny:qwen3_moe", "experts.down_proj"),
                                         ("tiny:falcon_h1", "conv1d.weight")])
def test_experts_and_convolutions_are_not(model, name):
    found = uncast_entries(_blocks(model))
    assert any(n.endswith(name) for n in found)
    assert any(n.endswith(name) for n in model_uncast(model))
    assert uncast_matrices([torch.nn.Linear(2, 2), torch.nn.Conv1d(2, 2, 3)]) == ["weight"]


def test_auto_keeps_fp32_slots_and_compute_is_refused_in_one_line():
    layouts = _blocks("tiny:mixtral")
    assert not exact_in_compute(RunConfig(model="tiny:mixtral", slot_dtype="auto", **SR),
                                layouts)
    with pytest.raises(ConfigError, match=r"^slot_dtype: compute holds every block matrix "
                                          r"pre-cast, and model.layers.0.mlp.gate.weight is not a Linear .* use slot_dtype=fp32"):
        exact_in_compute(RunConfig(model="tiny:mixtral", slot_dtype="compute", **SR), layouts)
    assert exact_in_compute(RunConfig(model="tiny-llama", slot_dtype="compute", **SR),
                            _blocks("tiny-llama"))


@pytest.mark.parametrize("model, kind", [("llama-3.1-8b", "compute"), ("opt-13b", "compute"),
                                         ("mixtral-8x22b", "sr"), ("nemotron-h-8b", "sr"),
                                         ("deepseek-v3", "sr")])
def test_the_planner_plans_the_slots_the_engine_builds(model, kind):
    shape = shape_of(model)  # the planner's, torch-free for a preset
    assert shape.uncast == bool(model_uncast(model))  # as found on the built model
    assert transfer_kind(RunConfig(model=model, device="cuda", **SR), shape) == kind
    assert transfer_kind(RunConfig(model=model, device="cuda", slot_dtype="compute",
                                   **SR), shape) == "compute"  # explicit: the engine refuses it
