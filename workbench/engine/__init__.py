"""The training runtime: engines, streams, kernels and the events they publish.

Never imports telemetry or UI code; listeners subscribe to an ``EventBus``.
"""
from __future__ import annotations

import torch

from dataclasses import dataclass

from workbench.config import RunConfig
from workbench.engine.events import EventBus


@dataclass
class StepOutput:
    """What a training step returns: 0-d device tensors, read on the host later (never inside
    the step). ZO methods fill the projected gradient and both perturbed losses."""

    loss: torch.Tensor
    projected_grad: torch.Tensor | None = None
    loss_plus: torch.Tensor | None = None
    loss_minus: torch.Tensor | None = None


# Every engine offers: step(batch, step, lr, wd) -> StepOutput; flush() (apply anything
# pending); predict(batch) -> (B, 2) label-word logits; state_flats() / load_state_flats() in
# canonical group order; gpu_param_bytes(); close(); and the attributes timer (OpTimer),
# bytes_h2d / bytes_d2h (running totals) and streaming (bool).


def build_engine(model, source, cfg: RunConfig, device: torch.device, bus: EventBus):
    """The engine for ``cfg.method`` over a model skeleton and its weight source."""
    if cfg.method == "mezo":
        from workbench.engine.mezo import MeZOEngine

        return MeZOEngine(model, source, cfg, device, bus)
    if cfg.method == "zo-offload":
        from workbench.engine.offload import ZOOffloadEngine

        return ZOOffloadEngine(model, source, cfg, device, bus)
    if cfg.method == "fo":
        from workbench.engine.fo import FOEngine

        return FOEngine(model, source, cfg, device, bus)
    if cfg.method == "fo-offload":
        from workbench.engine.fo_offload import FOOffloadEngine

        return FOOffloadEngine(model, source, cfg, device, bus)
    if cfg.method == "forward-grad":
        from workbench.engine.forward_grad import ForwardGradEngine

        return ForwardGradEngine(model, source, cfg, device, bus)
    raise ValueError(f"method: {cfg.method!r} has no engine")
