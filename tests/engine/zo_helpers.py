"""Small helpers shared by the engine tests."""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

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


#: (overlap, reuse_buffers, fused_update, resident_blocks) combinations checked against MeZO.
KNOBS = list(itertools.product([True, False], [True, False], [True, False], [0, 2]))


def mezo_reference(model: str, device: str = "cpu"):
    """The MeZO run every zo-offload variant must equal: (config, (digest, losses))."""
    cfg = RunConfig(model=model, method="mezo", device=device, lr=5e-3, weight_decay=0.1)
    return cfg, train(cfg)[1:]


def assert_offload_equals_mezo(reference, overlap, reuse, fused, resident) -> None:
    """zo-offload with these knobs ends with MeZO's losses and parameter digest, bit for bit."""
    cfg, (ref_digest, ref_losses) = reference
    cfg = cfg.replace(method="zo-offload", overlap=overlap, reuse_buffers=reuse,
                      fused_update=fused, resident_blocks=resident)
    _, d, losses = train(cfg)
    assert losses == ref_losses
    assert d == ref_digest


def run_under_triton_interpreter(script: str) -> None:
    """Run ``script`` in a fresh process with TRITON_INTERPRET=1 (kernels on CPU tensors); it
    must print "ok" last."""
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith("ok")
