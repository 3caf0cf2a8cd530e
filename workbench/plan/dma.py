"""fo-offload's CPU update under DMA load: the placement model (``placement.py``) with the CPU
side slowed by the step's own host-memory traffic.

Why. ``placement.py`` predicts the CPU side from Uc, AdamW's rate measured alone. In a step the
link's copies (the GPU side's prefetches and flush-outs, the CPU side's weight uploads and
gradient D2H) read and write the same host memory the CPU update streams through, and the CPU
update ran 27-31% below Uc in interleaved schedules, 12-19% below in all-CPU / resident ones
(fo_offload benchmark, H100, issue 41): predictions were 18-31% short.

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
Pure arithmetic (no torch), like the rest of ``plan/``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from workbench.config import Stride
from workbench.plan import placement
from workbench.plan.placement import Candidate, PerfInputs, Placement, Subgroups

#: Said wherever a prediction is made without a CPU rate under DMA load.
NOTE = ("the predicted update time ignores DMA contention (no CPU AdamW rate under DMA load "
        "was measured: the CPU update ran 27-31% slower beside the link's copies on an H100, "
        "issue 41)")


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
              state_words: float) -> float:
    """Host-memory bytes the update phase's DMA moves: an interleaved parameter's (p, m, v) up
    and down (4 ``state_words`` bytes each way); a CPU-updated one's fp32 gradient down and its
    compute weight up (``word_bytes``: 4 as fp32, 2 when downcast on the CPU)."""
    return n_params * (split.gpu * 8 * state_words + split.cpu * (4 + word_bytes))


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
    return cpu_seconds(cpu, dma_bytes(n_params, placed.split, inp.word_bytes, inp.state_words),
                       c), gpu


def contended(placed: Placement, n_params: int, c: Contention | None) -> Placement:
    """``placed`` with ``predicted_s`` the slower of its ``sides`` under DMA load."""
    if c is None:
        return placed
    return replace(placed, predicted_s=max(sides(placed, n_params, c)))


def place(perf: PerfInputs, groups: Subgroups, update_stride: Stride, resident_ratio: float,
          cpu_downcast: bool | None, c: Contention | None) -> Placement:
    """``placement.place`` with predictions under DMA load: the downcast site (None: the one
    predicted faster, GPU on a tie) chosen by them too. The stride of "auto" is still the
    balance of ``placement.stride`` (rates alone); the trial times its neighbours."""
    sixteen = perf.word_bytes < 4
    sites = (False, True) if sixteen and cpu_downcast is None else (bool(cpu_downcast),)
    return min((contended(placement.place_at(perf, groups, update_stride, resident_ratio, d),
                          groups.numel, c) for d in sites), key=lambda p: p.predicted_s)


def candidates(perf: PerfInputs, groups: Subgroups, resident_ratio: float,
               c: Contention | None) -> list[Candidate]:
    """``placement.candidates`` (the same placements) with predictions under DMA load, fastest
    predicted first."""
    out = []
    for cand in placement.candidates(perf, groups, resident_ratio):
        placed = place(perf, groups, cand.stride, resident_ratio, bool(cand.cpu_downcast), c)
        out.append(replace(cand, predicted_s=placed.predicted_s))
    return sorted(out, key=lambda cand: cand.predicted_s)
