"""HiZOO (Zhao et al., ICLR 2025): ZO-SGD preconditioned by a diagonal Hessian estimate H.

A step at w with the group's H (one per weight, 1 at the start) and seed s, per element:
    pass 0 (clean)  w                                  -> L0
    pass 1          p = w + eps z / sqrt(H)            -> L+
    pass 2          m = p - 2 eps z / sqrt(H)          -> L-
    restore         r = m + eps z / sqrt(H)   (not bit-equal to w, as in MeZO)
Coefficients (``coefficients``): g = (L+ - L-) / 2 eps and the curvature c = |L+ + L- - 2 L0|
/ (2 eps^2). The update (pending until the next step's first visit of the group, as every
rule's), with alpha = ``hessian_smooth``:
    H' = (1 - alpha) H + alpha c H z^2
    w <- w - lr (g z / sqrt(H') + wd w)      (wd on the decayed elements only)
The reference code (Yanjun-Zhao/HiZOO, ``trainer.py``) decays every parameter in this step
(biases and norms too); the workbench decays what every other rule decays.

The state kept per weight is D = H - 1 (zero at the start, like every rule's state), updated
as D' = D + (1 + D) alpha (c z^2 - 1): with the paper's alpha of 1e-8 H moves by ~1e-8 per
step, which fp32 H (and the master's bf16 state under compressed-sr) would round away, while
D keeps it. Each operation materialises z and one more group-sized fp32 temporary (8 B per
element of the group).
"""
from __future__ import annotations

import torch

from workbench.engine.groups import GroupLayout


def coefficients(l0: torch.Tensor, plus: torch.Tensor, minus: torch.Tensor,
                 eps: float) -> torch.Tensor:
    """(2,) fp32 device tensor (g, c): the projected gradient (L+ - L-) / 2 eps and the
    curvature |L+ + L- - 2 L0| / (2 eps^2) along the step's direction."""
    g = (plus - minus) / (2 * eps)
    c = (plus + minus - 2 * l0).abs() / (2 * eps * eps)
    return torch.stack([g, c]).float()


def perturb(ops, x: torch.Tensor, layout: GroupLayout, seed: int, scale: float,
            state: torch.Tensor) -> None:
    """x <- x + scale z / sqrt(H) in place (H = 1 + ``state``)."""
    u = ops.z(x.numel(), seed, layout.gid, x.device)
    u.div_(state[:x.numel()].add(1).sqrt_())
    x.add_(u, alpha=scale)


def update(ops, x: torch.Tensor, layout: GroupLayout, upd, state: torch.Tensor) -> None:
    """The step's update of H (``state`` = H - 1, in place) and then of the (n,) fp32 weights
    ``x`` (``upd``: a ``PendingUpdate`` with g = (g, c) and hp = (alpha,))."""
    n = x.numel()
    g, c = upd.g[0].to(x.device), upd.g[1].to(x.device)
    alpha = upd.hp[0]
    d = state[:n]
    z = ops.z(n, upd.seed, layout.gid, x.device)
    f = (z * z).mul_(c).sub_(1).mul_(alpha)  # alpha (c z^2 - 1)
    d.addcmul_(f, d).add_(f)  # D' = D + (1 + D) alpha (c z^2 - 1)
    step = z.mul_(g).div_(f.copy_(d).add_(1).sqrt_())  # g z / sqrt(H')
    if upd.wd:
        step[:layout.n_decay].add_(x[:layout.n_decay], alpha=upd.wd)
    x.add_(step, alpha=-upd.lr)
