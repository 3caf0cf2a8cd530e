"""fo-offload's performance-model inputs, measured with the engine's own parts.

``measure(parts)`` times, on one full subgroup (subgroup 0's page-locked host buffers):
    B   its fp32 masters up the link (the copy the uploads and prefetches make)
    Bd  its gradients down the link (the gradient flush's chunked upcast and D2H)
    Ug  its GPU update (kept-gradient upcast, fused AdamW, compute-weight downcast)
    Uc  its CPU update on the host side's worker (the step's thread count)
    Dc  its 16-bit downcast into a pinned staging buffer (16-bit compute weights only). The
        one-pass CPU AdamW writes them in its own pass, and alone that costs it little
        (``benchmarks/host_adamw.py``); but in steps, CPU-downcast placements measured as much
        slower than GPU-downcast ones as a separate pass predicts (opt-6.7b, one H100: +24% all
        on the CPU, +36% at stride 3), so Dc stays that pass's time for either kernel
    Ucd Uc again, under DMA load: while ``load`` keeps host memory busy as a step's copies do
        (on CUDA ``PinnedTraffic``: pinned copies up and down the link on side streams, the
        link's own rate, for all of the timed update); none without a load (a CPU-only machine)
    Xd  that load: bytes it moved per repetition, and in how long (``per_s``: its bytes/s)
with bf16 moments (adam_state_dtype=bf16) the updates as the engine runs them then (upcast,
AdamW, stochastic rounding: ``engine/fo/moments.py``), each ``reps`` times after a warm-up
(``time_probes``: the median, the spread kept), on zero gradients; subgroup 0's state is put
back afterwards, bit for bit. The engine calls it once, when
it is built (``FOOffloadEngine``'s ``measure``), and places its subgroups with the result
(``plan/placement.py``; Ucd and Xd: ``plan/dma.py``, the CPU update under DMA load).
"""
from __future__ import annotations

import math
import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Callable, ContextManager, Protocol

import torch

from workbench.engine.fo.adamw import AdamW, OptState
from workbench.engine.fo.gpu import gpu_update
from workbench.engine.fo.moments import HalfMoments
from workbench.engine.fo.parts import FOParts
from workbench.plan.placement import Rate

#: Timed repetitions of each probe (after ``WARMUP`` untimed ones); the rate is their median.
REPS, WARMUP = 5, 1


@dataclass(frozen=True)
class Probe:
    """One repetition of a step operation on one subgroup: ``run()`` moves or updates ``n``
    parameters; it is timed on the host clock (``stream`` None) or by CUDA events on
    ``stream`` (work it enqueues there). ``load``: entered around each timed run (its traffic
    starts before the clock and is drained after it)."""

    n: int
    run: Callable[[], None]
    stream: object = None
    load: Callable[[], ContextManager] | None = None


class Load(Protocol):
    """Host-memory traffic beside a timed run: ``load(seconds)`` is a context manager that keeps
    it going for at least ``seconds`` (the run's estimate) and, on exit, appends (bytes moved,
    seconds it took) to ``moved``."""

    moved: list[tuple[int, float]]

    def __call__(self, seconds: float) -> ContextManager: ...


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
        seconds = []
        for _ in range(warmup + reps):
            with probe.load() if probe.load is not None else nullcontext():
                seconds.append(stopwatch(probe))
        seconds = seconds[warmup:]
        out[name] = Rate(probe.n, tuple(max(s, 1e-12) for s in seconds))
    return out


def measure(parts: FOParts, stopwatch: Callable[[Probe], float] | None = None,
            reps: int = REPS, load: Load | None = None) -> dict[str, Rate]:
    """The rates of an fo-offload engine's ``parts`` (between steps), by name (``Rate``);
    ``load``: the DMA stand-in Ucd is timed under (default: ``PinnedTraffic`` on CUDA, none
    on a CPU: no Ucd, Xd)."""
    f, s, host, cfg = parts.flat, parts.streams, parts.host, parts.cfg
    dev, cuda = f.device, f.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(dev)  # subgroup 0's host buffers are read next
    n = f.bounds(0)[1]
    state, g = f.state(0, n), f.g[:n]
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
        "Uc": Probe(n, partial(host.run, host.update, state, g, segs, opt, one_cpu)),
    }
    if sixteen:
        stage = host.stage(0)[:n]
        probes["Dc"] = Probe(n, partial(host.run, stage.copy_, state.p))
    stopwatch = stopwatch or Stopwatch()
    rates = time_probes(probes, stopwatch, reps)
    if load is None and cuda:
        load = PinnedTraffic(dev, 4 * rates["B"].per_s)
    if load is not None:  # Uc again, under a load sized from Uc alone
        est = rates["Uc"].median_s
        under = Probe(n, probes["Uc"].run, load=partial(load, est))
        rates.update(under_load(under, load, stopwatch, reps))
    if cuda:
        torch.cuda.synchronize(dev)  # the probes' copies are done: put subgroup 0 back
    for t, keep in zip((*state, g), saved):
        t.copy_(keep)
    return rates


def under_load(probe: Probe, load: Load, stopwatch: Callable[[Probe], float],
               reps: int = REPS, warmup: int = WARMUP) -> dict[str, Rate]:
    """"Ucd": ``probe`` timed under its load; "Xd": the load's bytes per repetition and the
    seconds they took (``per_s``: bytes/s), of the same timed repetitions."""
    load.moved.clear()
    rate = time_probes({"Ucd": probe}, stopwatch, reps, warmup)["Ucd"]
    moved = load.moved[warmup:]
    nbytes = int(statistics.median(b for b, _ in moved))
    return {"Ucd": rate, "Xd": Rate(nbytes, tuple(max(s, 1e-12) * nbytes / max(b, 1)
                                                 for b, s in moved))}


class PinnedTraffic:
    """A step's DMA stand-in on CUDA: page-locked copies up and down the link at once, on two
    side streams, in ``CHUNK``-byte pieces, enqueued to last ``COVER`` x the run's estimate at
    ``link_bps`` each way (the GPU side's prefetches and flush-outs keep the link busy so).
    On exit: the copies still running when the timed run ended (else the next run's estimate
    doubles), then drained; ``moved`` gets both directions' bytes and the longer one's GPU time.

    Args:
        device: the CUDA device.
        link_bps: bytes/s one direction is expected to carry (the measured pinned H2D rate).
    """

    CHUNK = 64 * 2 ** 20
    COVER = 3.0

    def __init__(self, device, link_bps: float):
        self.device, self.link_bps = device, max(link_bps, 1e9)
        n = self.CHUNK // 4
        self.host_up = torch.empty(n, pin_memory=True)  # calibration only: freed with it
        self.host_down = torch.empty(n, pin_memory=True)
        self.dev_up, self.dev_down = (torch.empty(n, device=device) for _ in range(2))
        self.streams = (torch.cuda.Stream(device), torch.cuda.Stream(device))
        self.scale = 1.0
        self.moved: list[tuple[int, float]] = []

    def __call__(self, seconds: float) -> ContextManager:
        return _Traffic(self, seconds * self.scale)


class _Traffic:
    def __init__(self, traffic: PinnedTraffic, seconds: float):
        self.t, self.seconds = traffic, seconds

    def __enter__(self):
        t = self.t
        self.count = max(2, math.ceil(t.COVER * self.seconds * t.link_bps / t.CHUNK))
        self.events = []
        for stream, dst, src in zip(t.streams, (t.dev_up, t.host_down), (t.host_up, t.dev_down)):
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record(stream)
            with torch.cuda.stream(stream):
                for _ in range(self.count):
                    dst.copy_(src, non_blocking=True)
            end.record(stream)
            self.events.append((start, end))
        return self

    def __exit__(self, *exc):
        t = self.t
        if any(end.query() for _, end in self.events):  # done before the timed run was:
            t.scale *= 2  # the next one gets copies for twice as long
        for _, end in self.events:
            end.synchronize()  # calibration only, before training
        seconds = max(start.elapsed_time(end) for start, end in self.events) / 1e3
        t.moved.append((2 * self.count * t.CHUNK, seconds))
        return False
