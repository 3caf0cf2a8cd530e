"""What fo-offload's "auto" tries beyond the stride: subgroup sizes (subgroup_size=auto) and
GPU-resident shares that fit the GPU memory left over (gpu_resident_ratio 0, update_stride=auto).

``placement.candidates`` proposes the strides and downcast sites of one subgroup size; the
engine's trial (``engine/fo/trial.py``) times those at the first size here, then its winner at
each other size and at each resident share that fits, and keeps the fastest. Pure arithmetic
(no torch), like the rest of ``plan/``.
"""
from __future__ import annotations

import math

#: subgroup_size=auto's sizes (parameters): the fo_offload benchmark's tuned 50 M first (1.66 s
#: vs 3.4 s per step at 2 M on opt-6.7b), then the others, tried with its best stride.
#: 8 M is no longer tried beside them: in the 24 trials of benchmarks/results (opt-1.3b to 13b,
#: seven H100 hosts) it was never kept and its step was the slowest size's in 20 (1.1-1.4x the
#: others' at the same stride: ~0.2-0.3 ms of fixed cost per CPU subgroup, which the model does
#: not count, so its predictions also fell 20-39% short).
SIZES = (50_000_000, 25_000_000, 100_000_000)
#: The size of a model too small for any of ``SIZES`` (below 8 x 25 M parameters) where it
#: still leaves ``MIN_SUBGROUPS``.
SMALL = 8_000_000
#: Subgroups a size must leave at least (fewer: backward hands the CPU side too few pieces to
#: overlap, and a stride has too few subgroups to interleave).
MIN_SUBGROUPS = 8
MIN_SIZE = 1024  # RunConfig.subgroup_size's lower bound


def subgroup_sizes(numel: int, cuda: bool) -> tuple[int, ...]:
    """What subgroup_size=auto tries, the first one first (``engine/fo/trial.py``).

    On a GPU: the ``SIZES`` that leave at least ``MIN_SUBGROUPS`` subgroups of ``numel``
    parameters, in ``SIZES`` order; none of them for a model below 8 x 25 M parameters: one
    size, ``SMALL`` where it leaves as many, else numel / ``MIN_SUBGROUPS`` (rounded up, at
    least ``MIN_SIZE``), and no size trial. On a CPU
    both sides of the update run on the CPU and the size changes little: one size, the first
    of ``SIZES`` or the whole range if smaller, and no size trial. The per-size buffers (the
    CPU-downcast staging and the GPU upload slot) are at most 100 M x 8 B + 100 M x 4 B = 1.2 GB
    across host and GPU; the trial allocates them once at the largest size it tries."""
    if not cuda:
        return (max(1, min(SIZES[0], numel)),)
    fit = tuple(n for n in SIZES if numel >= MIN_SUBGROUPS * n)
    if fit:
        return fit
    return (SMALL if numel >= MIN_SUBGROUPS * SMALL
            else max(MIN_SIZE, -(-numel // MIN_SUBGROUPS)),)


# --- GPU-resident shares ------------------------------------------------------------------------
#: GPU memory left free beside a resident share (allocator slack, cuBLAS workspaces; the
#: trial's peak is one step's), bytes.
MARGIN = 2 * 2**30
SHARE_STEP = 0.05  # resident shares are multiples of this


def resident_bytes(state_bytes: int, word_bytes: int) -> int:
    """GPU bytes one resident parameter adds: its p, m, v (``placement.STATE_BYTES``) and its
    kept gradient (the compute dtype)."""
    return state_bytes + word_bytes


def gpu_spare(budget: int, peak: int) -> int:
    """GPU bytes a resident share may take: the run's budget (``gpu_mem_limit_gb``, else the
    GPU memory this process can have: free + what it holds) less the peak allocated by the
    steps so far (no residents) and ``MARGIN``."""
    return budget - peak - MARGIN


def resident_shares(spare: int, numel: int, per_param: int, scratch: int = 0) -> tuple[float, ...]:
    """The gpu_resident_ratio values "auto" also tries, largest first: the largest multiple of
    ``SHARE_STEP`` whose residents (``per_param`` bytes each, of ``numel``, plus a fixed
    ``scratch``: the residents' fp32 gradient upcast) fit in ``spare`` bytes, and half of it on
    the same grid; () when not even one step fits. Tried with the best stride and size like the
    sizes are (``engine/fo/trial.py``): a resident share is kept only when it is faster."""
    room = spare - scratch
    if room <= 0 or numel <= 0:
        return ()
    top = min(1.0, math.floor(room / (numel * per_param) / SHARE_STEP + 1e-9) * SHARE_STEP)
    half = math.floor(top / 2 / SHARE_STEP + 1e-9) * SHARE_STEP
    return tuple(dict.fromkeys(round(s, 4) for s in (top, half) if s > 0))
