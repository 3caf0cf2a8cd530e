"""Helpers shared by the export tests: a run kept alive long enough to read its final weights,
and the workbench's own forward of given weights (the reference an export must equal)."""
from __future__ import annotations

from pathlib import Path

import torch

from workbench.config import RunConfig
from workbench.engine.peft import block_adapter, model_groups
from workbench.models.adapter import BlockAdapter
from workbench.models.build import build_skeleton
from workbench.models.generate import adapter_forward, greedy_decode
from workbench.recipes.train import TrainRecipe
from workbench.telemetry.record import RunRecord

#: Settings of the short runs the export tests train (synthetic batches: no tokenizer needed).
SHORT = dict(steps=3, lr=2e-3, batch_size=4, seq_len=16, data="synthetic", sample_hz=0.0,
             eval_every=0)


def train_live(cfg: RunConfig, out: Path) -> tuple[RunRecord, list[torch.Tensor]]:
    """Run ``cfg`` into ``out``; returns its record and its engine's final weights (fp32 CPU
    copies of ``state_flats()``, read before the engine is closed)."""
    recipe = TrainRecipe(cfg, out, progress=False)
    try:
        recipe.setup()
        recipe.train()
        rec = recipe.save()
        flats = [f.detach().to("cpu", torch.float32).clone() for f in recipe.engine.state_flats()]
    finally:
        recipe.cleanup()
    return rec, flats


def batch(vocab: int = 260, rows: int = 3, width: int = 12, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab, (rows, width), generator=gen)


def workbench_model(cfg: RunConfig, flats: list[torch.Tensor],
                    cast: torch.dtype | None = None) -> BlockAdapter:
    """The block adapter (the engines' own model code) of ``cfg``'s model with the trainable
    groups set to ``flats`` (rounded through ``cast`` first, if given) and, for an adapter run,
    the frozen base as the run built it."""
    model, source = build_skeleton(cfg.model)
    adapter = block_adapter(model, cfg)
    _, trainable = model_groups(adapter, source, cfg, torch.device("cpu"))
    for group, flat in zip(trainable, flats):
        group.load(flat if cast is None else flat.to(cast).float())
    return adapter


def workbench_logits(cfg: RunConfig, flats: list[torch.Tensor], ids: torch.Tensor,
                     cast: torch.dtype | None = None) -> torch.Tensor:
    """Logits (B, T, V) of ``workbench_model``'s forward."""
    with torch.no_grad():
        return workbench_model(cfg, flats, cast).forward(ids, torch.ones_like(ids))


def workbench_greedy(cfg: RunConfig, flats: list[torch.Tensor], prompt: list[int], new: int,
                     eos: int, pad: int) -> list[int]:
    """The workbench's own greedy continuation of ``prompt`` (``models/generate.py``)."""
    adapter = workbench_model(cfg, flats)
    return greedy_decode(adapter_forward(adapter), adapter.head, [prompt], new, eos, pad)[0]


def hf_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float()
