"""The training runtime: engines, streams, kernels and the events they publish.

Every engine implements ``Engine`` (``protocol.py``); the ZO arithmetic they share is
``zo/step.py``. Never imports telemetry or UI code; listeners subscribe to an ``EventBus``.
"""
from __future__ import annotations

import torch

from workbench.config import RunConfig
from workbench.engine.events import EventBus
from workbench.engine.objective import Objective
from workbench.engine.protocol import Engine, StepOutput

__all__ = ["Engine", "StepOutput", "build_engine"]


def build_engine(model, source, cfg: RunConfig, device: torch.device, bus: EventBus,
                 share=None, *, objective: Objective | None = None) -> Engine:
    """The engine for ``cfg.method`` over a model skeleton and its weight source (each
    implements ``Engine``, the contract in ``protocol.py``), training ``objective`` (the task's;
    default: ``cfg``'s, built without a tokenizer, which trains alike but cannot decode).
    ``share``: a ``shared_host.NodeShare`` (data parallel, streamed methods: one host copy per
    node)."""
    engine = _engine(model, source, cfg, device, bus, share)
    if objective is not None:
        engine.objective = objective
    return engine


def _engine(model, source, cfg: RunConfig, device: torch.device, bus: EventBus,
            share=None) -> Engine:
    if cfg.method == "mezo":
        from workbench.engine.zo.mezo import MeZOEngine

        return MeZOEngine(model, source, cfg, device, bus)
    if cfg.method == "zo-offload" and cfg.peft == "lora":
        from workbench.engine.zo.lora_offload import LoRAOffloadEngine

        return LoRAOffloadEngine(model, source, cfg, device, bus, share)
    if cfg.method == "zo-offload":
        from workbench.engine.zo.offload import ZOOffloadEngine

        return ZOOffloadEngine(model, source, cfg, device, bus, share)
    if cfg.method == "fo":
        from workbench.engine.fo.resident import FOEngine

        return FOEngine(model, source, cfg, device, bus)
    if cfg.method == "fo-offload":
        from workbench.engine.fo.offload import FOOffloadEngine

        return FOOffloadEngine(model, source, cfg, device, bus)
    if cfg.method == "forward-grad":
        from workbench.engine.zo.forward_grad import ForwardGradEngine, LoRAForwardGradEngine

        cls = LoRAForwardGradEngine if cfg.peft == "lora" else ForwardGradEngine
        return cls(model, source, cfg, device, bus, share)
    raise ValueError(f"method: {cfg.method!r} has no engine")
