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

from workbench.config import RunConfig
from workbench.engine import kernels
from workbench.engine.groups import GroupLayout
from workbench.engine.rng import philox
from workbench.engine.zo import half, hizoo, optim


MASK64 = (1 << 64) - 1


def mix31(x: int) -> int:
    """splitmix64's finaliser of ``x`` (taken mod 2^64), cut to 31 bits: a seed for philox or
    torch's generator."""
    x &= MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return (x ^ (x >> 31)) & 0x7FFFFFFF


def query_seeds(seed: int, queries: int) -> tuple[int, ...]:
    """The perturbation seeds of a step's ``queries`` directions: the step seed itself first
    (so one query is exactly the single-perturbation step), then splitmix64 of (seed, j), 31
    bits; a replay regenerates them from the step seed alone."""
    return (seed, *(mix31(seed * 0xD1B54A32D192ED03 + j * 0x9E3779B97F4A7C15)
                    for j in range(1, queries)))


@dataclass(frozen=True)
class PendingUpdate:
    """Step ``seed``'s update, not yet applied. ``g``: device tensor, so applying it never waits
    for the host; 0-d for one direction, w <- w - lr (g z + wd w), or (q,) for a step of q
    queries, whose directions z_j come from ``query_seeds(seed, q)``: applied one direction
    at a time, w <- w - lr (g_j z_j + [j = 0] wd w), weight decay once. ``rule="sign"``
    (ZO-SGD-Sign) steps by the sign of the whole estimate instead."""

    seed: int
    g: torch.Tensor
    lr: float
    wd: float
    rule: str = "sgd"  # "sign": w <- w - lr (sign(sum_j g_j z_j) + wd w), in one pass
    t: int = 0  # momentum / adam (``optim.py``): the update's count from 1 (step + 1)
    hp: tuple[float, ...] = ()  # momentum / adam: the rule's own knobs (``optim.hyper``)

    @classmethod
    def of(cls, cfg: RunConfig, step: int, seed: int, coefs: torch.Tensor, lr: float,
           wd: float) -> "PendingUpdate":
        """Step ``step``'s update under the run's rule (``cfg.zo_optimizer``), from its
        coefficients (``estimate.estimate``): what every engine keeps pending or applies, and
        what the replay rebuilds from a step-log row."""
        rule = cfg.zo_optimizer
        return cls(seed, coefs, lr, wd, rule, step + 1 if rule in optim.STATEFUL else 0,
                   optim.hyper(cfg))

    def parts(self) -> list[tuple[int, torch.Tensor, float]]:
        """(seed, coefficient (0-d view), weight decay) of each direction, in order."""
        if self.g.dim() == 0:
            return [(self.seed, self.g, self.wd)]
        seeds = query_seeds(self.seed, self.g.numel())
        return [(s, self.g[j], self.wd if j == 0 else 0.0) for j, s in enumerate(seeds)]


def pending_dict(upd: PendingUpdate | None, host_g: torch.Tensor | None) -> dict | None:
    """A pending update as a checkpoint stores it (``host_g``: its g, copied to the host; a
    list of q coefficients for a step of q queries)."""
    if upd is None:
        return None
    g = float(host_g) if upd.g.dim() == 0 else [float(x) for x in host_g.reshape(-1)]
    rule = {"rule": upd.rule} if upd.rule != "sgd" else {}
    if upd.hp:
        rule.update(t=upd.t, hp=list(upd.hp))
    return {"seed": upd.seed, "g": g, "lr": upd.lr, "wd": upd.wd, **rule}


def pending_from_dict(d: dict | None, device: torch.device,
                      rule: str = "sgd") -> PendingUpdate | None:
    """The inverse of ``pending_dict`` (also reads a step-log row, whose rule is the run's:
    ``rule``; its count and knobs, ``PendingUpdate.of``'s), g on ``device``."""
    if d is None:
        return None
    g = d["g"]
    g = [float(x) for x in g] if isinstance(g, list) else float(g)
    return PendingUpdate(int(d["seed"]), torch.tensor(g, dtype=torch.float32, device=device),
                         float(d["lr"]), float(d["wd"]), str(d.get("rule", rule)),
                         int(d.get("t", 0)), tuple(float(x) for x in d.get("hp", ())))


class ZOOps:
    """Perturb / update flat fp32 groups.

    Args:
        rng: "philox" (counter-based; fused kernel on CUDA) or "torch" (torch.randn with a
            generator seeded from (seed, group id), as MeZO samples z).
        device: where the groups being operated on live.
        directions: "gaussian" (z the normals) or "rademacher" (FZOO's +-1: z_i = 1 where the
            same normal is >= 0, else -1). The fused kernel draws normals inside, so Rademacher
            directions take the torch path on a materialised z (the kernel's normals on CUDA).
    """

    def __init__(self, rng: str, device: torch.device, directions: str = "gaussian"):
        self.rng, self.device, self.directions = rng, torch.device(device), directions
        self.normals = (kernels.load("zo.kernels", "rng=philox")
                        if rng == "philox" and self.device.type == "cuda" else None)
        self.kernels = self.normals if directions == "gaussian" else None  # the fused launches
        self.one = torch.ones((), dtype=torch.float32, device=self.device)  # ``step.shift``'s g

    def z(self, n: int, seed: int, gid: int, device: torch.device | None = None) -> torch.Tensor:
        """The (n,) float32 directions of group ``gid`` at ``seed``: normals, or their signs
        (+-1, 0 counted as +) for Rademacher directions."""
        z = self._normals(n, seed, gid, torch.device(device or self.device))
        if self.directions == "rademacher":  # in place: no temporary beside z
            z.ge_(0).mul_(2).sub_(1)
        return z

    def _normals(self, n: int, seed: int, gid: int, device: torch.device) -> torch.Tensor:
        if self.rng == "torch":
            gen = torch.Generator(device=device)
            gen.manual_seed((seed << 31) ^ gid)
            return torch.randn(n, generator=gen, device=device, dtype=torch.float32)
        if self.normals is not None and device.type == "cuda":
            return self.normals.normals(n, seed, gid, device)
        return philox.normals(n, seed, gid, device)

    def perturb(self, x: torch.Tensor, layout: GroupLayout, seed: int, scale: float,
                out: torch.Tensor | None = None) -> None:
        """out (default: x in place) <- x + scale * z."""
        out = x if out is None else out
        if x.dtype != torch.float32:  # MeZO's half weights: rounded to nearest (``half.py``)
            return half.perturb(self, x, layout, seed, scale, out)
        if self.kernels is not None:
            self.kernels.launch(x, out, None, layout.n_decay, seed, 0, layout.gid, scale, 0.0, 0.0,
                              do_update=False, do_perturb=True, write_x=False)
            return
        z = self.z(x.numel(), seed, layout.gid, x.device)
        torch.add(x, z, alpha=scale, out=out)

    def update(self, x: torch.Tensor, layout: GroupLayout, upd: PendingUpdate,
               state: torch.Tensor | None = None) -> None:
        """x <- x - lr (g z + wd x) in place, z from the update's seed (one direction at a
        time for a step of several: ``PendingUpdate.parts``; the sign rule in one pass;
        momentum and adam on the estimate, with the group's ``state``: ``optim.py``)."""
        if x.dtype != torch.float32:  # MeZO's half weights: rounded to nearest (``half.py``)
            return half.update(self, x, layout, upd)
        if upd.rule in optim.STATEFUL:
            if state is None:
                raise ValueError(f"zo_optimizer={upd.rule}: group {layout.name} has no state")
            if upd.rule == "hizoo":  # g = (g, curvature): its own update (``hizoo.py``)
                return hizoo.update(self, x, layout, upd, state)
            optim.stateful_step(x, layout, self.estimate(x, layout, upd), state, upd.rule,
                                upd.lr, upd.wd, upd.t, upd.hp)
            return
        if upd.rule == "sign":
            x.add_(self._sign_step(x, layout, upd), alpha=-upd.lr)
            return
        for seed, g, wd in upd.parts():
            self._update_one(x, layout, seed, g, upd.lr, wd)

    def estimate(self, x: torch.Tensor, layout: GroupLayout, upd: PendingUpdate) -> torch.Tensor:
        """d = sum_j g_j z_j as a new (n,) fp32 tensor (z materialised: one group's worth of
        4 B temporaries)."""
        d = None
        for seed, g, _ in upd.parts():
            u = self.z(x.numel(), seed, layout.gid, x.device).mul_(g.to(x.device))
            d = u if d is None else d.add_(u)
        return d

    def _sign_step(self, x: torch.Tensor, layout: GroupLayout, upd: PendingUpdate) -> torch.Tensor:
        """sign(sum_j g_j z_j) + wd x (decayed elements) as a new (n,) fp32 tensor: the sign
        rule's step before -lr."""
        d = self.estimate(x, layout, upd).sign_()
        if upd.wd:
            d[:layout.n_decay].add_(x[:layout.n_decay], alpha=upd.wd)
        return d

    def _update_one(self, x: torch.Tensor, layout: GroupLayout, seed: int, g: torch.Tensor,
                    lr: float, wd: float) -> None:
        if self.kernels is not None:
            self.kernels.launch(x, x, g, layout.n_decay, 0, seed, layout.gid, 0.0, lr, wd,
                                do_update=True, do_perturb=False, write_x=True)
            return
        u = self.z(x.numel(), seed, layout.gid, x.device).mul_(g.to(x.device))
        if wd:
            u[:layout.n_decay].add_(x[:layout.n_decay], alpha=wd)
        x.add_(u, alpha=-lr)

    def delta(self, x: torch.Tensor, layout: GroupLayout, upd: PendingUpdate) -> torch.Tensor:
        """The update itself, -lr (sum_j g_j z_j + wd x), as a new fp32 tensor (x is not
        changed; the stateless rules only: the mirror master carries no state)."""
        if upd.rule in optim.STATEFUL:
            raise ValueError(f"zo_optimizer={upd.rule}: the fp32 master's mirror carries no state")
        if upd.rule == "sign":
            return self._sign_step(x, layout, upd).mul_(-upd.lr)
        d = None
        for seed, g, wd in upd.parts():
            u = self.z(x.numel(), seed, layout.gid, x.device).mul_(g.to(x.device))
            if wd:
                u[:layout.n_decay].add_(x[:layout.n_decay], alpha=wd)
            d = u if d is None else d.add_(u)
        return d.mul_(-upd.lr)

    def update_perturb(self, x: torch.Tensor, layout: GroupLayout, upd: PendingUpdate | None,
                       seed: int, scale: float, out: torch.Tensor | None = None,
                       state: torch.Tensor | None = None) -> None:
        """Apply ``upd`` (if any) to x, then out <- x + scale z (default out: x in place; with a
        separate out, x keeps the updated weights). One pass on the fused path (a step of q
        queries: q - 1 update passes, then the last direction's fused with the perturbation)."""
        if upd is None:
            self.perturb(x, layout, seed, scale, out)
            return
        # other rules, and half weights: the update its own pass first
        if self.kernels is None or upd.rule != "sgd" or x.dtype != torch.float32:
            self.update(x, layout, upd, state)
            self.perturb(x, layout, seed, scale, out)
            return
        *first, (last_seed, g, wd) = upd.parts()
        for s, gj, wdj in first:
            self._update_one(x, layout, s, gj, upd.lr, wdj)
        self.kernels.launch(x, x if out is None else out, g, layout.n_decay, seed, last_seed,
                            layout.gid, scale, upd.lr, wd, do_update=True, do_perturb=True,
                            write_x=out is not None and out is not x)
