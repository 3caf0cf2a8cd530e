"""What bounds a run's step: PCIe, compute or the host, said in one line with its numbers.

A pure function of a ``RunRecord`` (stream events, steps, samples, environment): the live
dashboard, ``compare`` and the report all call ``verdict(rec)``, so they say the same thing.

How it decides. Over the last ``LAST_STEPS`` steps that have per-operation events (the first
step read is left out when there are others: warm-up, or cut by the event retention), each stream's busy time is the union
of its operations' intervals, as a fraction of those steps' summed durations (the span of their
events where durations are missing):
    upload / offload   the PCIe transfers (and codec passes on those streams) of a streaming run
    compute            the block passes (both perturbed forwards, updates)
    cpu                host threads the step waits on (the mirror codec's host pass, fo-offload's
                       CPU optimizer)
The busiest resource names the bound when it is busy for most of the step (``BOUND`` = 60%):
a transfer stream -> PCIe-bound, compute -> compute-bound, cpu -> host-bound. When no stream is
busy that long but together they cover the step, the streams take turns (overlap off):
"serialized". Otherwise the device waits on the host between operations (Python, launches,
data): host-bound. NVML samples over the same window add the GPU's own utilisation and the
link's measured throughput where they exist; work outside the timed spans (MeZO's
perturbations) shows as a gap unless NVML sees the GPU busy through it (``BUSY_GPU``).
"""
from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from workbench.engine.events import OpEvent
from workbench.telemetry.record import RunRecord
from workbench.telemetry.values import num

#: Steps read (the latest that have events): the current state, cheap enough for every refresh.
LAST_STEPS = 10
#: A resource busy for at least this fraction of the step is what bounds it.
BOUND = 0.6
#: NVML utilisation (%) at which a GPU with gaps between timed spans still counts as busy.
BUSY_GPU = 90.0
#: Streams that together cover at least this fraction of the step leave the host no gap to own.
COVERED = 0.85
#: Streams the verdict reads; checkpoint writes run beside the step and are not part of it.
STEP_STREAMS = ("upload", "compute", "offload", "update", "cpu")
TRANSFER_STREAMS = ("upload", "offload")
NOT_TRANSFERS = ("codec",)  # ops on a transfer stream that move no PCIe bytes
GB = 1e9


@dataclass(frozen=True)
class Verdict:
    """The bound of a run's steady step.

    Attributes:
        kind: "pcie-bound", "compute-bound", "host-bound", "serialized" or "unknown".
        text: one line with the numbers, e.g. "PCIe-bound: upload busy 96% of the step at
            49.1 GB/s (78% of link); compute idle 41%".
        busy: stream -> fraction of the step it is busy (0..1).
        step_seconds: the steady step (s): the window of the steps read / their number.
        steps: how many steps were read.
        upload_gbps / offload_gbps: PCIe rate while the stream transfers (GB/s), NaN if none.
        link_gbps: the link's peak per direction (GB/s), NaN when unknown.
        gpu_util: NVML GPU utilisation over the window (%), NaN without samples.
        host_cpu: host CPU utilisation over the window (%), NaN without samples.
    """

    kind: str
    text: str
    busy: dict[str, float] = field(default_factory=dict)
    step_seconds: float = math.nan
    steps: int = 0
    upload_gbps: float = math.nan
    offload_gbps: float = math.nan
    link_gbps: float = math.nan
    gpu_util: float = math.nan
    host_cpu: float = math.nan

    @property
    def idle(self) -> float:
        """Fraction of the step no stream is busy (the host's share), NaN when unknown."""
        covered = self.busy.get("any")
        return math.nan if covered is None else 1.0 - covered


def verdict(rec: RunRecord, last: int = LAST_STEPS) -> Verdict:
    """The bound of ``rec``'s steady step over its ``last`` steps that have events (see the
    module docstring)."""
    steps = sorted({e.step for e in rec.events if e.step >= 0 and e.stream in STEP_STREAMS})
    steps = steps[-(last + 1):]  # + the one before, left out below when there are others
    if not steps:
        why = ("telemetry off" if rec.config.get("telemetry") is False
               else "no step has finished yet" if not rec.steps else "no stream events kept")
        return Verdict("unknown", f"no verdict: {why}")
    read = steps[1:] if len(steps) > 1 else steps
    keep = set(read)
    events = [e for e in rec.events if e.step in keep and e.stream in STEP_STREAMS]
    t0, t1 = min(e.start for e in events), max(e.end for e in events)
    # The steps' own durations, where recorded, include the trailing gap after their last
    # operation; the events' span would leave it out.
    secs = [num(r.get("seconds")) for r in rec.steps if r.get("step") in keep]
    window = sum(secs) if len(secs) == len(read) and all(x > 0 for x in secs) else t1 - t0
    if not window > 0:
        return Verdict("unknown", "no verdict: the steps' events span no time")
    by_stream: dict[str, list[OpEvent]] = {}
    for e in events:
        by_stream.setdefault(e.stream, []).append(e)
    busy = {s: min(union_seconds(by_stream.get(s, ())) / window, 1.0) for s in STEP_STREAMS}
    busy["any"] = min(union_seconds(events) / window, 1.0)
    rates = {s: _rate(by_stream.get(s, ())) for s in TRANSFER_STREAMS}
    link = num(rec.environment.get("pcie peak (bytes/s)")) / GB
    gpu_util = _mean(rec.samples, "gpu util (%)", t0, t1)
    host_cpu = _mean(rec.samples, "host cpu (%)", t0, t1)
    nvml_link = max(_mean(rec.samples, "pcie rx (bytes/s)", t0, t1),
                    _mean(rec.samples, "pcie tx (bytes/s)", t0, t1)) / GB
    v = dict(busy=busy, step_seconds=window / len(read), steps=len(read),
             upload_gbps=rates["upload"], offload_gbps=rates["offload"], link_gbps=link,
             gpu_util=gpu_util, host_cpu=host_cpu)
    cuda = str(rec.config.get("device", "cpu")).startswith("cuda")
    kind, text = _decide(busy, rates, link, gpu_util, nvml_link, cuda)
    return Verdict(kind, text, **v)


def _decide(busy: dict[str, float], rates: dict[str, float], link: float, gpu_util: float,
            nvml_link: float, cuda: bool) -> tuple[str, str]:
    comp, cpu = busy["compute"], busy["cpu"]
    xfer = max(TRANSFER_STREAMS, key=lambda s: busy[s])
    pcie = busy[xfer]
    gpu = (f"GPU busy {gpu_util:.0f}%" if math.isfinite(gpu_util)
           else f"compute busy {comp:.0%} of the step")
    if cpu >= BOUND and cpu >= max(comp, pcie):
        return "host-bound", (f"host-bound: host threads busy {cpu:.0%} of the step (cpu "
                              f"stream); compute idle {1 - comp:.0%}")
    if pcie >= BOUND and pcie >= comp:
        rate = rates[xfer]
        if not cuda:
            return "copy-bound", (f"copy-bound: {xfer} copies busy {pcie:.0%} of the step at "
                                  f"{rate:.1f} GB/s (CPU run: host memory, no PCIe); compute "
                                  f"idle {1 - comp:.0%}")
        of_link = f" ({rate / link:.0%} of link)" if math.isfinite(link) and link > 0 else ""
        return "pcie-bound", (f"PCIe-bound: {xfer} busy {pcie:.0%} of the step at {rate:.1f} "
                              f"GB/s{of_link}; compute idle {1 - comp:.0%}")
    if comp >= BOUND:
        if not cuda:  # the host's cores compute the blocks: say so, not "GPU"
            copies = f", copies {pcie:.0%}" if pcie >= 0.005 else ""
            return "compute-bound", (f"compute-bound (host CPU): blocks {comp:.0%} of the "
                                     f"step{copies}")
        if pcie > 0 or math.isfinite(nvml_link):
            extra = ", " + _link_share(pcie, rates[xfer], link, nvml_link)
        else:
            extra = ""
        return "compute-bound", f"compute-bound: {gpu}{extra}"
    if cuda and gpu_util >= BUSY_GPU:  # busy with work outside the timed spans (perturbations)
        return "compute-bound", (f"compute-bound: GPU busy {gpu_util:.0f}% (NVML); timed "
                                 f"compute {comp:.0%} of the step")
    parts = ", ".join(f"{s} {busy[s]:.0%}" for s in ("upload", "compute", "offload", "update",
                                                      "cpu") if busy[s] >= 0.005)
    if busy["any"] >= COVERED:
        return "serialized", (f"serialized: {parts} of the step, one after another (no stream "
                              f"busy {BOUND:.0%}); overlap would hide the shorter ones")
    gap = 1 - busy["any"]
    if cuda:
        return "host-bound", (f"host-bound: no stream busy {gap:.0%} of the step (the GPU "
                              f"waits on Python, launches, data); {parts}")
    return "host-bound", (f"host-bound: {gap:.0%} of the step outside the timed operations "
                          f"(perturbations, Python, data); {parts}")


def _link_share(busy: float, rate: float, link: float, nvml_link: float) -> str:
    """'PCIe 36% of link' from NVML where sampled, else from the events' bytes and busy time."""
    if math.isfinite(link) and link > 0:
        used = nvml_link if math.isfinite(nvml_link) else (rate * busy if busy > 0 else 0.0)
        return f"PCIe {used / link:.0%} of link"
    if math.isfinite(rate):
        return f"PCIe busy {busy:.0%} of the step at {rate:.1f} GB/s"
    return f"PCIe busy {busy:.0%} of the step"


def union_seconds(events: Iterable[OpEvent]) -> float:
    """Seconds covered by at least one of ``events`` (overlapping intervals counted once)."""
    spans = sorted((e.start, e.end) for e in events if e.end > e.start)
    total, cur_s, cur_e = 0.0, None, None
    for s, e in spans:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def _rate(events: Sequence[OpEvent]) -> float:
    """GB/s of a stream's transfers while they run (codec passes move no PCIe bytes)."""
    moves = [e for e in events if e.op not in NOT_TRANSFERS and e.nbytes > 0]
    secs = union_seconds(moves)
    return sum(e.nbytes for e in moves) / secs / GB if secs > 0 else math.nan


def _mean(samples: Sequence[dict[str, Any]], key: str, t0: float, t1: float) -> float:
    """Mean of ``key`` over the samples taken in [t0, t1] (s). Samples are appended in time
    order, so the window is found by bisection: the live view asks on every refresh, and an
    hour at 20 Hz is 72,000 samples."""
    lo = bisect.bisect_left(samples, t0, key=_t)
    hi = bisect.bisect_right(samples, t1, key=_t)
    vals = [num(s.get(key)) for s in samples[lo:hi]]
    vals = [v for v in vals if math.isfinite(v)]
    return statistics.fmean(vals) if vals else math.nan


def _t(sample: dict[str, Any]) -> float:
    t = num(sample.get("t (s)"))
    return t if math.isfinite(t) else -math.inf  # an untimed sample sorts first, unread