"""What training had cost when each eval was taken: steps, wall-clock seconds, forward passes.

ZO methods differ in what a step costs (MeZO's central estimate takes 2 forward passes per
query, a one-sided one q + 1 per step of q queries, first-order methods a forward and a
backward), so a dev metric plotted per step compares runs unfairly; the views also plot it
against the seconds and the forward passes spent to reach it (``ui.learning``). Each step row
carries the passes its rule counted (``StepOutput.forward_passes``); records written before
that fall back on the settings' count (``forward_passes_per_step``).

The cost "after k steps" is that of steps 0 .. k-1: what was spent before the weights an eval
after ``k`` steps (``EvalEvent.step``) or the training loss of step k (measured on the weights
after k updates) were measured, so the step axis and the cost axes place every point alike.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Sequence

from workbench.config import zo_passes
from workbench.telemetry.record import RunRecord

#: Forward passes per step of methods whose cost does not depend on ZO knobs.
#: forward-grad: one forward-mode (jvp) pass, which carries the tangent alongside (roughly
#: 2-3x a plain forward's arithmetic, still one pass); fo / fo-offload: one forward, plus the
#: backward that is not counted here.
FIXED_FORWARDS = {"forward-grad": 1, "fo": 1, "fo-offload": 1}
#: Methods whose step takes ``queries`` ZO estimates (``estimator`` says how many passes each).
ZO_ESTIMATORS = ("mezo", "zo-offload")


@dataclass(frozen=True)
class Cost:
    """Training cost after ``step`` steps (steps 0 .. step-1).

    Attributes:
        step: steps done.
        seconds: wall-clock training time, s: the sum of those steps' ``seconds``. Evals, the
            setup before the first step and the end-of-run save are not in it (the trainer
            restarts a step's clock after an eval); NaN where a step's time is missing.
        forward_passes: forward passes of those steps over their whole batches (data-parallel
            ranks share each pass); the evals' own passes are not counted. NaN where the
            method is unknown.
    """

    step: int
    seconds: float
    forward_passes: float


def forward_passes_per_step(config: dict[str, Any]) -> float:
    """Forward passes one training step takes over its (global) batch, from a run's settings
    (``RunRecord.config``).

    mezo / zo-offload: ``2 * queries`` for ``estimator="central"`` (each query: w + eps z and
    w - eps z), ``queries + 1`` for ``"one-sided"`` (each query's w + eps z, and one clean pass
    at w); a config without these knobs (runs saved before they existed) reads ``queries=1``,
    ``central``. forward-grad: 1 (forward mode). fo, fo-offload: 1 forward (and a backward,
    not counted). Under data parallelism each rank runs those passes on its share of the
    batch, so together they are the same passes over the whole batch: a torchrun run and one
    process on the same global batch count alike.

    Returns:
        passes per step; NaN for a missing or unknown method.
    """
    method = config.get("method")
    if method in FIXED_FORWARDS:
        return float(FIXED_FORWARDS[method])
    if method in ZO_ESTIMATORS:  # the planner's count (config.zo_passes), from the record
        return float(zo_passes(int(config.get("queries", 1) or 1),
                               config.get("estimator") or "central",
                               config.get("zo_optimizer") or "sgd"))
    return math.nan


def costs_after(rec: RunRecord, steps: Sequence[int]) -> list[Cost]:
    """The training cost after each of ``steps`` (counts of steps done), from ``rec.steps``'
    ``seconds`` and ``forward_passes`` (``elapsed_passes``).

    Steps' own times are summed rather than their ``end`` stamps differenced: ``end`` counts
    the evals in between, and a resumed run's clock starts again at 0."""
    elapsed = elapsed_seconds(rec.steps)
    passes = elapsed_passes(rec.steps, forward_passes_per_step(rec.config))
    out = []
    for k in steps:
        seconds = elapsed[k] if 0 <= k < len(elapsed) else math.nan
        out.append(Cost(int(k), seconds, passes_after(passes, k, rec.config)))
    return out


def passes_after(elapsed: list[float], k: int, config: dict[str, Any]) -> float:
    """Forward passes after ``k`` steps from ``elapsed_passes``; past its recorded steps (an
    eval with no step rows, a record cut short) the settings' count per step carries on."""
    if 0 <= k < len(elapsed):
        return elapsed[k]
    last = len(elapsed) - 1
    return elapsed[last] + (k - last) * forward_passes_per_step(config) if k > last else math.nan


def elapsed_passes(rows: Sequence[dict[str, Any]], per_step: float) -> list[float]:
    """Forward passes after k steps, for k = 0 .. the last recorded step + 1 (``rows``: a
    record's ``steps``): each step's own ``forward_passes`` as its rule counted them (a rule
    whose passes change from step to step is placed exactly), else ``per_step`` (the
    settings' count: records written before steps carried it, a step without a row)."""
    by_step: dict[int, float] = {}
    for r in rows:
        s, v = r.get("step"), r.get("forward_passes")
        if isinstance(s, int) and s >= 0 and isinstance(v, (int, float)) and math.isfinite(v):
            by_step[s] = float(v)
    n = max((r["step"] for r in rows if isinstance(r.get("step"), int)), default=-1) + 1
    if not by_step and not math.isfinite(per_step):
        return [math.nan] * (n + 1)  # nothing known of the passes, not even that 0 is 0 steps'
    return [0.0, *accumulate(by_step.get(t, per_step) for t in range(n))]


def recorded_per_step(rows: Sequence[dict[str, Any]]) -> set[float]:
    """The distinct forward passes per step the rows recorded (empty: none recorded)."""
    return {float(r["forward_passes"]) for r in rows
            if isinstance(r.get("forward_passes"), (int, float))
            and math.isfinite(r["forward_passes"])}


def eval_costs(rec: RunRecord) -> list[Cost]:
    """The cost at each of ``rec.evals``, in their order (an eval after k steps: ``k``)."""
    return costs_after(rec, [int(e["step"]) for e in rec.evals])


def elapsed_seconds(rows: Sequence[dict[str, Any]]) -> list[float]:
    """Training seconds after k steps, for k = 0 .. the last recorded step + 1 (``rows``: a
    record's ``steps``): ``[0, s0, s0 + s1, ...]``. A step without a row or a finite time makes
    it and every later sum NaN: an unknown time is not zero."""
    return [0.0, *accumulate(_step_seconds(rows))]


def _step_seconds(rows: Sequence[dict[str, Any]]) -> list[float]:
    """Seconds of step 0, 1, ... up to the last recorded one; NaN for a step without a row or
    without a finite time."""
    by_step: dict[int, float] = {}
    for r in rows:
        s, v = r.get("step"), r.get("seconds")
        if isinstance(s, int) and s >= 0:
            by_step[s] = float(v) if isinstance(v, (int, float)) and math.isfinite(v) \
                and v >= 0 else math.nan
    n = max(by_step, default=-1) + 1
    return [by_step.get(t, math.nan) for t in range(n)]
