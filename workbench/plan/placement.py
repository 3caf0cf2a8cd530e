"""fo-offload's placement: which optimizer subgroups are updated on the GPU, and what it costs.

The one model of this decision: the engine (``engine/fo``) places its subgroups with it from
rates it measured (``calibrate/fo.py``), the planner (``plan/fo.py``) from a machine profile.
Pure arithmetic (no torch), like the rest of ``plan/``.

Inputs, all in parameters per second (Deep Optimizer States, section 4.2), each measured with
the step's own operations on one subgroup (``calibrate/fo.py``: the update thread count, pinned
memory; the median of its repetitions, their spread recorded):
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

bf16 moments (adam_state_dtype=bf16): an interleaved subgroup's (p, m, v) is 8 B a parameter,
not 12, so the swap term 3/B becomes ``state_words``/B = 2/B (``STATE_BYTES``).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, replace
from workbench.config import Stride

#: A stride larger than any subgroup count: no subgroup is updated on the GPU.
NO_GPU = 2**31 - 1

# The buffers the engine allocates for a placement (the planner counts the same ones).
N_SLOTS = 3  # GPU slots: one prefetching, one updating, one flushing out
#: Elements of p, m, v a GPU slot holds: an interleaved subgroup goes through the slots in
#: pieces of at most this many (3 slots x 4 fp32 buffers x 32 MiB = 384 MiB, whatever
#: subgroup_size; subgroup-sized slots were 2.4 GB at 50 M).
SLOT_PIECE = 1 << 23
CHUNK = 1 << 24  # elements upcast to fp32 at a time for a gradient flush (64 MiB a buffer)
N_STAGES = 4  # pinned 16-bit staging buffers for uploads of CPU-downcast weights
#: Bytes of one parameter's fp32 master and two Adam moments, by ``adam_state_dtype``.
STATE_BYTES = {"fp32": 12, "bf16": 8}


def state_words(adam_state_dtype: str) -> float:
    """(p, m, v) of one parameter in fp32 words (what an interleaved swap moves each way)."""
    return STATE_BYTES[adam_state_dtype] / 4


@dataclass(frozen=True)
class PerfInputs:
    """Measured (or given) model inputs, params/s; ``word_bytes`` of a compute weight;
    ``state_words``: (p, m, v) of a parameter in fp32 words (3, or 2 with bf16 moments);
    ``grad_bytes`` of a flushed gradient (4 as fp32; 2 for the one-pass CPU AdamW)."""

    B: float
    Ug: float
    Uc: float
    Dc: float
    word_bytes: int = 2
    state_words: float = 3.0
    grad_bytes: int = 4

    def as_dict(self) -> dict:
        return {k: (v if math.isfinite(v) else None) if isinstance(v, float) else v
                for k, v in asdict(self).items()}

    @property
    def rates(self) -> tuple[float, float, float, float]:
        """(B, Ug, Uc, Dc), as the model's functions take them."""
        return self.B, self.Ug, self.Uc, self.Dc

    def at_site(self, cpu_downcast: bool) -> "PerfInputs":
        """The inputs as the model sees a downcast site: on the CPU before the upload (16-bit
        words go up), or on the GPU after it (fp32 goes up, Dc = inf)."""
        if cpu_downcast:
            return self
        return replace(self, Dc=math.inf, word_bytes=4)

    @property
    def shape(self) -> dict:
        """The keyword arguments of the model's functions besides the rates."""
        return {"word_bytes": self.word_bytes, "state_words": self.state_words}


@dataclass(frozen=True)
class Split:
    """Shares of all parameters updated on the CPU, on the GPU after a prefetch (interleaved),
    and on the GPU from a static resident copy (fractions, summing to 1)."""

    cpu: float
    gpu: float
    resident: float = 0.0


def _terms(B: float, Ug: float, Uc: float, Dc: float, word_bytes: int,
           state_words: float = 3.0) -> tuple[float, float, float]:
    """(a, b, c) of the module docstring, seconds per parameter."""
    a = 1.0 / Uc + 1.0 / Dc
    b = state_words / B + 1.0 / Ug
    c = (word_bytes / 4.0) / B
    return a, b, c


def balance_ratio(B: float, Ug: float, Uc: float, Dc: float, *, word_bytes: int = 2,
                  state_words: float = 3.0) -> float:
    """Equation 1: k = (3/B + 1/Ug) / (1/Uc + 1/Dc - w/B), the CPU : GPU subgroup ratio that
    balances both sides (w = word_bytes / 4; the paper's 1/(2B) for 16-bit weights).
    ``math.inf`` when the denominator is <= 0 (keep everything on the CPU)."""
    a, b, c = _terms(B, Ug, Uc, Dc, word_bytes, state_words)
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


def stride(B: float, Ug: float, Uc: float, Dc: float, *, word_bytes: int = 2,
           state_words: float = 3.0) -> int:
    """The update stride for the given rates (params/s): s > 0 sends every s-th subgroup to the
    GPU, -m sends m of every m + 1; the integer schedule next to the balance point
    f* = 1/(1 + k) (k from ``balance_ratio``) with the smaller predicted update time."""
    k = balance_ratio(B, Ug, Uc, Dc, word_bytes=word_bytes, state_words=state_words)
    if not math.isfinite(k):
        return NO_GPU
    a, b, c = _terms(B, Ug, Uc, Dc, word_bytes, state_words)
    if k >= 1.0:  # ratio r : 1 with r = s - 1 around k; ties keep fewer GPU subgroups
        lo = int(math.floor(k)) + 1
        cands = [lo + 1, lo]
    else:  # ratio 1 : m with m around 1/k; -1 is the same schedule as stride 2
        m = max(1, int(math.floor(1.0 / k)))
        cands = [-m if m > 1 else 2, -(m + 1)]
    return min(cands, key=lambda s: _cost(gpu_fraction(s), a, b, c))


def sides(n_params: int, split: Split, B: float, Ug: float, Uc: float, Dc: float, *,
          word_bytes: int = 2, state_words: float = 3.0) -> tuple[float, float]:
    """(CPU side, GPU side) of the update phase in seconds, for ``n_params`` parameters split as
    ``split``: n cpu (1/Uc + 1/Dc), and n (gpu (3/B + 1/Ug) + cpu w/B + resident/Ug); 2/B for
    bf16 moments (``state_words``)."""
    a, b, c = _terms(B, Ug, Uc, Dc, word_bytes, state_words)
    return (n_params * split.cpu * a,
            n_params * (split.gpu * b + split.cpu * c + split.resident / Ug))


def predict_update_seconds(n_params: int, split: Split, B: float, Ug: float, Uc: float,
                           Dc: float, *, word_bytes: int = 2, state_words: float = 3.0) -> float:
    """Predicted update-phase seconds: the slower of the two ``sides``."""
    return max(sides(n_params, split, B, Ug, Uc, Dc, word_bytes=word_bytes,
                     state_words=state_words))


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


def inputs(rates: dict[str, Rate], word_bytes: int, state_words: float = 3.0,
           grad_bytes: int = 4) -> PerfInputs:
    """The model's inputs from measured rates ("B" is fp32 parameters per second up the link;
    no "Dc" probe means nothing is downcast: Dc = inf)."""
    dc = rates["Dc"].per_s if "Dc" in rates else math.inf
    return PerfInputs(rates["B"].per_s, rates["Ug"].per_s, rates["Uc"].per_s, dc, word_bytes,
                      state_words, grad_bytes)


# --- placement ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Subgroups:
    """The flat parameter range (canonical group order) cut into subgroups of ``size``
    parameters; the last may be shorter."""

    numel: int
    size: int

    @classmethod
    def of(cls, numel: int, size: int) -> "Subgroups":
        """``numel`` parameters in subgroups of ``size``, at least 1 and at most all of them."""
        return cls(numel, max(1, min(size, numel)))

    @property
    def count(self) -> int:
        return -(-self.numel // self.size)

    def bounds(self, j: int) -> tuple[int, int]:
        """Subgroup j's [start, end) in the flat parameter order."""
        return j * self.size, min((j + 1) * self.size, self.numel)

    def numel_of(self, j: int) -> int:
        a, b = self.bounds(j)
        return b - a

    def split(self, schedule: "Schedule") -> Split:
        """The shares of all parameters each side of ``schedule`` updates."""
        n = self.numel
        return Split(sum(map(self.numel_of, schedule.cpu)) / n,
                     sum(map(self.numel_of, schedule.gpu)) / n,
                     sum(map(self.numel_of, schedule.resident)) / n)

    def pieces(self, schedule: "Schedule") -> list[tuple[int, int, int]]:
        """(subgroup, lo, hi): the interleaved subgroups in processing order, each cut into
        slot-sized pieces of at most ``SLOT_PIECE`` elements."""
        return [(j, lo, min(lo + SLOT_PIECE, self.bounds(j)[1]))
                for j in schedule.gpu for lo in range(*self.bounds(j), SLOT_PIECE)]


@dataclass(frozen=True)
class Schedule:
    """Where each subgroup is updated. ``gpu`` and ``cpu`` are in processing order (the CPU
    side takes its subgroups as their gradients land: last first)."""

    stride: int
    resident: range  # static GPU residents: the last subgroups
    gpu: tuple[int, ...]  # interleaved: prefetched, updated on the GPU, flushed out
    cpu: tuple[int, ...]  # updated on the CPU, last first


def make_schedule(n_sub: int, stride_: int, resident_ratio: float) -> Schedule:
    """Algorithm 1's placement: subgroup i (0-based) goes to the GPU when it is resident or
    when (i + 1) % k == 0 for stride k > 0; for k = -m, unless (i + 1) % (m + 1) == 0."""
    if stride_ == 0:
        raise ValueError("update_stride: 0 is not a stride")
    r = min(n_sub, int(resident_ratio * n_sub + 1e-9))
    gpu, cpu = [], []
    for i in range(n_sub - r):
        on_gpu = (i + 1) % stride_ == 0 if stride_ > 0 else (i + 1) % (1 - stride_) != 0
        (gpu if on_gpu else cpu).append(i)
    return Schedule(stride_, range(n_sub - r, n_sub), tuple(gpu), tuple(reversed(cpu)))


@dataclass(frozen=True)
class Placement:
    """A placement and what the model predicts of it: ``schedule`` (where each subgroup is
    updated), ``split`` (the parameter shares of each side), ``cpu_downcast`` (16-bit weights
    downcast on the CPU; False: on the GPU, or fp32 weights), ``inputs`` (the model's inputs
    at that downcast site) and ``predicted_s`` (update-phase seconds)."""

    schedule: Schedule
    split: Split
    cpu_downcast: bool
    inputs: PerfInputs
    predicted_s: float

    def sides(self, n_params: int) -> tuple[float, float]:
        """(CPU side, GPU side) seconds of the update phase (``sides``)."""
        return sides(n_params, self.split, *self.inputs.rates, **self.inputs.shape)

    @property
    def balance(self) -> float:
        """Equation 1's k at these inputs (``balance_ratio``)."""
        return balance_ratio(*self.inputs.rates, **self.inputs.shape)


def place_at(perf: PerfInputs, groups: Subgroups, update_stride: Stride, resident_ratio: float,
             cpu_downcast: bool) -> Placement:
    """The placement for one downcast site: the model's stride ("auto") or the given one."""
    at = perf.at_site(cpu_downcast)
    k = stride(*at.rates, **at.shape) if update_stride == "auto" else update_stride
    schedule = make_schedule(groups.count, k, resident_ratio)
    split = groups.split(schedule)
    t = predict_update_seconds(groups.numel, split, *at.rates, **at.shape)
    return Placement(schedule, split, cpu_downcast and perf.word_bytes < 4, at, t)


def sites(sixteen: bool, cpu_downcast: bool | None = None) -> tuple[bool, ...]:
    """Where 16-bit weights may be downcast, to weigh: ``cpu_downcast``'s site (True: the CPU),
    or, None, both for 16-bit compute weights (``sixteen``) and the GPU (none) for fp32."""
    return (False, True) if sixteen and cpu_downcast is None else (bool(cpu_downcast),)


def place(perf: PerfInputs, groups: Subgroups, update_stride: Stride, resident_ratio: float,
          cpu_downcast: bool | None = None) -> Placement:
    """The placement of ``update_stride`` ("auto": the model's stride), with 16-bit weights
    downcast where ``cpu_downcast`` says (None: at the site predicted faster; GPU on a tie)."""
    return min((place_at(perf, groups, update_stride, resident_ratio, down)
                for down in sites(perf.word_bytes < 4, cpu_downcast)),
               key=lambda placed: placed.predicted_s)


SITE = {True: "cpu", False: "gpu", None: "none"}  # where 16-bit weights are downcast


@dataclass(frozen=True)
class Candidate:
    """A placement to try: ``stride`` (``NO_GPU``: all on the CPU), where 16-bit weights are
    downcast (True: CPU, False: GPU, None: fp32 weights, nothing to downcast), the model's
    predicted update seconds, the share of parameters updated on the GPU side
    (interleaved and resident), the subgroup size (parameters) and the resident share
    (gpu_resident_ratio)."""

    stride: int
    cpu_downcast: bool | None
    predicted_s: float
    gpu_share: float
    size: int = 0
    resident: float = 0.0

    @classmethod
    def of(cls, placed: Placement, size: int, resident: float, sixteen: bool) -> "Candidate":
        """``placed`` (at subgroup ``size`` and resident share ``resident``) as a candidate;
        ``cpu_downcast`` None unless the compute weights are 16-bit (``sixteen``)."""
        return cls(placed.schedule.stride, placed.cpu_downcast if sixteen else None,
                   placed.predicted_s, placed.split.gpu + placed.split.resident, size, resident)

    @property
    def key(self) -> tuple[int, bool, int, float]:
        """What makes two candidates the same placement: stride, downcast site, size and
        resident share."""
        return self.stride, bool(self.cpu_downcast), self.size, self.resident


def candidates(perf: PerfInputs, groups: Subgroups, resident_ratio: float) -> list[Candidate]:
    """What "auto" tries (``engine/fo/trial.py``): at each downcast site the model's stride, the
    next stride with fewer GPU subgroups and the all-CPU placement, fastest predicted first,
    keeping only those with no more GPU-side parameters than the model's own pick (``place``),
    so none needs more GPU memory than it."""
    sixteen = perf.word_bytes < 4
    placed, models = [], []
    for down in sites(sixteen):
        model = place_at(perf, groups, "auto", resident_ratio, down)
        models.append(model)
        placed += [model, place_at(perf, groups, NO_GPU, resident_ratio, down)]
        if model.schedule.stride != NO_GPU:
            placed.append(place_at(perf, groups, fewer(model.schedule.stride), resident_ratio,
                                   down))
    pick = min(models, key=lambda m: m.predicted_s)  # what place(perf, "auto") picks
    return ranked(placed, pick, groups.size, resident_ratio, sixteen)


def ranked(placed: list[Placement], pick: Placement, size: int, resident: float,
           sixteen: bool) -> list[Candidate]:
    """``placed`` as candidates, fastest predicted first, each placement once, none with more
    GPU-side parameters than the model's own ``pick`` (so no candidate needs more GPU memory
    than it)."""
    most = pick.split.gpu + pick.split.resident
    out: list[Candidate] = []
    for p in sorted(placed, key=lambda p: p.predicted_s):
        c = Candidate.of(p, size, resident, sixteen)
        if c.gpu_share <= most and all(o.key != c.key for o in out):
            out.append(c)
    return out
