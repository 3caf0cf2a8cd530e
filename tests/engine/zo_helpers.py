"""Small helpers shared by the engine tests."""
from __future__ import annotations

import torch

from workbench.config import RunConfig
from workbench.data.batches import SyntheticData
from workbench.engine import build_engine
from workbench.engine.events import EventBus
from workbench.engine.groups import digest
from workbench.models.build import build_skeleton


def train(cfg: RunConfig, steps: int = 10, bus: EventBus | None = None, batch_size: int = 4):
    """``steps`` ZO steps on synthetic batches; returns (engine, digest, [(L+, L-, g)])."""
    model, source = build_skeleton(cfg.model)
    engine = build_engine(model, source, cfg, torch.device(cfg.device), bus or EventBus())
    data = SyntheticData(model.config.vocab_size, 16)
    out = []
    for t in range(steps):
        batch = data.batch_for_step(t, batch_size, cfg.seed).to(cfg.device)
        o = engine.step(batch, t, cfg.lr, cfg.weight_decay)
        out.append((float(o.loss_plus), float(o.loss_minus), float(o.projected_grad)))
    engine.flush()
    d = digest([f.detach().cpu() for f in engine.state_flats()])
    engine.close()
    return engine, d, out
