"""How far a run's timings can be trusted, and when a ratio of two runs is within the noise.

Every run records (``summary.noise`` in run.json, from the record alone):
    step_spread      interquartile range / median of its steady step times (warm-up left out,
                     ``telemetry.steady``): how much its own steps scatter
    steady_steps     how many steps that spread is over
    other_cpu_pct    the host CPU other processes took while it ran (%, all cores = 100): the
                     sampler's ``host cpu (%)`` less this process's ``process cpu (%)``
    load_start / load_end   the 1-minute load average when it started and when it was saved
    threads          torch's intra-op threads

A ratio of two runs' speeds is *within noise* when it is closer to 1 than ``margin``: the larger
of the two runs' step spreads, ``FLOOR`` at least, and, on a busy host (other processes above
``BUSY`` % of its CPU), that share: a run that shared its cores cannot say how fast it would be
alone. Fewer than ``MIN_STEADY`` steady steps say nothing (margin infinite), nor do two runs
timed under different conditions (``changed``: other processes' share of the CPU differing by
``BUSY`` points or more, or torch's threads differing, as they do when the host's free cores
changed between the runs): a ratio of those measures the load as much as the method. Views
never call a winner from a ratio within noise.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Sequence

from workbench.telemetry.record import RunRecord
from workbench.telemetry.steady import warmup_count
from workbench.telemetry.values import num

#: Ratios closer to 1 than this are within noise, however steady the steps.
FLOOR = 0.02
#: Other processes' share of the host CPU (%) above which it counts in the margin.
BUSY = 25.0
#: Steady steps needed to say anything about speed.
MIN_STEADY = 5


def noise(rec: RunRecord) -> dict[str, Any]:
    """``rec``'s timing noise (see the module docstring); NaN / None where unknown."""
    spread, n = step_spread(rec.steps)
    env = rec.environment
    return {"step_spread": spread, "steady_steps": n, "other_cpu_pct": other_cpu(rec.samples),
            "load_start": env.get("load average at start"),
            "load_end": rec.info.get("load average at end"),
            "threads": env.get("torch threads")}


def of(rec: RunRecord) -> dict[str, Any]:
    """The noise saved in ``rec``'s summary, else computed from the record (a live run)."""
    saved = rec.summary.get("noise")
    return saved if isinstance(saved, dict) and "step_spread" in saved else noise(rec)


def step_spread(steps: Sequence[dict[str, Any]]) -> tuple[float, int]:
    """(IQR / median of the steady steps' seconds, how many steady steps); NaN below 2."""
    secs = [float(s["seconds"]) for s in steps
            if isinstance(s.get("seconds"), (int, float)) and s["seconds"] > 0]
    steady = secs[warmup_count(secs):]
    if len(steady) < 2:
        return math.nan, len(steady)
    q1, _, q3 = statistics.quantiles(steady, n=4, method="inclusive")
    return (q3 - q1) / statistics.median(steady), len(steady)


def other_cpu(samples: Sequence[dict[str, Any]]) -> float:
    """Mean host CPU (%) taken by other processes over ``samples``; NaN without both keys."""
    vals = []
    for s in samples:
        host, mine = num(s.get("host cpu (%)")), num(s.get("process cpu (%)"))
        if math.isfinite(host) and math.isfinite(mine):
            vals.append(max(host - mine, 0.0))
    return statistics.fmean(vals) if vals else math.nan


def changed(a: dict[str, Any], b: dict[str, Any]) -> str:
    """How the host's load changed between two runs (``noise`` dicts), "" when it did not:
    "other processes 5% / 80% of host CPU", "torch threads 2 / 1"."""
    parts = []
    x, y = num(a.get("other_cpu_pct")), num(b.get("other_cpu_pct"))
    if math.isfinite(x) and math.isfinite(y) and abs(x - y) >= BUSY:
        parts.append(f"other processes {x:.0f}% / {y:.0f}% of host CPU")
    if a.get("threads") and b.get("threads") and a["threads"] != b["threads"]:
        parts.append(f"torch threads {a['threads']} / {b['threads']}")
    return "; ".join(parts)


def margin(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Relative difference under which two runs' speeds (``noise`` dicts) are not told apart."""
    if any(num(x.get("steady_steps")) < MIN_STEADY for x in (a, b)) or changed(a, b):
        return math.inf
    m = FLOOR
    for x in (a, b):
        spread, busy = num(x.get("step_spread")), num(x.get("other_cpu_pct"))
        if math.isfinite(spread):
            m = max(m, spread)
        if math.isfinite(busy) and busy >= BUSY:
            m = max(m, busy / 100)
    return m


def within(ratio: float, a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether ``ratio`` (b's speed / a's) is within the two runs' noise."""
    return not math.isfinite(ratio) or abs(ratio - 1) <= margin(a, b)


def ratio_text(ratio: float, a: dict[str, Any], b: dict[str, Any]) -> str:
    """"0.31x", or "0.98x, within noise ±12%"."""
    if not math.isfinite(ratio):
        return "-"
    if abs(ratio - 1) > margin(a, b):
        return f"{ratio:.2f}x"
    return f"{ratio:.2f}x, {within_text(a, b)}"


def within_text(a: dict[str, Any], b: dict[str, Any]) -> str:
    """"within noise ±12%", "within noise: under 5 steady steps", or "within noise: the load
    changed between the runs (other processes 5% / 80% of host CPU)"."""
    m = margin(a, b)
    if math.isfinite(m):
        return f"within noise ±{m:.0%}"
    moved = changed(a, b)
    if moved:
        return f"within noise: the load changed between the runs ({moved})"
    return f"within noise: under {MIN_STEADY} steady steps"


def describe(n: dict[str, Any]) -> str:
    """One line: "step spread 8% (IQR/median, 18 steady steps); other processes 31% of host
    CPU; load 1.2 -> 2.0; torch threads 1"."""
    parts = []
    spread = num(n.get("step_spread"))
    if math.isfinite(spread):
        parts.append(f"step spread {spread:.0%} (IQR/median, {n.get('steady_steps')} steady "
                     "steps)")
    busy = num(n.get("other_cpu_pct"))
    if math.isfinite(busy):
        parts.append(f"other processes {busy:.0f}% of host CPU"
                     + (" (busy host)" if busy >= BUSY else ""))
    lo, hi = num(n.get("load_start")), num(n.get("load_end"))
    if math.isfinite(lo):
        parts.append(f"load {lo:.1f}" + (f" -> {hi:.1f}" if math.isfinite(hi) else ""))
    if n.get("threads"):
        parts.append(f"torch threads {n['threads']}")
    return "; ".join(parts) or "no timing data"