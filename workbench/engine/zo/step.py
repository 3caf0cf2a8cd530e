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
Forward-grad applies the pending update the same way, then runs one forward pass with the
tangent z.

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

from workbench.engine.groups import GroupLayout
from workbench.engine.zo.perturb import PendingUpdate, ZOOps

MASK64 = (1 << 64) - 1


def step_seed(run_seed: int, step: int) -> int:
    """The perturbation seed of ``step`` (31 bits; splitmix64 of (run seed, step)), so a
    resumed run regenerates exactly the z of a straight one."""
    x = (run_seed * 0x9E3779B97F4A7C15 + (step + 1) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return (x ^ (x >> 31)) & 0x7FFFFFFF


PLUS, MINUS = 0, 1  # the two forward passes of a ZO step (indices into per-pass lists)

#: A codec's way of applying a pending update to a group's fp32 weights in place.
ApplyUpdate = Callable[[torch.Tensor, GroupLayout, PendingUpdate], None]


@dataclass(frozen=True)
class ZOStep:
    """What a step needs besides the group: its seed, the perturbation scale and the update
    still pending from an earlier step (applied first)."""

    seed: int
    eps: float
    pending: PendingUpdate | None = None


def projected_grad(loss_plus: torch.Tensor, loss_minus: torch.Tensor, eps: float) -> torch.Tensor:
    """g = (L+ - L-) / 2 eps as a 0-d device tensor (never read on the host inside a step)."""
    return (loss_plus - loss_minus) / (2 * eps)


def apply_update(ops: ZOOps, flat: torch.Tensor, layout: GroupLayout,
                 upd: PendingUpdate | None, apply: ApplyUpdate | None = None) -> None:
    """w <- w - lr (g z + wd w) in place on the group's (n,) fp32 buffer; nothing when no
    update is pending."""
    if upd is not None and layout.numel:
        (apply or ops.update)(flat, layout, upd)


def zo_passes(ops: ZOOps, flat: torch.Tensor, layout: GroupLayout, st: ZOStep,
              apply: ApplyUpdate | None = None) -> Iterator[int]:
    """The ZO step on one group: yields PLUS with the group at p (the pending update applied
    first), then MINUS at m; restores it to r when resumed after MINUS. An empty group yields
    at the same points and does nothing."""
    if not layout.numel:
        yield PLUS
        yield MINUS
        return
    upd = st.pending
    if upd is not None and apply is not None:
        apply(flat, layout, upd)
        upd = None
    ops.update_perturb(flat, layout, upd, st.seed, +st.eps)
    yield PLUS
    ops.perturb(flat, layout, st.seed, -2 * st.eps)
    yield MINUS
    ops.perturb(flat, layout, st.seed, +st.eps)


def lockstep(passes: list[Iterator[int]]) -> Iterator[int]:
    """Several groups' ``zo_passes`` driven together: every group is at p before the yield of
    PLUS and at m before MINUS; all are restored when resumed after MINUS (MeZO's step)."""
    for sign in (PLUS, MINUS):
        for p in passes:
            next(p)
        yield sign
    for p in passes:
        next(p, None)


def jvp_tangent(ops: ZOOps, flat: torch.Tensor, layout: GroupLayout, st: ZOStep,
                apply: ApplyUpdate | None = None) -> torch.Tensor:
    """Forward-grad's step on one group: apply the pending update, return the tangent z (n,)
    fp32 that the forward pass differentiates along."""
    apply_update(ops, flat, layout, st.pending, apply)
    return ops.z(layout.numel, st.seed, layout.gid, flat.device)


def replay_pass(ops: ZOOps, flat: torch.Tensor, layout: GroupLayout, st: ZOStep, zo: bool,
                apply: ApplyUpdate | None = None) -> None:
    """A step's arithmetic on one group with its forward passes left out (checkpoint replay):
    ``zo`` the ZO passes, else forward-grad's (the update alone)."""
    if zo:
        for _ in zo_passes(ops, flat, layout, st, apply=apply):
            pass
    else:
        apply_update(ops, flat, layout, st.pending, apply)
