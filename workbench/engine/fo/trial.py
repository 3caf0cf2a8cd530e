"""``update_stride="auto"``: the performance model proposes, measured steps decide.

The model (``plan/placement.py``) predicts each side of the update phase from rates calibrated one
operation at a time. In a step those operations share the host's memory and the PCIe link, and
the CPU update then runs 10-30% below its calibrated rate (fo_offload benchmark on an H100,
opt-1.3b / 6.7b): the model's favourite schedule can be slower than updating everything on the
CPU. So "auto" takes the model's candidates (``placement.candidates``) and trains one step with
each, timed whole (host clock, the GPU synchronized before and after), then keeps the fastest for
the rest of the run; candidates within ``TIE`` of the fastest count as equally fast, and the one
with the fewest GPU-side parameters (the least GPU memory) wins. Every schedule gives the
same weights (all are exact AdamW), so trying them costs only the steps' speed, never their
result.

The first candidate's first two steps are warm-ups (kernels, the allocator) and are not
compared. The model is refitted to every step but the first (``Proposals.observe``: the CPU
AdamW's rate at each step's DMA load, backward's compute time; ``plan/overlap.py``): after the
second, the candidates are the refitted model's, and each is predicted from the steps before it.
Only candidates with no more GPU-side parameters than the model's own pick are tried, so the
trial needs no more GPU memory than running that pick would; the one exception is a
GPU-resident share, tried only where it fits the GPU memory the run has (``plan/auto.py``).

subgroup_size=auto (``plan/auto.py``). The candidates above are of the first size; once they
are timed, ``then(winner)`` gives the winner's placement at each other size and at each
resident share that fits the GPU memory left over (``plan/auto.py``; the rates are per
parameter, so the model's ranking holds at every size; the size changes only per-subgroup
overheads and how early the CPU side starts), each timed for a step too, and the fastest of all
is kept. Sizes are compared on equal terms: the first step at a new size is not warm-up, since
its buffers are allocated before it (at the largest size, once).

The record (``fo_trial``) lists, per candidate, the model's predicted update phase (under the
step's DMA where it was measured: ``plan/dma.py``) beside the one its step measured
(``timeline.py``: end of backward to the last update work) and their relative error, so a run
shows whether the prediction holds for every schedule tried (within ``WITHIN``).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from workbench.config import RunConfig, Stride
from workbench.engine.events import EventBus, InfoEvent
from workbench.plan import auto, dma, overlap, placement
from workbench.plan.placement import SITE, Candidate, PerfInputs, Placement, Subgroups
from workbench.plan.fo_memory import device_parts, leaner_strides
from workbench.plan.memory import CONTEXT_BYTES

#: Warm-up steps of the engine's trial: the first (kernels, the allocator, a slow first
#: backward) is not measured; the second fits the model (``Proposals.observe``) to the first
#: candidate before any is timed.
WARMUP = 2

#: Step times within 3% of the fastest count as a tie (steps of one placement vary by about
#: that much on an H100 host), settled by GPU memory.
TIE = 0.03


class ScheduleTrial:
    """One timed step per candidate, in order, after ``warmup`` steps on the first.

    ``current`` is the candidate the next step runs with; ``record(seconds, update_s)`` takes
    that step's time (and its measured update phase, when known) and returns the candidate for
    the step after it (the winner once all are timed, when ``done`` turns true). ``then``:
    called once with the winner of the candidates so far, its answer (those not tried yet) is
    tried after them (subgroup_size=auto's other sizes).
    """

    def __init__(self, candidates: list[Candidate], warmup: int = 1,
                 then: Callable[[Candidate], list[Candidate]] | None = None):
        if not candidates:
            raise ValueError("a schedule trial needs at least one candidate")
        self.candidates = list(candidates)
        self.seconds: list[float | None] = [None] * len(candidates)
        self.update_s: list[float | None] = [None] * len(candidates)
        self._warm_left = warmup
        self.steps = 0  # recorded so far, warm-ups included
        self._at = 0
        self._then = then
        self.failed: set[int] = set()  # candidates that could not be placed
        self.over_cap: set[int] = set()  # candidates skipped as over gpu_mem_limit_gb

    @property
    def current(self) -> Candidate:
        return self.candidates[min(self._at, len(self.candidates) - 1)]

    @property
    def done(self) -> bool:
        return self._at >= len(self.candidates)

    def record(self, seconds: float, update_s: float | None = None) -> Candidate:
        """The step just run with ``current`` took ``seconds`` (its update phase ``update_s``);
        the candidate to run next."""
        if self.done:
            raise RuntimeError("the schedule trial is over")
        self.steps += 1
        if self._warm_left > 0:
            self._warm_left -= 1
            return self.current
        self.seconds[self._at], self.update_s[self._at] = seconds, update_s
        return self._advance()

    @property
    def warming(self) -> bool:
        """The next step is a warm-up (not compared)."""
        return self._warm_left > 0

    def revise(self, predict: Callable[[Candidate], Candidate],
               rest: list[Candidate] | None = None) -> None:
        """After a step: the untried candidates predicted anew (``predict``); given ``rest``,
        those after ``current`` (placed already, it stays) are replaced by it."""
        if rest is not None:
            keep = self.candidates[:self._at + 1]
            more = [c for c in rest if all(c.key != k.key for k in keep)]
            self.candidates = keep + more
            self.seconds = self.seconds[:self._at + 1] + [None] * len(more)
            self.update_s = self.update_s[:self._at + 1] + [None] * len(more)
        for i in range(self._at, len(self.candidates)):
            self.candidates[i] = predict(self.candidates[i])

    def skip(self, over_cap: bool = False) -> Candidate:
        """``current`` could not be placed (out of GPU memory) or, ``over_cap``, would not fit
        gpu_mem_limit_gb: it stays untimed, and is listed as such; the candidate to place
        instead (the next, or the winner so far)."""
        (self.over_cap if over_cap else self.failed).add(self._at)
        if self._at + 1 >= len(self.candidates) and not any(x is not None for x in self.seconds):
            raise RuntimeError("no candidate placement fits in GPU memory")
        return self._advance()

    def _advance(self) -> Candidate:
        """Past ``current``; at the end of the candidates, ``then``'s are added once (however
        the last one ended: timed or skipped). The candidate to run next."""
        self._at += 1
        if self.done and self._then is not None:
            then, self._then = self._then, None
            seen = {c.key for c in self.candidates}
            more = [c for c in then(self.winner) if c.key not in seen]
            self.candidates += more
            self.seconds += [None] * len(more)
            self.update_s += [None] * len(more)
        return self.winner if self.done else self.current

    @property
    def winner(self) -> Candidate:
        """Of the timed candidates within ``TIE`` of the fastest (as fast, to one step's
        noise), the one with the fewest GPU-side parameters (the least GPU memory); among
        equal shares, the earlier (the model's better guess)."""
        timed = [(s, i) for i, s in enumerate(self.seconds) if s is not None]
        if not timed:
            raise RuntimeError("no candidate has been timed yet")
        fastest = min(timed)[0]
        tied = [i for s, i in timed if s <= fastest * (1 + TIE)]
        return self.candidates[min(tied, key=lambda i: (self.candidates[i].gpu_share, i))]

    def summary(self) -> dict:
        """What was tried and what won (the ``fo_trial`` record): per candidate its placement,
        step seconds, and predicted vs measured update phase (``update_s_predicted``, also
        ``predicted_s``; ``update_s_measured``; ``prediction_error``: (predicted - measured)
        / measured); ``within``: how many errors are within ``WITHIN``, of how many known."""
        rows = [{"stride": c.stride, "downcast": SITE[c.cpu_downcast], "gpu_share": c.gpu_share,
                 "subgroup_size": c.size, "gpu_resident_ratio": c.resident,
                 "predicted_s": c.predicted_s, "step_s": s, "update_s_predicted": c.predicted_s,
                 "update_s_measured": u, "prediction_error": error(c.predicted_s, u),
                 "out_of_memory": i in self.failed, "over_cap": i in self.over_cap}
                for i, (c, s, u) in enumerate(zip(self.candidates, self.seconds, self.update_s))]
        known = [r["prediction_error"] for r in rows if r["prediction_error"] is not None]
        return {"candidates": rows,
                "chosen": self.candidates.index(self.winner) if self.done else None,
                "within": [sum(abs(e) <= WITHIN for e in known), len(known)]}


def after_step(t: ScheduleTrial, m: "Proposals", seconds: float, update_s: float | None,
               fresh: Callable[[], list[Candidate]] | None) -> Candidate:
    """``t.record`` a step the model has been refitted to (``m.observe``); then the untried
    candidates predicted anew and, after the last warm-up step, replaced by ``fresh()`` (under
    update_stride=auto: the model's candidates as it now stands, in ``m.first``'s order). The
    candidate for the next step."""
    warmup = t.warming
    nxt = t.record(seconds, update_s)
    if not t.done:
        last = warmup and not t.warming and fresh is not None  # the model's fitted first here
        t.revise(m.predict, m.first(fresh()) if last else None)
    return nxt


#: The prediction target: the predicted update phase within 15% of the measured.
WITHIN = 0.15


def error(predicted: float, measured: float | None) -> float | None:
    """(predicted - measured) / measured, or None without a (positive) measurement."""
    return (predicted - measured) / measured if measured else None


class Proposals:
    """The candidates "auto" tries beyond the first ones (``ScheduleTrial``'s ``then``).

    Args:
        perf: the placement model's inputs (the engine's measured rates).
        numel: parameters in the flat range.
        word: bytes of a compute weight.
        sizes: subgroup_size=auto's sizes (``plan/auto.py``; one: the given size).
        cfg: the run config (update_stride, gpu_resident_ratio, adam_state_dtype,
            gpu_mem_limit_gb).
        device: the engine's device (GPU memory is read there).
        bus: where ``fo_gpu_budget`` and ``fo_model`` go.
        contention: the CPU update under DMA load (``plan/dma.py``; None: predictions ignore it).
        d2h_bps, duplex_bps: the gradient flush's bytes/s and the link's both ways (calibrated;
            with the backward pass a step measures, ``observe``: ``plan/overlap.py``).

    Attributes: ``perf``, ``contention`` and ``bwd``: the model's inputs as the trial's steps
    refitted them (``observe``); ``bwd`` None until a step measured backward.
    """

    def __init__(self, perf: PerfInputs, numel: int, word: int, sizes: tuple[int, ...],
                 cfg: RunConfig, device: torch.device, bus: EventBus,
                 contention: dma.Contention | None = None, d2h_bps: float | None = None,
                 duplex_bps: float | None = None):
        self.perf, self.numel, self.word, self.sizes = perf, numel, word, sizes
        self.contention = self._calibrated = contention
        self._uc = perf.Uc
        self._link = [d2h_bps, duplex_bps]  # the flush's rate rises to what steps show
        self.bwd: overlap.Backward | None = None
        self._seen: list[tuple[float, float]] = []  # (load u, CPU AdamW s / parameter) a step
        self._backward: list[float] = []
        self.cfg, self.device, self.bus = cfg, device, bus
        self.cuda = device.type == "cuda"
        self.base: int | None = None  # under a cap: GPU bytes beside a placement's parts

    @property
    def more_to_try(self) -> bool:
        """Other sizes, or (on a GPU, update_stride=auto, no resident share given) resident
        shares that may fit."""
        return len(self.sizes) > 1 or (self.cuda and self._residents)

    @property
    def _residents(self) -> bool:
        return self.cfg.update_stride == "auto" and self.cfg.gpu_resident_ratio == 0

    def candidate(self, update_stride: Stride, cpu_downcast: bool | None, size: int,
                  resident: float | None = None) -> Candidate:
        """The placement of a stride at a subgroup size and resident share (None: the
        config's), as a trial candidate."""
        rr = self.cfg.gpu_resident_ratio if resident is None else resident
        placed = self.place(update_stride, rr, cpu_downcast, size)
        return Candidate.of(placed, Subgroups.of(self.numel, size).size, rr, self.word == 2)

    def place(self, update_stride: Stride, resident: float, cpu_downcast: bool | None,
              size: int) -> Placement:
        """``dma.place`` at a subgroup size with the model's inputs as they stand."""
        return dma.place(self.perf, Subgroups.of(self.numel, size), update_stride, resident,
                         cpu_downcast,
                         self.contention, self.bwd)

    def predict(self, c: Candidate) -> Candidate:
        """``c`` with the model's prediction as it stands (``observe``)."""
        down = None if c.cpu_downcast is None else bool(c.cpu_downcast)
        return replace(c, predicted_s=self.candidate(c.stride, down, c.size,
                                                     c.resident).predicted_s)

    def observe(self, placed: Placement, busy: tuple[int, float], forward_s: float,
                backward_s: float) -> None:
        """A step ran ``placed``: its CPU AdamW updated ``busy`` [parameters, seconds], its
        forward and backward passes took ``forward_s`` and ``backward_s`` on the GPU. The
        model is refitted to every step so far: the CPU rate and its slowdown under DMA
        (``dma.refit``), backward's compute as the least of twice a forward and a backward
        measured (a backward waits for the gradient flush: at opt-6.7b every one measured
        did), and the flush's rate as at least what a step showed
        (``overlap.flush_rate_shown``: the calibrated one was 33 GB/s on an H100 whose steps
        flushed at 45), so each later candidate is predicted from the steps before it;
        published as ``fo_model``."""
        n, seconds = busy
        if n > 0 and seconds > 0:
            u = (dma.load_share(placed, self.numel, seconds, self._calibrated)
                 if self._calibrated is not None else 0.0)
            self._seen.append((u, seconds / n))
            uc, self.contention = dma.refit(self._calibrated, self._uc, self._seen)
            self.perf = replace(self.perf, Uc=uc)
        d2h, duplex = self._link
        if d2h:
            d2h = self._link[0] = max(d2h, overlap.flush_rate_shown(placed, self.numel,
                                                                    backward_s))
        if backward_s > 0 and d2h:
            self._backward.append(min(backward_s, 2 * forward_s) if forward_s > 0
                                  else backward_s)
            self.bwd = overlap.Backward(min(self._backward), d2h, duplex)
        self.bus.publish(InfoEvent("fo_model", self.fitted()))

    def fitted(self) -> dict:
        """The model's inputs as refitted (the trial record's ``model``)."""
        return {"Uc": self.perf.Uc, "steps": [list(x) for x in self._seen],
                "contention": self.contention.as_dict() if self.contention else None,
                "backward": self.bwd.as_dict() if self.bwd else None}

    def more(self, best: Candidate) -> list[Candidate]:
        """After the first candidates: their best at each other size, under a cap the stride
        with the most GPU subgroups that fits (``fits``), and, at the best's size, each
        GPU-resident share that fits (the model's stride for the rest), published as
        ``fo_gpu_budget``."""
        down = None if best.cpu_downcast is None else bool(best.cpu_downcast)
        out = [self.candidate(best.stride, down, n) for n in self.sizes[1:]]
        if self.capped and self.base is not None:
            model = self.candidate("auto", down, best.size)
            strides = leaner_strides(model.stride, Subgroups(self.numel, best.size).count)
            fit = next((c for c in (self.candidate(k, down, best.size) for k in strides)
                        if self.fits(c)), None)
            out += [fit] if fit is not None else []
        spare = self.gpu_spare() if self._residents else None
        if spare is not None:
            per = auto.resident_bytes(placement.STATE_BYTES[self.cfg.adam_state_dtype],
                                      self.word)
            shares = auto.resident_shares(spare, self.numel, per, 4 * best.size)
            self.bus.publish(InfoEvent("fo_gpu_budget", {"spare_bytes": spare,
                                                         "bytes_per_resident": per,
                                                         "shares": list(shares)}))
            out += [self.candidate("auto", down, best.size, r) for r in shares]
        return out

    @property
    def capped(self) -> bool:
        """A GPU run under gpu_mem_limit_gb: candidates are tried only where they fit it."""
        return self.cuda and self.cfg.gpu_mem_limit_gb > 0

    def first(self, tries: list[Candidate]) -> list[Candidate]:
        """The order to try ``tries`` in: under a cap, the fewest GPU-side parameters first
        (the least memory: its step's peak then tells what every other one adds, ``fits``)."""
        return sorted(tries, key=lambda c: c.gpu_share) if self.capped else list(tries)

    def parts(self, c: Candidate) -> int:
        """GPU bytes of ``c``'s placement (``plan/fo_memory.py``: weights, kept and queued
        gradients, residents, slots, staging)."""
        split = placement.Split(1 - c.gpu_share, c.gpu_share - c.resident, c.resident)
        return sum(device_parts(self.numel, self.word,
                                placement.STATE_BYTES[self.cfg.adam_state_dtype], split, c.size,
                                c.cpu_downcast is False, self.perf.grad_bytes).values())

    def measured(self, c: Candidate) -> None:
        """After the first timed step (``c``'s) under a cap: what all placements share beside
        their parts (activations, the allocator's slack), from the peak allocated so far."""
        if self.capped and self.base is None:
            self.base = torch.cuda.max_memory_allocated(self.device) - self.parts(c)

    def fits(self, c: Candidate) -> bool:
        """Whether ``c`` fits under the cap by the first step's measure (True without a cap
        or before it): the shared base + its parts + ``auto.MARGIN`` within the budget."""
        if not self.capped or self.base is None:
            return True
        budget = int(self.cfg.gpu_mem_limit_gb * 1e9) - CONTEXT_BYTES
        return self.base + self.parts(c) + auto.MARGIN <= budget

    def gpu_spare(self) -> int | None:
        """GPU bytes left for a resident share after the steps so far (None on a CPU):
        ``plan/auto.py::gpu_spare`` of gpu_mem_limit_gb (less the CUDA context, as
        ``runs/limits.py`` caps it) or of the memory this process can have."""
        if not self.cuda:
            return None
        free, _ = torch.cuda.mem_get_info(self.device)
        held = torch.cuda.memory_reserved(self.device)
        limit = self.cfg.gpu_mem_limit_gb
        budget = int(limit * 1e9 - CONTEXT_BYTES) if limit > 0 else free + held
        # Allocated, not reserved: the trial's placements leave freed blocks in the allocator's
        # cache (reserved 34 GB vs 24 GB allocated at opt-6.7b), which the residents reuse.
        return auto.gpu_spare(budget, torch.cuda.max_memory_allocated(self.device))
