"""ZO elementwise operations on flat parameter groups, with z regenerated from (seed, group).

MeZO's arithmetic, per element, for a step with seed s, perturbation scale eps and update
(g, lr, wd) pending from the previous step:
    p = w + eps z          (perturb +1)
    m = p - 2 eps z        (perturb -2, from p)
    r = m + eps z          (restore, from m; not bit-equal to w, as in MeZO)
    w' = r - lr (g z + wd r)
Every engine and the checkpoint replay issue these operations in this order through
``step.py``, so on one device they end with the same bits. Backends: the fused Triton kernel
(rng=philox on CUDA), or torch ops on a materialised z (CPU; rng=torch anywhere) that give the
same numbers as far as the RNGs allow.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.engine import kernels
from workbench.engine.groups import GroupLayout
from workbench.engine.zo import philox


@dataclass(frozen=True)
class PendingUpdate:
    """Step ``seed``'s update, not yet applied: w <- w - lr (g z + wd w). ``g``: 0-d device
    tensor, so applying it never waits for the host."""

    seed: int
    g: torch.Tensor
    lr: float
    wd: float


def pending_dict(upd: PendingUpdate | None, host_g: torch.Tensor | None) -> dict | None:
    """A pending update as a checkpoint stores it (``host_g``: its g, copied to the host)."""
    if upd is None:
        return None
    return {"seed": upd.seed, "g": float(host_g), "lr": upd.lr, "wd": upd.wd}


def pending_from_dict(d: dict | None, device: torch.device) -> PendingUpdate | None:
    """The inverse of ``pending_dict`` (also reads a step-log row), g on ``device``."""
    if d is None:
        return None
    return PendingUpdate(int(d["seed"]), torch.tensor(float(d["g"]), dtype=torch.float32,
                                                      device=device), float(d["lr"]), float(d["wd"]))


class ZOOps:
    """Perturb / update flat fp32 groups.

    Args:
        rng: "philox" (counter-based; fused kernel on CUDA) or "torch" (torch.randn with a
            generator seeded from (seed, group id), as MeZO samples z).
        device: where the groups being operated on live.
    """

    def __init__(self, rng: str, device: torch.device):
        self.rng, self.device = rng, torch.device(device)
        self.kernels = (kernels.load("zo.kernels", "rng=philox")
                        if rng == "philox" and self.device.type == "cuda" else None)

    def z(self, n: int, seed: int, gid: int, device: torch.device | None = None) -> torch.Tensor:
        """The (n,) float32 normals of group ``gid`` at ``seed``."""
        device = torch.device(device or self.device)
        if self.rng == "torch":
            gen = torch.Generator(device=device)
            gen.manual_seed((seed << 31) ^ gid)
            return torch.randn(n, generator=gen, device=device, dtype=torch.float32)
        if self.kernels is not None and device.type == "cuda":
            return self.kernels.normals(n, seed, gid, device)
        return philox.normals(n, seed, gid, device)

    def perturb(self, x: torch.Tensor, layout: GroupLayout, seed: int, scale: float,
                out: torch.Tensor | None = None) -> None:
        """out (default: x in place) <- x + scale * z."""
        out = x if out is None else out
        if self.kernels is not None:
            self.kernels.launch(x, out, None, layout.n_decay, seed, 0, layout.gid, scale, 0.0, 0.0,
                              do_update=False, do_perturb=True, write_x=False)
            return
        z = self.z(x.numel(), seed, layout.gid, x.device)
        torch.add(x, z, alpha=scale, out=out)

    def update(self, x: torch.Tensor, layout: GroupLayout, upd: PendingUpdate) -> None:
        """x <- x - lr (g z + wd x) in place, z from the update's seed."""
        if self.kernels is not None:
            self.kernels.launch(x, x, upd.g, layout.n_decay, 0, upd.seed, layout.gid, 0.0, upd.lr,
                              upd.wd, do_update=True, do_perturb=False, write_x=True)
            return
        u = self.z(x.numel(), upd.seed, layout.gid, x.device).mul_(upd.g.to(x.device))
        if upd.wd:
            u[:layout.n_decay].add_(x[:layout.n_decay], alpha=upd.wd)
        x.add_(u, alpha=-upd.lr)

    def delta(self, x: torch.Tensor, layout: GroupLayout, upd: PendingUpdate) -> torch.Tensor:
        """The update itself, -lr (g z + wd x), as a new fp32 tensor (x is not changed)."""
        d = self.z(x.numel(), upd.seed, layout.gid, x.device).mul_(upd.g.to(x.device))
        if upd.wd:
            d[:layout.n_decay].add_(x[:layout.n_decay], alpha=upd.wd)
        return d.mul_(-upd.lr)

    def update_perturb(self, x: torch.Tensor, layout: GroupLayout, upd: PendingUpdate | None,
                       seed: int, scale: float, out: torch.Tensor | None = None) -> None:
        """Apply ``upd`` (if any) to x, then out <- x + scale z (default out: x in place; with a
        separate out, x keeps the updated weights). One pass on the fused path."""
        if upd is None:
            self.perturb(x, layout, seed, scale, out)
            return
        if self.kernels is not None:
            self.kernels.launch(x, x if out is None else out, upd.g, layout.n_decay, seed, upd.seed,
                              layout.gid, scale, upd.lr, upd.wd, do_update=True, do_perturb=True,
                              write_x=out is not None and out is not x)
            return
        self.update(x, layout, upd)
        self.perturb(x, layout, seed, scale, out)
