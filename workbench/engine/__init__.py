"""The training runtime: engines, streams, kernels and the events they publish.

Never imports telemetry or UI code; listeners subscribe to an ``EventBus``.
"""
from __future__ import annotations

import torch

from workbench.config import RunConfig
from workbench.engine.events import EventBus


def build_engine(model, source, cfg: RunConfig, device: torch.device, bus: EventBus):
    """The engine for ``cfg.method`` over a model skeleton and its weight source."""
    if cfg.method == "mezo":
        from workbench.engine.mezo import MeZOEngine

        return MeZOEngine(model, source, cfg, device, bus)
    if cfg.method == "zo-offload":
        from workbench.engine.offload import ZOOffloadEngine

        return ZOOffloadEngine(model, source, cfg, device, bus)
    raise ValueError(f"method: {cfg.method!r} has no engine")
