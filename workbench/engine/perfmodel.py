"""The update-phase performance model of interleaved optimizer states, and its measured inputs.

Inputs, all in parameters per second (Deep Optimizer States, section 4.2), each measured by
the engine on its own buffers with the step's own code (``calibrate``: one subgroup, the
update thread count, pinned memory; the median of ``REPS`` runs, their spread recorded):
    B   host <-> GPU link: pinned H2D of fp32, bytes / 4
    Ug  AdamW update on the GPU (fused kernel)
    Uc  AdamW update on the CPU (the engine's multi-threaded CPU path)
    Dc  CPU fp32 -> 16-bit conversion

Equation 1 of the paper balances k CPU-updated subgroups of S parameters against one
GPU-updated subgroup. The CPU spends k S (1/Uc + 1/Dc); the GPU side spends the PCIe time of
swapping one subgroup's (p, m, v) in and out, 3 S / B each way, plus the 16-bit upload of the
k CPU-updated subgroups, k S / 2B, on the H2D link, plus S / Ug of update:

    k (1/Uc + 1/Dc) = 3/B + k/(2B) + 1/Ug
    k = (3/B + 1/Ug) / (1/Uc + 1/Dc - 1/(2B))

Here the upload term is ``w / B`` with w = (bytes of a compute weight) / 4: 1/2 for bf16/fp16
weights as in the paper, 1 for fp32 weights (then nothing is downcast: Dc = inf). 16-bit
weights may also go up as fp32 masters and be downcast on the GPU (``site``): no CPU pass,
twice the bytes, the fp32 case of the model; the engine takes the site predicted faster.

Reading k. The derivation defines k as the CPU : GPU ratio of subgroup counts (k : 1), which is
what the model balances. Algorithm 1's test ``(i + 1) % k == 0`` sends every k-th subgroup to
the GPU, which is a (k-1) : 1 ratio, one off from the derivation; we follow the derivation.
With a fraction f of the subgroups on the GPU, the two sides take (per parameter)

    T_cpu(f) = (1 - f) a             a = 1/Uc + 1/Dc
    T_gpu(f) = f b + (1 - f) c       b = 3/B + 1/Ug,  c = w/B

and the update phase takes T(f) = max(T_cpu, T_gpu). T_cpu falls and T_gpu rises with f, so
the optimum is where they are equal: (1 - f)(a - c) = f b, i.e. (1 - f) / f = b / (a - c) = k,
f* = 1 / (1 + k). This is the balance condition both for k >= 1 and for k < 1.

Schedules are integers (``RunConfig.update_stride``): stride s > 0 puts every s-th subgroup
on the GPU (f = 1/s, ratio (s-1) : 1); stride -m puts m of every m+1 on the GPU
(f = m/(m+1), ratio 1 : m), the generalisation for a GPU path faster than the CPU path
(k < 1, as on the H200 machine: Uc 0.76 G/s vs B 13.75 G/s). ``stride`` returns whichever of
the two schedules around f* has the smaller predicted T. With the paper's own example
(B 3, Ug 35, Uc 2, Dc 8.7 G params/s) k = 2.29 and this gives stride 3 (2 : 1), where the
paper ran stride 2 (Algorithm 1's reading): the model is pessimistic about the GPU side,
since it adds the update time to the transfer time that the pipeline actually overlaps.
When a <= c (the CPU updates faster than the link can even carry the result) nothing goes to
the GPU: ``NO_GPU``.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch

#: A stride larger than any subgroup count: no subgroup is updated on the GPU.
NO_GPU = 2**31 - 1


@dataclass(frozen=True)
class PerfInputs:
    """Measured (or given) model inputs, params/s; ``word_bytes`` of a compute weight."""

    B: float
    Ug: float
    Uc: float
    Dc: float
    word_bytes: int = 2

    def as_dict(self) -> dict:
        return {k: (v if math.isfinite(v) else None) if isinstance(v, float) else v
                for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Split:
    """Shares of all parameters updated on the CPU, on the GPU after a prefetch (interleaved),
    and on the GPU from a static resident copy (fractions, summing to 1)."""

    cpu: float
    gpu: float
    resident: float = 0.0


def _terms(B: float, Ug: float, Uc: float, Dc: float,
           word_bytes: int) -> tuple[float, float, float]:
    """(a, b, c) of the module docstring, seconds per parameter."""
    a = 1.0 / Uc + 1.0 / Dc
    b = 3.0 / B + 1.0 / Ug
    c = (word_bytes / 4.0) / B
    return a, b, c


def balance_ratio(B: float, Ug: float, Uc: float, Dc: float, *, word_bytes: int = 2) -> float:
    """Equation 1: k = (3/B + 1/Ug) / (1/Uc + 1/Dc - w/B), the CPU : GPU subgroup ratio that
    balances both sides (w = word_bytes / 4; the paper's 1/(2B) for 16-bit weights).
    ``math.inf`` when the denominator is <= 0 (keep everything on the CPU)."""
    a, b, c = _terms(B, Ug, Uc, Dc, word_bytes)
    return b / (a - c) if a > c else math.inf


def gpu_fraction(stride_: int) -> float:
    """Share of subgroups a stride sends to the GPU: 1/s for s > 0, m/(m+1) for s = -m."""
    if stride_ == 0:
        raise ValueError("update_stride: 0 is not a stride (use a positive or negative whole "
                         "number)")
    return 1.0 / stride_ if stride_ > 0 else -stride_ / (1.0 - stride_)


def fewer(stride_: int) -> int:
    """The next stride that sends a smaller share of subgroups to the GPU: s + 1 for s > 1;
    for -m (m of every m + 1), -(m - 1), and 2 (one in two) after -2. Stride 1 (all on the
    GPU) has no next one (-m comes ever closer to it as m grows): 2, as ``stride`` never
    proposes 1."""
    if stride_ > 0:
        return stride_ + 1
    return 2 if stride_ >= -2 else stride_ + 1


def _cost(f: float, a: float, b: float, c: float) -> float:
    return max((1.0 - f) * a, f * b + (1.0 - f) * c)


def stride(B: float, Ug: float, Uc: float, Dc: float, *, word_bytes: int = 2) -> int:
    """The update stride for the given rates (params/s): s > 0 sends every s-th subgroup to the
    GPU, -m sends m of every m + 1; the integer schedule next to the balance point
    f* = 1/(1 + k) (k from ``balance_ratio``) with the smaller predicted update time."""
    k = balance_ratio(B, Ug, Uc, Dc, word_bytes=word_bytes)
    if not math.isfinite(k):
        return NO_GPU
    a, b, c = _terms(B, Ug, Uc, Dc, word_bytes)
    if k >= 1.0:  # ratio r : 1 with r = s - 1 around k; ties keep fewer GPU subgroups
        lo = int(math.floor(k)) + 1
        cands = [lo + 1, lo]
    else:  # ratio 1 : m with m around 1/k; -1 is the same schedule as stride 2
        m = max(1, int(math.floor(1.0 / k)))
        cands = [-m if m > 1 else 2, -(m + 1)]
    return min(cands, key=lambda s: _cost(gpu_fraction(s), a, b, c))


def site(p: "PerfInputs", cpu_downcast: bool) -> tuple[float, float, float, float, int]:
    """(B, Ug, Uc, Dc, word_bytes) as the model sees a downcast site: on the CPU before the
    upload (16-bit words go up), or on the GPU after it (fp32 goes up, Dc = inf)."""
    if cpu_downcast:
        return p.B, p.Ug, p.Uc, p.Dc, p.word_bytes
    return p.B, p.Ug, p.Uc, math.inf, 4


def sides(n_params: int, split: Split, B: float, Ug: float, Uc: float, Dc: float, *,
          word_bytes: int = 2) -> tuple[float, float]:
    """(CPU side, GPU side) of the update phase in seconds, for ``n_params`` parameters split as
    ``split``: n cpu (1/Uc + 1/Dc), and n (gpu (3/B + 1/Ug) + cpu w/B + resident/Ug)."""
    a, b, c = _terms(B, Ug, Uc, Dc, word_bytes)
    return (n_params * split.cpu * a,
            n_params * (split.gpu * b + split.cpu * c + split.resident / Ug))


def predict_update_seconds(n_params: int, split: Split, B: float, Ug: float, Uc: float,
                           Dc: float, *, word_bytes: int = 2) -> float:
    """Predicted update-phase seconds: the slower of the two ``sides``."""
    return max(sides(n_params, split, B, Ug, Uc, Dc, word_bytes=word_bytes))


# --- measurement ------------------------------------------------------------------------------
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


@dataclass(frozen=True)
class Rate:
    """A measured rate: ``n`` parameters per repetition, ``seconds`` of each timed one."""

    n: int
    seconds: tuple[float, ...]

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def per_s(self) -> float:
        """Parameters per second at the median repetition."""
        return self.n / max(self.median_s, 1e-12)

    @property
    def spread(self) -> float:
        """(slowest - fastest) / median repetition: 0.1 means the runs lie within 10%."""
        return (max(self.seconds) - min(self.seconds)) / max(self.median_s, 1e-12)

    def as_dict(self) -> dict:
        return {"per_s": self.per_s, "median_s": self.median_s, "spread": self.spread,
                "n": self.n, "seconds": list(self.seconds)}


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


def calibrate(probes: dict[str, Probe], stopwatch: Callable[[Probe], float],
              reps: int = REPS, warmup: int = WARMUP) -> dict[str, Rate]:
    """Each probe run ``warmup + reps`` times; its ``Rate`` keeps the timed ``reps`` (the rate
    is their median, so one slow or fast outlier does not move it)."""
    out = {}
    for name, probe in probes.items():
        seconds = [stopwatch(probe) for _ in range(warmup + reps)][warmup:]
        out[name] = Rate(probe.n, tuple(max(s, 1e-12) for s in seconds))
    return out


def inputs(rates: dict[str, Rate], word_bytes: int) -> PerfInputs:
    """The model's inputs from measured rates ("B" is fp32 parameters per second up the link;
    no "Dc" probe means nothing is downcast: Dc = inf)."""
    dc = rates["Dc"].per_s if "Dc" in rates else math.inf
    return PerfInputs(rates["B"].per_s, rates["Ug"].per_s, rates["Uc"].per_s, dc, word_bytes)
