"""Kernel warm-up: every Triton kernel a run launches is compiled and loaded before its first
step, so step times measure training, not the compiler.

Without it the first launch of each kernel variant compiles it inside a step (seconds on a fresh
machine: on an H200 the first fused update made step 2 of an opt-1.3b run take 4.6 s against
0.26 s). Nothing is launched and no weight is touched: Triton compiles from the arguments'
types and sizes alone.
"""
from __future__ import annotations

from workbench.engine.codecs.wire import HALF, sr_kernels
from workbench.engine.stream.frozen_transfer import FrozenTransfer


def warm_kernels(engine) -> int:
    """Compile and load the fused ZO kernels for every parameter group of ``engine``, under
    ``master=compressed-sr`` the stochastic-rounding encoder, a frozen base's decoders, and
    compute-dtype slots' chain kernel.
    Returns the number of group sizes warmed (0 where no Triton ZO kernel runs: the CPU,
    ``rng=torch``, first-order methods)."""
    transfer = getattr(getattr(engine, "streamer", None), "transfer", None)
    if isinstance(transfer, FrozenTransfer):
        transfer.warm()
    ops = getattr(engine, "ops", None)
    if ops is None or ops.kernels is None:
        return 0
    sizes = sorted({(lay.numel, lay.n_decay) for lay in engine.group_layouts() if lay.numel})
    # Only compressed-sr rounds stochastically: a streamed block's master at each offload, or
    # mezo's half weights at each update (``zo/half.py``).
    cfg = getattr(engine, "cfg", None)
    codec = getattr(cfg, "codec", "fp32")
    sr = sr_kernels() if getattr(cfg, "master", "fp32") == "compressed-sr" and codec in HALF \
        else None
    for numel, n_decay in sizes:
        ops.kernels.warm(numel, n_decay)
        if sr is not None:
            sr.warm(numel, HALF[codec])
    if transfer is not None and transfer.lazy and transfer.runner.kernel is not None:
        # compute-dtype slots: each streamed unit shape's fills and its last write
        # (``zo/chain.py``); a streamed embedding's rows: the span kernel
        k, s = transfer.runner.kernel, engine.streamer
        groups, write = s.groups(), k.SR if transfer.sr else k.NEAREST
        for lay in {groups[i].layout.signature(): groups[i].layout for i in s.streamed}.values():
            rows = transfer.rows is not None and lay is transfer.rows.layout
            k.warm(lay.numel, 0 if rows else transfer.form(lay).n_mat, lay.n_decay,
                   transfer.half, transfer.compute, (write,) if rows else (k.FORM, write))
            if rows:
                k.warm_spans(lay.numel, lay.n_decay, transfer.half)
    return len(sizes)
