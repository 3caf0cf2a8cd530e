"""Steady-state throughput: which steps are warm-up, and the figures over the rest.

A run's first steps pay one-off costs (the CUDA caching allocator growing, cuBLAS handles, SDPA
choosing kernels, anything not warmed in setup), so a mean over every step tells a short run's
reader the wrong story. The rule, one for the recipe's summary, the CLI, the report and the
live dashboard:

* the first step is always warm-up (given two steps or more; a single step is all there is);
* so is every following step up to the first one that has settled, i.e. that takes at most
  ``SETTLE`` times the median of steps 2..n. Later slow steps (a checkpoint, a neighbour on
  the GPU) are part of the steady state and stay in.

Steady figures: ``tokens_per_s`` (steady tokens / steady seconds) and ``step_seconds`` (median
steady step). ``wall_tokens_per_s`` counts every step, warm-up included.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Sequence

from workbench.telemetry.values import finite

SETTLE = 1.5  # a step within 1.5x of the median step has settled
#: What every table of these figures says under it.
STEADY_NOTE = ("tokens/s and step time are over steady steps: the first step, and any before "
               f"step times settle (within {SETTLE:g}x the median step), are warm-up and count "
               "only in tokens/s (all steps).")


def warmup_count(seconds: Sequence[float]) -> int:
    """Number of leading warm-up steps among steps that took ``seconds`` (in order)."""
    if len(seconds) < 2:
        return 0
    limit = SETTLE * statistics.median(seconds[1:])
    n = 1
    while n < len(seconds) and seconds[n] > limit:
        n += 1
    return n


def throughput(steps: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Steady and all-step figures of step records (``seconds``, ``tokens`` each).

    Returns:
        ``tokens_per_s`` and ``step_seconds`` (median, s) over steady steps,
        ``wall_tokens_per_s`` over all steps, ``warmup_steps`` (leading steps left out) and
        ``steady_steps``; NaN where there are no timed steps.
    """
    rows = [s for s in steps if finite(s.get("seconds")) and s["seconds"] > 0]
    seconds = [float(s["seconds"]) for s in rows]
    warm = warmup_count(seconds)
    steady = rows[warm:]
    return {
        "tokens_per_s": _rate(steady),
        "step_seconds": statistics.median(seconds[warm:]) if steady else math.nan,
        "wall_tokens_per_s": _rate(rows),
        "warmup_steps": warm,
        "steady_steps": len(steady),
    }


def _rate(rows: Sequence[dict[str, Any]]) -> float:
    seconds = sum(float(s["seconds"]) for s in rows)
    return sum(float(s.get("tokens") or 0) for s in rows) / seconds if seconds > 0 else math.nan