"""fo-offload's CPU update under DMA load: the placement model (``placement.py``) with the CPU
side slowed by the step's own host-memory traffic.

Why. ``placement.py`` predicts the CPU side from Uc, AdamW's rate measured alone. In a step the
link's copies (the GPU side's prefetches and flush-outs, the CPU side's weight uploads and
gradient D2H) read and write the same host memory the CPU update streams through, and the CPU
update ran 27-31% below Uc in interleaved schedules, 12-19% below in all-CPU / resident ones
(fo_offload benchmark, H100): predictions were 18-31% short.

The inputs (``Contention``). ``calibrate/fo.py`` times the CPU update twice, alone (Uc) and while
pinned copies keep the link busy both ways (Ucd); ``load_bps`` is the bytes/s those copies
moved through host memory meanwhile. The machine profile's ``adamw_cpu_dma_per_s`` /
``adamw_cpu_dma_bps`` are the same two numbers for the planner (``plan/fo.py``).

The model. A CPU-updated parameter costs ``a`` seconds alone (1/Uc + 1/Dc, as ``placement``) and
a (1 + s u) under load, s = Uc/Ucd - 1 (the downcast, memory-bound too, slowed alike), where u
is the share of the probe's load that runs beside it: u = D / (T load_bps), D the bytes the
update phase's DMA moves through host memory (``dma_bytes``), T the CPU side's time, u <= 1.
Which phases overlap: every DMA of the update phase runs while the CPU side updates. The GPU
side's interleaved subgroups (prefetch up, flush-out down: its (p, m, v) both ways) run from the
end of backward, beside the CPU side's first subgroups; the CPU side's own traffic (its fp32
gradients down, each subgroup's weights up right after its update) is spread over its whole
run; resident subgroups move nothing. Spreading D evenly over T, the CPU side takes
T = A (1 + s u), A = n_cpu a: with u = D / (T R), T^2 - A T - A s D / R = 0, so
T = (A + sqrt(A^2 + 4 A s D / R)) / 2 while u <= 1, else A (1 + s). The GPU side is the model's
own (``placement.sides``); the update phase the slower of the two. Without Ucd (an old profile,
a CPU-only machine) s = 0: the model of ``placement.py``, and ``NOTE`` says so.
Given the backward pass the phase follows (``overlap.Backward``), the phase is ``overlap.phase``:
the CPU side's head start during backward and the link both ways; "auto" then weighs every
stride of ``strides``. ``refit`` fits Uc and s to steps that ran (update_stride=auto's trial:
each candidate predicted from the steps before it, ``engine/fo/trial.py``).
Pure arithmetic (no torch), like the rest of ``plan/``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from workbench.config import Stride
from workbench.plan import overlap, placement
from workbench.plan.overlap import Backward
from workbench.plan.placement import NO_GPU, Candidate, PerfInputs, Placement, Subgroups

#: Said wherever a prediction is made without a CPU rate under DMA load.
NOTE = ("the predicted update time ignores DMA contention (no CPU AdamW rate under DMA load "
        "was measured: the CPU update ran 27-31% slower beside the link's copies on an "
        "H100)")


@dataclass(frozen=True)
class Contention:
    """``Ucd``: the CPU update's rate (parameters/s) while DMA moved ``load_bps`` bytes/s of host
    memory; ``Uc``: its rate alone, measured beside it (the slowdown is Uc / Ucd)."""

    Uc: float
    Ucd: float
    load_bps: float

    @property
    def slowdown(self) -> float:
        """s: the CPU update's extra time per unit of time under the full load (>= 0)."""
        return max(0.0, self.Uc / self.Ucd - 1.0)

    def as_dict(self) -> dict:
        return {"Uc": self.Uc, "Ucd": self.Ucd, "load_bps": self.load_bps,
                "slowdown": self.slowdown}


def of_rates(rates: dict) -> Contention | None:
    """From ``calibrate/fo.py``'s rates ("Uc", "Ucd", "Xd": the load's bytes/s), or None when
    the CPU update was not timed under load."""
    if not {"Uc", "Ucd", "Xd"} <= set(rates):
        return None
    return Contention(rates["Uc"].per_s, rates["Ucd"].per_s, rates["Xd"].per_s)


def dma_bytes(n_params: int, split: placement.Split, word_bytes: int,
              state_words: float, grad_bytes: int = 4) -> float:
    """Host-memory bytes the update phase's DMA moves: an interleaved parameter's (p, m, v) up
    and down (4 ``state_words`` bytes each way); a CPU-updated one's gradient down
    (``grad_bytes``: 4 as fp32, 2 as bf16) and its compute weight up (``word_bytes``: 4 as
    fp32, 2 when downcast on the CPU)."""
    return n_params * (split.gpu * 8 * state_words + split.cpu * (grad_bytes + word_bytes))


def cpu_seconds(alone_s: float, dma: float, c: Contention | None) -> float:
    """The CPU side's seconds: ``alone_s`` at the alone rate, slowed by ``dma`` bytes of DMA
    spread over it (the module docstring's T)."""
    s = c.slowdown if c is not None else 0.0
    if alone_s <= 0 or s == 0 or dma <= 0 or c.load_bps <= 0:
        return alone_s
    t = (alone_s + math.sqrt(alone_s ** 2 + 4 * alone_s * s * dma / c.load_bps)) / 2
    return t if dma / (t * c.load_bps) <= 1.0 else alone_s * (1 + s)


def sides(placed: Placement, n_params: int, c: Contention | None) -> tuple[float, float]:
    """(CPU side, GPU side) seconds of ``placed``'s update phase, the CPU side under its DMA."""
    cpu, gpu = placed.sides(n_params)
    inp = placed.inputs
    return cpu_seconds(cpu, dma_bytes(n_params, placed.split, inp.word_bytes, inp.state_words,
                                      inp.grad_bytes), c), gpu


def contended(placed: Placement, groups: Subgroups, c: Contention | None,
              bwd: Backward | None = None) -> Placement:
    """``placed`` (over ``groups``) with ``predicted_s`` the slower of its ``sides`` under DMA
    load, or, given the backward pass it follows (``bwd``), its update phase after that pass
    (``overlap.phase``: the CPU side's head start, the link both ways)."""
    if c is None and bwd is None:
        return placed
    cpu, gpu = sides(placed, groups.numel, c)
    t = max(cpu, gpu) if bwd is None else overlap.phase(placed, groups, cpu, bwd)
    return replace(placed, predicted_s=t)


def strides(count: int) -> list[int]:
    """The strides "auto" weighs when the backward pass is known: 4 of every 5 down to 1 in
    ``SCAN`` on the GPU, and none (only those with at least one GPU subgroup of ``count``)."""
    return [k for k in (-4, -3, -2, *range(2, SCAN + 1)) if count >= (k if k > 0 else 1)] + [NO_GPU]


#: The largest positive stride "auto" weighs (1 in 16 subgroups on the GPU).
SCAN = 16


def place(perf: PerfInputs, groups: Subgroups, update_stride: Stride, resident_ratio: float,
          cpu_downcast: bool | None, c: Contention | None,
          bwd: Backward | None = None) -> Placement:
    """``placement.place`` with predictions under DMA load: the downcast site (None: the one
    predicted faster, GPU on a tie) chosen by them too. The stride of "auto" is the balance of
    ``placement.stride`` (rates alone), or, given the backward pass (``bwd``), the fastest
    predicted of ``strides``; the trial times its neighbours."""
    ks = strides(groups.count) if update_stride == "auto" and bwd is not None else [update_stride]
    return min((contended(placement.place_at(perf, groups, k, resident_ratio, d), groups, c,
                          bwd) for d in placement.sites(perf.word_bytes < 4, cpu_downcast)
                for k in ks),
               key=lambda p: p.predicted_s)


def candidates(perf: PerfInputs, groups: Subgroups, resident_ratio: float,
               c: Contention | None, bwd: Backward | None = None) -> list[Candidate]:
    """``placement.candidates`` with predictions under DMA load, fastest predicted first;
    given the backward pass (``bwd``), at each downcast site the model's stride (``place``),
    the next with fewer GPU subgroups and all on the CPU, none with more GPU-side parameters
    than the model's own pick."""
    if bwd is None:
        out = []
        for cand in placement.candidates(perf, groups, resident_ratio):
            placed = place(perf, groups, cand.stride, resident_ratio, bool(cand.cpu_downcast), c)
            out.append(replace(cand, predicted_s=placed.predicted_s))
        return sorted(out, key=lambda cand: cand.predicted_s)
    sixteen = perf.word_bytes < 4
    picks = [place(perf, groups, "auto", resident_ratio, d, c, bwd)
             for d in placement.sites(sixteen)]
    placed = []
    for model in picks:
        k = model.schedule.stride
        for stride in dict.fromkeys((k, placement.fewer(k) if k != NO_GPU else k, NO_GPU)):
            placed.append(place(perf, groups, stride, resident_ratio, model.cpu_downcast, c, bwd))
    return placement.ranked(placed, min(picks, key=lambda p: p.predicted_s), groups.size,
                            resident_ratio, sixteen)


def load_share(placed: Placement, n_params: int, busy_s: float, c: Contention) -> float:
    """u of the module docstring for a step that ran ``placed`` and kept the CPU busy
    ``busy_s`` seconds: its DMA bytes over what the probe's load moves in that time (<= 1)."""
    inp = placed.inputs
    d = dma_bytes(n_params, placed.split, inp.word_bytes, inp.state_words, inp.grad_bytes)
    return min(1.0, d / (busy_s * c.load_bps)) if busy_s > 0 and c.load_bps > 0 else 0.0


def refit(c: Contention | None, uc: float,
          seen: list[tuple[float, float]]) -> tuple[float, Contention | None]:
    """The CPU rate alone and the contention, refitted to steps that ran: ``seen`` holds, per
    step, (u, seconds per CPU-updated parameter its AdamW took). The model says
    y = (1 + s u) / Uc, a line in u: with steps at two loads or more (u apart by ``SPREAD``)
    both Uc and s are fitted (least squares; a fit with s < 0 or Uc <= 0 is not taken); with
    one, Uc alone (s kept). Without ``c`` (no load was measured) Uc is the steps' mean rate.
    Returns (Uc, contention); ``uc`` and ``c`` as they were without steps."""
    if not seen:
        return uc, c
    us, ys = [u for u, _ in seen], [y for _, y in seen]
    if c is None:
        return len(ys) / sum(ys), None
    s = c.slowdown
    if max(us) - min(us) >= SPREAD:
        mu, my = sum(us) / len(us), sum(ys) / len(ys)
        beta = (sum((u - mu) * (y - my) for u, y in seen)
                / sum((u - mu) ** 2 for u in us))
        alpha = my - beta * mu
        if alpha > 0 and beta >= 0:
            return 1 / alpha, Contention(1 / alpha, 1 / (alpha + beta), c.load_bps)
    rate = sum((1 + s * u) / y for u, y in seen) / len(seen)
    return rate, Contention(rate, rate / (1 + s), c.load_bps)


#: Steps' loads (u) must differ by this much for ``refit`` to fit the slowdown too.
SPREAD = 0.15
