"""ZO arithmetic on half-precision weights: MeZO as MeZO runs it in bf16 / fp16.

With ``method=mezo``, ``master=compressed`` or ``compressed-sr`` and ``codec=bf16`` or ``fp16``,
each trainable group's flat buffer lives on the device in that dtype (2 B/param, MeZO's
half-precision loading; ``weight_dtype``). Per element, z the same fp32 normals as an fp32 run:
    x <- rn(x + scale z)                     every perturbation (MeZO's ``param.data.add_``)
    x <- round(x - lr (g z + wd x))          the update, computed in fp32, then rounded once:
                                             to nearest (compressed: an update below half an ulp
                                             is lost) or stochastically (compressed-sr: kept in
                                             expectation, the draws seeded per (step, group))
Both roundings are the transfer codecs' own encode (``codecs/wire.py``: the cast, or the SR
kernel on CUDA and its torch path elsewhere), so ``master`` means the same rounding here as in
zo-offload's host format. The fused Triton kernel is fp32-only: z is materialised (4 B per
element of the group, from the kernel's normals on CUDA) and the pass runs as torch ops.
"""
from __future__ import annotations

from typing import Callable

import torch

from workbench.config import RunConfig
from workbench.engine.codecs.wire import HALF, get_codec
from workbench.engine.groups import GroupLayout

HALF_MASTERS = ("compressed", "compressed-sr")
CODEC_OF = {dtype: name for name, dtype in HALF.items()}


def weight_dtype(cfg: RunConfig) -> torch.dtype:
    """The dtype MeZO holds its trainable weights in: the codec's (bf16 / fp16) under
    ``master=compressed|compressed-sr``, else fp32."""
    if cfg.method != "mezo" or cfg.master not in HALF_MASTERS:
        return torch.float32
    return HALF.get(cfg.codec, torch.float32)


def store(x: torch.Tensor, values: torch.Tensor, sr_seed: int | None = None) -> None:
    """x (half, (n,)) <- fp32 ``values`` rounded to nearest, or stochastically with
    ``sr_seed`` (the codec's encode, which writes x's bits in place)."""
    get_codec(CODEC_OF[x.dtype]).encode(values, x.view(torch.uint8), sr_seed=sr_seed)


def perturb(ops, x: torch.Tensor, layout: GroupLayout, seed: int, scale: float,
            out: torch.Tensor) -> None:
    """out <- rn(x + scale z): fp32 arithmetic (z from ``ops.z``), one rounding to out's dtype."""
    z = ops.z(x.numel(), seed, layout.gid, x.device)
    out.copy_(z.mul_(scale).add_(x))


def update(ops, x: torch.Tensor, layout: GroupLayout, upd, sr_seed: int | None = None) -> None:
    """x <- round(x + delta) in place, delta = ``ops.delta`` (the sgd or sign rule, fp32),
    rounded to nearest (also a restore fused as an update: ``step.shift``) or with ``sr_seed``
    stochastically."""
    store(x, ops.delta(x, layout, upd).add_(x), sr_seed)


def updater(ops, sr: bool, seed_of: Callable[[int, int], int]) -> Callable | None:
    """The ``ApplyUpdate`` of MeZO's half weights: None (``ops.update`` rounds to nearest) or,
    with ``sr``, ``update`` seeded by ``seed_of(gid, step seed)`` (``step.step_seed``), so a
    resumed run or a replay rounds exactly as the straight run."""
    if not sr:
        return None
    return lambda x, layout, upd: update(ops, x, layout, upd, seed_of(layout.gid, upd.seed))
