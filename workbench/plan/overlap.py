"""fo-offload's update phase as the step runs it: after a backward pass the CPU side has already
been working through, on a link that carries both directions at once.

Why. ``placement.py`` (and ``dma.py`` on top of it) predicts each side as if the whole update
began when backward ends. The engine starts each CPU subgroup as soon as its gradients land
(``engine/fo/grads.py``), during backward, and times the update phase from backward's end to the
last update work (``engine/fo/timeline.py``). At opt-13b on an H100 the CPU side began 0.5-1.1 s
before backward ended, so CPU-heavy placements were predicted up to 130% too slow,
and the model's own stride leaned to the GPU side. The GPU side's prefetches (up) and flush-outs
(down) cross the link at the same time; the link carries less each way then than one way alone
(83 GB/s both ways vs 53 GB/s one way on that machine), so that side was predicted ~15% short.

The model (seconds; P parameters; ``Backward`` says how long backward computes, the gradient
flush's rate and the link's both-way rate):
    flush    the CPU-updated share's gradients down: cpu P g / d2h_bps (g: ``grad_bytes``, 4 as
             fp32, 2 as bf16 for the one-pass CPU AdamW).
    landing  CPU subgroup i of n (processing order) is on the host at L_i = max(bwd, flush) (i+1)/n:
             the flush keeps pace with backward, or backward with it (it waits past
             ``QUEUE_BYTES`` queued: ``grads.py``).
    end      backward ends on the GPU at E = max(bwd, flush - QUEUE_BYTES / d2h_bps).
    CPU      one subgroup at a time, each ``cpu_s`` / n (the CPU side's seconds under DMA load,
             ``dma.cpu_seconds``), none before it lands: f_i = max(f_{i-1}, L_i) + cpu_s / n.
             The CPU side's phase is f_n - E plus its last upload.
    GPU      from E: the interleaved share's (p, m, v) up and down, and up the weights of the CPU
             subgroups finished after E; both directions at duplex / 2 while both run, the rest
             one way at B; plus the GPU updates (interleaved and resident) at Ug.
The update phase is the slower of the two. Pure arithmetic (no torch), like the rest of ``plan/``.
"""
from __future__ import annotations

from dataclasses import dataclass

from workbench.plan.fo_memory import QUEUE_BYTES
from workbench.plan.placement import Placement, Subgroups

@dataclass(frozen=True)
class Backward:
    """The backward pass an update phase follows: ``seconds`` of its compute on the GPU (without
    waiting for the link), ``d2h_bps`` the gradient flush's bytes/s, and ``duplex_bps`` the
    link's bytes/s both ways together (None: each way at its one-way rate)."""

    seconds: float
    d2h_bps: float
    duplex_bps: float | None = None

    def as_dict(self) -> dict:
        return {"seconds": self.seconds, "d2h_bps": self.d2h_bps, "duplex_bps": self.duplex_bps}


def cpu_finishes(placed: Placement, groups: Subgroups, cpu_s: float,
                 bwd: Backward) -> list[float]:
    """Seconds from backward's start at which each CPU subgroup of ``groups`` ends its update
    (processing order), each ``cpu_s`` in proportion to its size and never begun before it
    lands."""
    size = [groups.numel_of(j) for j in placed.schedule.cpu]
    if not size:
        return []
    total = sum(size)
    land_end = max(bwd.seconds, flush_bytes(placed, groups.numel) / bwd.d2h_bps)
    out, f, landed = [], 0.0, 0
    for n in size:
        landed += n
        f = max(f, land_end * landed / total) + cpu_s * n / total
        out.append(f)
    return out


def backward_end(placed: Placement, n_params: int, bwd: Backward) -> float:
    """Seconds from backward's start to its end on the GPU (it waits for the link past
    ``QUEUE_BYTES`` of queued gradients)."""
    flush = flush_bytes(placed, n_params) / bwd.d2h_bps
    return max(bwd.seconds, flush - QUEUE_BYTES / bwd.d2h_bps)


def flush_bytes(placed: Placement, n_params: int) -> float:
    """Bytes of gradients the flush sends down in a step: the CPU-updated share's."""
    return placed.split.cpu * n_params * placed.inputs.grad_bytes


def flush_rate_shown(placed: Placement, n_params: int, backward_s: float) -> float:
    """The least gradient-flush rate (bytes/s) a backward pass of ``backward_s`` seconds that
    flushed ``placed``'s CPU share shows: it ended no earlier than the flush, less what may
    still wait in the queue (``backward_end``); 0 where that says nothing."""
    flushed = flush_bytes(placed, n_params) - QUEUE_BYTES
    return flushed / backward_s if flushed > 0 and backward_s > 0 else 0.0


def sides(placed: Placement, groups: Subgroups, cpu_s: float,
          bwd: Backward) -> tuple[float, float]:
    """(CPU side, GPU side) seconds after backward's end (module docstring), ``placed`` over
    ``groups``."""
    inp, n_params, cpu = placed.inputs, groups.numel, placed.schedule.cpu
    one_way = inp.B * 4  # bytes/s
    both = min(one_way, bwd.duplex_bps / 2) if bwd.duplex_bps else one_way
    end = backward_end(placed, n_params, bwd)
    finishes = cpu_finishes(placed, groups, cpu_s, bwd)
    # CPU subgroups whose weights go up after E
    late = sum(groups.numel_of(j) for j, f in zip(cpu, finishes) if f > end)
    cpu_side = (max(0.0, finishes[-1] - end) + groups.numel_of(cpu[-1]) * inp.word_bytes
                / one_way if finishes else 0.0)  # ... the last one's upload after its update
    swap = placed.split.gpu * n_params * 4 * inp.state_words  # bytes each way
    up = swap + late * inp.word_bytes
    link = min(up, swap) / both + abs(up - swap) / one_way
    gpu = link + (placed.split.gpu + placed.split.resident) * n_params / inp.Ug
    return cpu_side, gpu


def phase(placed: Placement, groups: Subgroups, cpu_s: float, bwd: Backward) -> float:
    """The update phase's seconds after backward's end: the slower of ``sides``."""
    return max(sides(placed, groups, cpu_s, bwd))
