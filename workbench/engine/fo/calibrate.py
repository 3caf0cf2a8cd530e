"""fo-offload's performance-model inputs, measured with the step's own operations.

``calibrate(engine)`` times, on one full subgroup (subgroup 0's page-locked host buffers):
    B   its fp32 masters up the link (the copy the uploads and prefetches make)
    Bd  its gradients down the link (the step's chunked upcast and D2H)
    Ug  its GPU update (kept-gradient upcast, fused AdamW, compute-weight downcast)
    Uc  its CPU update on the update worker (the step's thread count)
    Dc  its 16-bit downcast into a pinned staging buffer (16-bit compute weights only)
each ``reps`` times after a warm-up (``measure``: the median, the spread kept), on zero
gradients; subgroup 0's state is put back afterwards, bit for bit.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

from workbench.engine.fo.host import adamw
from workbench.plan.placement import Rate

#: Timed repetitions of each probe (after ``WARMUP`` untimed ones); the rate is their median.
REPS, WARMUP = 5, 1


@dataclass(frozen=True)
class Probe:
    """One repetition of a step operation on one subgroup: ``run()`` moves or updates ``n``
    parameters; it is timed on the host clock (``stream`` None) or by CUDA events on
    ``stream`` (work it enqueues there)."""

    n: int
    run: Callable[[], None]
    stream: object = None


class Stopwatch:
    """Seconds of one probe run: the host clock around it, or CUDA events on its stream."""

    def __call__(self, probe: Probe) -> float:
        if probe.stream is None:
            t = time.perf_counter()
            probe.run()
            return time.perf_counter() - t
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(probe.stream)
        probe.run()
        end.record(probe.stream)
        end.synchronize()  # calibration only, before training: the time is read right away
        return start.elapsed_time(end) / 1e3


def measure(probes: dict[str, Probe], stopwatch: Callable[[Probe], float],
            reps: int = REPS, warmup: int = WARMUP) -> dict[str, Rate]:
    """Each probe run ``warmup + reps`` times; its ``Rate`` keeps the timed ``reps`` (the rate
    is their median, so one slow or fast outlier does not move it)."""
    out = {}
    for name, probe in probes.items():
        seconds = [stopwatch(probe) for _ in range(warmup + reps)][warmup:]
        out[name] = Rate(probe.n, tuple(max(s, 1e-12) for s in seconds))
    return out


def calibrate(engine, stopwatch=None, reps: int = REPS) -> dict[str, Rate]:
    """``engine``: a ``FOOffloadEngine`` between steps. Returns ``Rate`` by name."""
    e = engine
    e.sync()
    n, s, dev = e.bounds(0)[1], e.streams, e.device
    p, g, m, v = (t[:n] for t in (e.p32, e.g32, e.m, e.v))
    saved = [t.clone() for t in (p, g, m, v)]
    g.zero_()
    hyper = dict(lr=1e-3, beta1=e.cfg.adam_beta1, beta2=e.cfg.adam_beta2, eps=e.cfg.adam_eps)
    one_cpu, one_dev = torch.ones(()), torch.ones((), device=dev)
    dp, dm, dv, scratch = (torch.empty(n, device=dev) for _ in range(4))
    dp.copy_(p)
    dm.zero_()
    dv.zero_()
    kept, out = torch.zeros(n, dtype=e.wdtype, device=dev), torch.empty_like(e.w[:n])
    segs = e.segments[0]

    def on(stream, fn):
        with s.on(stream):
            fn()

    probes = {
        "B": Probe(n, partial(on, s.upload, lambda: scratch.copy_(
            p, non_blocking=e.cuda)), s.upload),
        "Bd": Probe(n, partial(on, s.offload, lambda: e.grads_down([kept], 0, n, 0)),
                              s.offload),
        "Ug": Probe(n, lambda: e.update_on_gpu(
            dp, dm, dv, kept, scratch if e.word == 2 else None, out, segs, 0.0, hyper, one_dev),
            s.compute),
        "Uc": Probe(n, partial(e.host_side.run, adamw, p, g, m, v, segs, 0.0, hyper,
                                         one_cpu)),
    }
    if e.wdtype != torch.float32:
        stage = e.host_side.stage(0)[:n]
        probes["Dc"] = Probe(n, partial(e.host_side.run, stage.copy_, p))
    rates = measure(probes, stopwatch or Stopwatch(), reps)
    e.sync()  # the probes' copies are done: put subgroup 0 back
    for t, keep in zip((p, g, m, v), saved):
        t.copy_(keep)
    return rates
