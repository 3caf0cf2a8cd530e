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
    """``steps`` steps on synthetic batches; returns (engine, digest, [(loss, g, L+, L-)])
    (L+ / L- only for ZO methods)."""
    model, source = build_skeleton(cfg.model)
    engine = build_engine(model, source, cfg, torch.device(cfg.device), bus or EventBus())
    data = SyntheticData(model.config.vocab_size, 16)
    out = []
    for t in range(steps):
        batch = data.batch_for_step(t, batch_size, cfg.seed).to(cfg.device)
        o = engine.step(batch, t, cfg.lr, cfg.weight_decay)
        out.append(tuple(float(x) for x in (o.loss, o.projected_grad, o.loss_plus, o.loss_minus)
                         if x is not None))
    engine.flush()
    d = digest([f.detach().cpu() for f in engine.state_flats()])
    engine.close()
    return engine, d, out
