"""The training runtime: engines, streams, kernels and the events they publish.

Every engine implements ``Engine`` (``protocol.py``); the ZO arithmetic they share is
``zo/step.py``. The rooms, lowest first (``tests/test_layers.py`` gives each its floor):
``rng/`` (Philox, in torch and Triton) and ``device/`` (pinned memory, CUDA streams, a node's
shared host copy) with the small shared facts (events, groups, precision, kernels); ``codecs/``
(the formats weights travel and rest in); storage and checkpoints; ``zo/`` (the ZO arithmetic
only: perturbations, the step, estimates, stateful rules); peft, snapshots and the whole-model
holder; ``stream/`` (moving blocks between host and GPU, and the streamed holders); ``fo/``
(first-order parts); ``methods/`` (each method: a holder composed with a rule, and the replay).
Never imports telemetry or UI code; listeners subscribe to an ``EventBus``. Asks
``workbench.plan`` for its decisions (fo-offload's placement, slot sizes).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from workbench.config import RunConfig
from workbench.engine.events import EventBus
from workbench.engine.objective import Objective
from workbench.engine.protocol import Engine, StepOutput

if TYPE_CHECKING:
    from workbench.engine.fo.parts import Measure

__all__ = ["Engine", "StepOutput", "build_engine"]


def build_engine(model, source, cfg: RunConfig, device: torch.device, bus: EventBus,
                 share=None, *, objective: Objective | None = None,
                 measure: "Measure | None" = None) -> Engine:
    """The engine for ``cfg.method`` over a model skeleton and its weight source (each
    implements ``Engine``, the contract in ``protocol.py``).

    Args:
        objective: what the loss is (the task's; default: ``cfg``'s, built without a
            tokenizer, which trains alike but cannot decode).
        share: a ``device.shared_host.NodeShare`` (data parallel, streamed methods: one host
            copy per node).
        measure: fo-offload only, and needed there: how it measures the rates it places its
            subgroups with (``workbench.calibrate.fo.measure``).

    Raises:
        ValueError: fo-offload without ``measure``; a method with no engine.
    """
    if cfg.method == "mezo":
        from workbench.engine.methods.mezo import MeZOEngine

        return MeZOEngine(model, source, cfg, device, bus, objective)
    if cfg.method == "zo-offload" and cfg.peft == "lora":
        from workbench.engine.methods.lora_offload import lora_offload_engine

        return lora_offload_engine(model, source, cfg, device, bus, share, objective)
    if cfg.method == "zo-offload":
        from workbench.engine.methods.zo_offload import zo_offload_engine

        return zo_offload_engine(model, source, cfg, device, bus, share, objective)
    if cfg.method == "fo":
        from workbench.engine.methods.fo import FOEngine

        return FOEngine(model, source, cfg, device, bus, objective)
    if cfg.method == "fo-offload":
        from workbench.engine.methods.fo_offload import FOOffloadEngine

        if measure is None:
            raise ValueError("method: fo-offload places its optimizer subgroups with measured "
                             "rates; pass measure=workbench.calibrate.fo.measure")
        return FOOffloadEngine(model, source, cfg, device, bus, measure, objective)
    if cfg.method == "forward-grad":
        from workbench.engine.methods.forward_grad import forward_grad_engine

        return forward_grad_engine(model, source, cfg, device, bus, share, objective)
    raise ValueError(f"method: {cfg.method!r} has no engine")
