"""fo-offload's performance-model inputs, measured with the engine's own parts.

``measure(parts)`` times, on one full subgroup (subgroup 0's page-locked host buffers):
    B   its fp32 masters up the link (the copy the uploads and prefetches make)
    Bd  its gradients down the link (the gradient flush's chunked upcast and D2H)
    Ug  its GPU update (kept-gradient upcast, fused AdamW, compute-weight downcast)
    Uc  its CPU update on the host side's worker (the step's thread count)
    Dc  its 16-bit downcast into a pinned staging buffer (16-bit compute weights only)
with bf16 moments (adam_state_dtype=bf16) the updates as the engine runs them then (upcast,
AdamW, stochastic rounding: ``engine/fo/moments.py``), each ``reps`` times after a warm-up (``time_probes``: the median, the spread kept), on zero
gradients; subgroup 0's state is put back afterwards, bit for bit. The engine calls it once, when
it is built (``FOOffloadEngine``'s ``measure``), and places its subgroups with the result
(``plan/placement.py``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

from workbench.engine.fo.adamw import AdamW, OptState, adamw
from workbench.engine.fo.gpu import gpu_update
from workbench.engine.fo.moments import HalfMoments, adamw_half
from workbench.engine.fo.offload import FOParts
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


def time_probes(probes: dict[str, Probe], stopwatch: Callable[[Probe], float],
                reps: int = REPS, warmup: int = WARMUP) -> dict[str, Rate]:
    """Each probe run ``warmup + reps`` times; its ``Rate`` keeps the timed ``reps`` (the rate
    is their median, so one slow or fast outlier does not move it)."""
    out = {}
    for name, probe in probes.items():
        seconds = [stopwatch(probe) for _ in range(warmup + reps)][warmup:]
        out[name] = Rate(probe.n, tuple(max(s, 1e-12) for s in seconds))
    return out


def measure(parts: FOParts, stopwatch: Callable[[Probe], float] | None = None,
            reps: int = REPS) -> dict[str, Rate]:
    """The rates of an fo-offload engine's ``parts`` (between steps), by name (``Rate``)."""
    f, s, host, cfg = parts.flat, parts.streams, parts.host, parts.cfg
    dev, cuda = f.device, f.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(dev)  # subgroup 0's host buffers are read next
    n = f.bounds(0)[1]
    state, g = f.state(0, n), f.g32[:n]
    saved = [t.clone() for t in (*state, g)]
    g.zero_()
    opt = AdamW(1e-3, 0.0, cfg.adam_beta1, cfg.adam_beta2, cfg.adam_eps)
    one_cpu, one_dev = torch.ones(()), torch.ones((), device=dev)
    dp, scratch = torch.empty(n, device=dev), torch.empty(n, device=dev)
    dm, dv = (torch.empty(n, device=dev, dtype=f.mdtype) for _ in range(2))
    half = HalfMoments(cfg.seed, dev, n) if host.half is not None else None
    dp.copy_(state.p)
    dm.zero_()
    dv.zero_()
    kept, out = torch.zeros(n, dtype=f.wdtype, device=dev), torch.empty_like(f.w[:n])
    segs, sixteen = f.segments[0], f.wdtype != torch.float32

    def on(stream, fn):
        with s.on(stream):
            fn()

    probes = {
        "B": Probe(n, partial(on, s.upload, lambda: scratch.copy_(state.p, non_blocking=cuda)),
                   s.upload),
        "Bd": Probe(n, partial(on, s.offload, lambda: parts.grads.grads_down([kept], 0, n, 0)),
                    s.offload),
        "Ug": Probe(n, lambda: gpu_update(OptState(dp, dm, dv), kept,
                                          scratch if sixteen else None, out, segs, opt, one_dev,
                                          half),
                    s.compute),
        "Uc": Probe(n, partial(host.run, adamw, state, g, segs, opt, one_cpu) if half is None
                    else partial(host.run, adamw_half, state, g, segs, opt, one_cpu, host.half, 0)),
    }
    if sixteen:
        stage = host.stage(0)[:n]
        probes["Dc"] = Probe(n, partial(host.run, stage.copy_, state.p))
    rates = time_probes(probes, stopwatch or Stopwatch(), reps)
    if cuda:
        torch.cuda.synchronize(dev)  # the probes' copies are done: put subgroup 0 back
    for t, keep in zip((*state, g), saved):
        t.copy_(keep)
    return rates
