"""One ZO step on one parameter group, written once.

MeZO, zo-offload (embedding, tied embedding, blocks, head), forward-grad and the checkpoint
replay all call these functions; engines only decide where a group is and when it runs.

Per element, for a step with seed s, scale eps and the update (g, lr, wd) pending from an
earlier step (``perturb.py`` gives the rounding of each pass; the update and the first
perturbation are one fused pass on the Triton kernel):
    w' = w - lr (g z_prev + wd w)    apply the pending update, if any
    p  = w' + eps z                  the group as the "+" forward pass sees it
    m  = p - 2 eps z                 the group as the "-" forward pass sees it
    r  = m + eps z                   restored (not bit-equal to w', exactly as in MeZO)
With q queries (directions z_1 .. z_q from ``query_seeds``) the central estimator repeats the
last three lines for each z_j from the last restored state (passes 2j and 2j + 1), and the
one-sided estimator runs a clean pass at w' first (pass 0), then for each j p_j = x + eps z_j
(pass j) and x = p_j - eps z_j. A restore and the next query's perturbation are one pass on the
fused kernel, rounded as two (``shift``). ``estimate.py`` turns the passes' losses into the
update's coefficients (``PendingUpdate``). Forward-grad applies the pending update the same
way, then runs one forward pass with the tangent z.

``zo_passes`` is a generator: the caller runs its forward pass at each yield, so one function
serves a group perturbed on its own (a streamed block), every group together (MeZO, through
``lockstep``) and no forward at all (the replay). A new objective changes only what runs
between the yields; an adapter mode hands only its trainable groups to these functions.

How the pending update reaches a group depends on where it lives: ``apply`` is None for a
group whose fp32 weights are the master (the fused update), or a transfer's own update (the
fp32-master mirror keeps the delta to send down to the host master; see ``stream/transfers.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from workbench.config import RunConfig
from workbench.config import zo_passes as count_passes
from workbench.engine.groups import GroupLayout
from workbench.engine.zo import hizoo
from workbench.engine.zo.chain import Chain
from workbench.engine.zo.perturb import PendingUpdate, ZOOps, mix31, query_seeds


def step_seed(run_seed: int, step: int) -> int:
    """The perturbation seed of ``step`` (31 bits; splitmix64 of (run seed, step)), so a
    resumed run regenerates exactly the z of a straight one."""
    return mix31(run_seed * 0x9E3779B97F4A7C15 + (step + 1) * 0xBF58476D1CE4E5B9)


PLUS, MINUS = 0, 1  # the two forward passes of a one-query ZO step (indices into per-pass lists)

#: A codec's way of applying a pending update to a group's fp32 weights in place.
ApplyUpdate = Callable[[torch.Tensor, GroupLayout, PendingUpdate], None]


@dataclass(frozen=True)
class ZOStep:
    """What a step needs besides the group: its seed, the perturbation scale and the update
    still pending from an earlier step (applied first)."""

    seed: int
    eps: float
    pending: PendingUpdate | None = None
    queries: int = 1
    estimator: str = "central"
    rule: str = "sgd"  # the run's zo_optimizer: hizoo adds a clean pass and scales z by H^-1/2

    @classmethod
    def of(cls, cfg: RunConfig, step: int, pending: PendingUpdate | None = None) -> "ZOStep":
        """Step ``step`` of a run with config ``cfg``."""
        return cls(step_seed(cfg.seed, step), float(cfg.eps), pending, cfg.queries,
                   cfg.estimator, cfg.zo_optimizer)

    @property
    def passes(self) -> int:
        """Forward passes of the step: 2 q (central), q + 1 (one-sided), 3 (HiZOO)."""
        return count_passes(self.queries, self.estimator, self.rule)

    @property
    def seeds(self) -> tuple[int, ...]:
        return query_seeds(self.seed, self.queries)


def projected_grad(loss_plus: torch.Tensor, loss_minus: torch.Tensor, eps: float) -> torch.Tensor:
    """g = (L+ - L-) / 2 eps as a 0-d device tensor (never read on the host inside a step)."""
    return (loss_plus - loss_minus) / (2 * eps)


def apply_update(ops: ZOOps, flat: torch.Tensor, layout: GroupLayout,
                 upd: PendingUpdate | None, apply: ApplyUpdate | None = None,
                 state: torch.Tensor | None = None) -> None:
    """w <- w - lr (g z + wd w) in place on the group's (n,) fp32 buffer (momentum / adam:
    with the group's ``state``, ``optim.py``); nothing when no update is pending."""
    if upd is None or not layout.numel:
        return
    if apply is not None:
        apply(flat, layout, upd)
    else:
        ops.update(flat, layout, upd, state)


def zo_passes(ops: ZOOps, flat: torch.Tensor, layout: GroupLayout, st: ZOStep,
              apply: ApplyUpdate | None = None,
              state: torch.Tensor | None = None) -> Iterator[int]:
    """The ZO step on one group: yields each pass's index k (0 .. ``st.passes`` - 1) with the
    group as pass k sees it (the pending update applied first, with the group's optimizer
    ``state`` if its rule keeps one), and leaves it restored when resumed after the last. One
    central query: PLUS at p, MINUS at m. An empty group yields at the same points and does
    nothing."""
    if not layout.numel:
        yield from range(st.passes)
        return
    if isinstance(apply, Chain):  # a compute-dtype slot: its chain records every operation
        ops, apply = apply.ops, None
    upd = st.pending
    if upd is not None and apply is not None:
        apply(flat, layout, upd)
        upd = None
    eps = st.eps
    if st.rule == "hizoo":  # clean, +, -, each z scaled by the group's H^-1/2 (``hizoo.py``)
        if state is None:
            raise ValueError(f"zo_optimizer=hizoo: group {layout.name} has no Hessian state")
        apply_update(ops, flat, layout, upd, state=state)
        yield 0
        for k, scale in ((1, +eps), (2, -2 * eps), (None, +eps)):
            hizoo.perturb(ops, flat, layout, st.seed, scale, state)
            if k is not None:
                yield k
        return
    if st.estimator == "central":
        for j, seed in enumerate(st.seeds):
            # query j's +eps, with the pending update (j = 0) or query j - 1's restore fused
            ops.update_perturb(flat, layout, upd if j == 0 else shift(ops, st.seeds[j - 1], eps),
                               seed, +eps, state=state)
            yield 2 * j
            ops.perturb(flat, layout, seed, -2 * eps)
            yield 2 * j + 1
        ops.perturb(flat, layout, st.seeds[-1], +eps)
        return
    apply_update(ops, flat, layout, upd, state=state)
    yield 0
    for j, seed in enumerate(st.seeds):
        if j == 0:
            ops.perturb(flat, layout, seed, +eps)
        else:  # query j - 1's restore fused with query j's perturbation
            ops.update_perturb(flat, layout, shift(ops, st.seeds[j - 1], -eps), seed, +eps)
        yield j + 1
    ops.perturb(flat, layout, st.seeds[-1], -eps)


def shift(ops: ZOOps, seed: int, scale: float) -> PendingUpdate:
    """x <- x + scale z(seed) written as an update (g = 1, lr = -scale, no decay), so it fuses
    with the next perturbation in one pass; each element is rounded exactly as ``ops.perturb``
    rounds it (one fma of z and scale on the kernel, torch's add with alpha otherwise)."""
    return PendingUpdate(seed, ops.one, -scale, 0.0)


def lockstep(passes: list[Iterator[int]], count: int = 2) -> Iterator[int]:
    """Several groups' ``zo_passes`` driven together: every group is at pass k's state before
    the yield of k (``count`` passes); all are restored when resumed after the last (MeZO's
    step)."""
    for k in range(count):
        for p in passes:
            next(p)
        yield k
    for p in passes:
        next(p, None)


def jvp_tangent(ops: ZOOps, flat: torch.Tensor, layout: GroupLayout, st: ZOStep,
                apply: ApplyUpdate | None = None) -> torch.Tensor:
    """Forward-grad's step on one group: apply the pending update, return the tangent z (n,)
    fp32 that the forward pass differentiates along."""
    apply_update(ops, flat, layout, st.pending, apply)
    return ops.z(layout.numel, st.seed, layout.gid, flat.device)


def replay_pass(ops: ZOOps, flat: torch.Tensor, layout: GroupLayout, st: ZOStep, zo: bool,
                apply: ApplyUpdate | None = None, state: torch.Tensor | None = None) -> None:
    """A step's arithmetic on one group with its forward passes left out (checkpoint replay):
    ``zo`` the ZO passes, else forward-grad's (the update alone)."""
    if zo:
        for _ in zo_passes(ops, flat, layout, st, apply=apply, state=state):
            pass
    else:
        apply_update(ops, flat, layout, st.pending, apply, state)
