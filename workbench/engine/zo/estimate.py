"""A ZO step's estimate: its passes' losses -> the update's coefficients and what it reports.

Central (``queries`` = q, passes 2j and 2j + 1 at +eps z_j and -eps z_j): g_j = (L+_j - L-_j) /
2 eps, the update the mean of the q estimates, so its coefficients are g_j / q (one query: g
itself, as MeZO). One-sided (FZOO; pass 0 clean, pass j at +eps z_j): g_j = (L_j - L_0) / eps,
and the step is divided by the standard deviation sigma of the q perturbed losses: larger steps
where the losses barely move, smaller where they spread (FZOO's normalised step). HiZOO (pass
0 clean, then + and -): (g, curvature), ``hizoo.coefficients``. The directions
are regenerated from the step seed (``perturb.query_seeds``), so the coefficients are all a
checkpoint or the step log keeps.
"""
from __future__ import annotations

import torch

from workbench.engine.protocol import StepOutput
from workbench.engine.zo import hizoo
from workbench.engine.zo.step import MINUS, PLUS, ZOStep, projected_grad

#: the spread of the queries' losses below which a one-sided step is not divided further (a
#: batch whose q perturbed losses are all equal carries no scale to adapt to)
MIN_SPREAD = 1e-12


def estimate(losses: list[torch.Tensor], st: ZOStep) -> tuple[torch.Tensor, torch.Tensor]:
    """(coefficients, projected gradient) of a step from its passes' losses (0-d device
    tensors, pass order). One central query: g = (L+ - L-) / 2 eps for both, 0-d. q central
    queries: g_j = (L_2j - L_2j+1) / 2 eps, coefficients g_j / q. One-sided: g_j = (L_j+1 -
    L_0) / eps, coefficients g_j / (q max(sigma, ``MIN_SPREAD``)) with sigma the standard
    deviation of the q perturbed losses (FZOO's normalised step). The projected gradient
    reported is the mean g_j."""
    eps, q = st.eps, st.queries
    if st.rule == "hizoo":  # clean, +, -: (g, curvature) (``hizoo.py``)
        coefs = hizoo.coefficients(losses[0], losses[1], losses[2], eps)
        return coefs, coefs[0]
    if st.estimator == "central":
        if q == 1:
            g = projected_grad(losses[PLUS], losses[MINUS], eps)
            return g, g
        g = torch.stack([projected_grad(losses[2 * j], losses[2 * j + 1], eps)
                         for j in range(q)])
        return g / q, g.mean()
    perturbed = torch.stack(losses[1:])
    g = (perturbed - losses[0]) / eps
    return g / (q * perturbed.std().clamp_min(MIN_SPREAD)), g.mean()


def step_output(losses: list[torch.Tensor], st: ZOStep, coefs: torch.Tensor,
                g: torch.Tensor) -> StepOutput:
    """What a ZO step reports (``estimate``'s coefficients and g): the mean loss over its passes
    with the mean "+" and "-" losses (central), or the clean pass's loss with the mean
    perturbed one and no "-" (one-sided); the coefficients when they are not g (the step
    log's row of a step of several queries). Its forward passes: one per loss."""
    extra, passes = (coefs if coefs is not g else None), len(losses)
    if st.rule == "hizoo":  # the clean pass's loss, with the + and - ones
        return StepOutput(losses[0], g, losses[1], losses[2], extra, passes)
    if st.estimator == "one-sided":
        return StepOutput(losses[0], g, torch.stack(losses[1:]).mean(), None, extra, passes)
    plus, minus = losses[PLUS], losses[MINUS]
    if st.queries > 1:
        plus, minus = torch.stack(losses[0::2]).mean(), torch.stack(losses[1::2]).mean()
    return StepOutput((plus + minus) / 2, g, plus, minus, extra, passes)


def pass_name(st: ZOStep, k: int) -> str:
    """Pass k as the timeline labels it: + / - (one central query), +j / -j (several), 0 for
    the one-sided clean pass and +j for its perturbed ones (j from 1); HiZOO's 0, +, -."""
    if st.rule == "hizoo":
        return "0+-"[k]
    if st.estimator == "one-sided":
        return f"+{k}" if k else "0"
    sign = "+-"[k % 2]
    return sign if st.queries == 1 else f"{sign}{k // 2 + 1}"


