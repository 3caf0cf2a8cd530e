"""The ZO optimizers that keep per-weight state: ZO-SGD with momentum and ZO-Adam (ZO-Bench).

Both step on the step's estimate d = sum_j c_j z_j (the q directions regenerated from their
seeds, as every rule does), with decoupled weight decay on the decayed elements, in the order
torch's single-tensor optimizers use, so each is checked against them:
    momentum   w <- w (1 - lr wd);  m <- beta m + d;  w <- w - lr m
    adam       w <- w (1 - lr wd);  m <- lerp(m, d, 1 - b1);  v <- b2 v + (1 - b2) d^2
               w <- w - (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)   (AdamW)
``state`` is one flat fp32 buffer per group: [m] or [m | v], (k n,) for a group of n weights,
kept beside the group's weights wherever they live (the device for MeZO and a streamed run's
embedding, head and residents; the host, in the master's format, for a streamed block: it
travels with the block, ``stream/opt_state.py``). t, the update's count from 1, is the step's
index + 1: every step makes one update, so a resumed run and the replay know it.
"""
from __future__ import annotations

import torch

from workbench.config import ZO_STATE_SLOTS, RunConfig
from workbench.engine.checkpoint import STATE_SUFFIX
from workbench.engine.groups import GroupLayout

STATEFUL = tuple(rule for rule, k in ZO_STATE_SLOTS.items() if k)


def hyper(cfg: RunConfig) -> tuple[float, ...]:
    """The rule's own knobs: (momentum,), (adam_beta1, adam_beta2, adam_eps) or
    (hessian_smooth,); () for the stateless rules."""
    if cfg.zo_optimizer == "momentum":
        return (float(cfg.momentum),)
    if cfg.zo_optimizer == "adam":
        return (float(cfg.adam_beta1), float(cfg.adam_beta2), float(cfg.adam_eps))
    if cfg.zo_optimizer == "hizoo":
        return (float(cfg.hessian_smooth),)
    return ()


def state_numel(rule: str, numel: int) -> int:
    """Elements of a group's state buffer under ``rule`` (0: the rule keeps none)."""
    return ZO_STATE_SLOTS[rule] * numel


def new_state(rule: str, numel: int, device: torch.device) -> torch.Tensor | None:
    """A zeroed state buffer for a group of ``numel`` weights (None: the rule keeps none)."""
    k = state_numel(rule, numel)
    return torch.zeros(k, dtype=torch.float32, device=device) if k else None


def stateful_step(x: torch.Tensor, layout: GroupLayout, d: torch.Tensor, state: torch.Tensor,
                  rule: str, lr: float, wd: float, t: int, hp: tuple[float, ...]) -> None:
    """One update of the group's (n,) fp32 weights ``x`` and its ``state`` from the estimate
    ``d`` (n,) fp32 (consumed: it may be overwritten)."""
    n = x.numel()
    if wd:
        x[:layout.n_decay].mul_(1 - lr * wd)  # decoupled decay first, as torch's AdamW
    if rule == "momentum":
        m = state[:n]
        m.mul_(hp[0]).add_(d)
        x.add_(m, alpha=-lr)
        return
    if rule != "adam":
        raise ValueError(f"zo_optimizer: {rule!r} keeps no state")
    b1, b2, eps = hp
    m, v = state[:n], state[n:2 * n]
    m.lerp_(d, 1 - b1)
    v.mul_(b2).addcmul_(d, d, value=1 - b2)
    denom = d.copy_(v).sqrt_().div_((1 - b2 ** t) ** 0.5).add_(eps)  # d's buffer reused
    x.addcdiv_(m, denom, value=-lr / (1 - b1 ** t))



def load_opt_state(states: list[torch.Tensor | None], snap) -> None:
    """Set the groups' state buffers ``states`` (canonical order; None where the group keeps
    none) from a checkpoint's ``Snapshot``; refuses one that lacks the state its rule needs."""
    if not any(s is not None for s in states):
        return
    if snap.opt_state is None:
        raise ValueError("checkpoint: this run's zo_optimizer keeps per-weight state, and the "
                         "checkpoint carries none")
    with torch.no_grad():
        for k, s in enumerate(states):
            if s is not None:
                s.copy_(snap.opt_state[k])
