"""AdamW on one flat subgroup, as both sides of fo-offload run it, and the records it takes.

Every update, on the CPU worker or on the GPU, is torch's fused AdamW kernel over a subgroup's
flat fp32 (p, m, v) and gradient, with decoupled weight decay only on the decayed runs of the
subgroup (the matrices of each group it overlaps): bit for bit the step ``torch.optim.AdamW``
takes with the same settings.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch


class Segment(NamedTuple):
    """A run [lo, hi) of a subgroup's elements (relative to its start); ``decayed``: AdamW's
    weight decay applies to it (matrices), or not (biases, norms)."""

    lo: int
    hi: int
    decayed: bool


class OptState(NamedTuple):
    """A subgroup's fp32 master weights and Adam moments: three flat tensors of one length on one
    device (host views of the masters, or a GPU slot's or the residents' copies)."""

    p: torch.Tensor
    m: torch.Tensor
    v: torch.Tensor

    def narrow(self, lo: int, hi: int) -> "OptState":
        """Elements [lo, hi) of each."""
        return OptState(self.p[lo:hi], self.m[lo:hi], self.v[lo:hi])


@dataclass(frozen=True)
class AdamW:
    """One step's AdamW settings (the step's lr and weight decay, the run's betas and eps)."""

    lr: float
    weight_decay: float
    beta1: float
    beta2: float
    eps: float


def adamw(state: OptState, g: torch.Tensor, segments: list[Segment], opt: AdamW,
          step_t: torch.Tensor) -> None:
    """torch.optim.AdamW's step on one subgroup (flat fp32 tensors, on the CPU or the GPU), in
    place; ``step_t``: the 0-d step count on the same device."""
    p, m, v = state
    wd = opt.weight_decay
    if wd == 0.0:  # one launch over the whole subgroup
        parts = [(0.0, [(0, p.numel())])]
    else:
        parts = [(wd, [(lo, hi) for lo, hi, d in segments if d]),
                 (0.0, [(lo, hi) for lo, hi, d in segments if not d])]
    for decay, runs in parts:
        if runs:
            torch._fused_adamw_([p[lo:hi] for lo, hi in runs], [g[lo:hi] for lo, hi in runs],
                                [m[lo:hi] for lo, hi in runs], [v[lo:hi] for lo, hi in runs],
                                [], [step_t] * len(runs), lr=opt.lr, beta1=opt.beta1,
                                beta2=opt.beta2, eps=opt.eps, weight_decay=decay,
                                amsgrad=False, maximize=False)


def within(segments: list[Segment], lo: int, hi: int) -> list[Segment]:
    """A subgroup's runs cut to its elements [lo, hi), relative to lo (a slot-sized piece)."""
    return [Segment(max(a, lo) - lo, min(b, hi) - lo, d) for a, b, d in segments
            if min(b, hi) > max(a, lo)]
