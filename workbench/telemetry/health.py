"""Whether a run learns: learning, not learning, diverging, diverged or too short to tell.

A pure function of a ``RunRecord`` (its steps' losses, its evals, its config and status), so
the live dashboard, ``run.json`` (``summary.health``), the CLI, ``compare`` and the report say
the same thing, and ``stop_on=diverged`` stops a run on the same call.

How it decides. A ZO step's loss is measured on that step's batch, so consecutive losses
scatter widely (a random tiny model: 5 to 14 nats from one batch to the next); every test on
them compares medians of windows of ``window(n)`` steps in log space against the scatter of
the log losses (``noise``: a MAD of step-to-step differences, robust to the trend and to
outliers), so a claim needs the loss to move by more than its noise:
    diverged      a non-finite loss or projected gradient, a run that ended diverged, or the
                  recent loss (or the dev loss) at least ``DIVERGED`` x its start or its best
                  level so far
    diverging     the recent loss at least ``RISING`` x its start or its best level, beyond the
                  noise; or the dev loss up by ``DEV_RISE`` or more with no gain in the main
                  dev metric
    learning      the recent loss below the start beyond the noise (by ``FALL`` at least), or
                  the dev loss down by ``DEV_MOVE`` or more, or the main dev metric (accuracy,
                  exact match) up by more than two standard errors of its dev set
    not learning  none of those over at least ``MIN_STEPS`` steps
    too short     fewer than ``MIN_STEPS`` steps, and the dev evals (if any) show no change;
                  or a run still going whose training loss has not moved beyond its noise
                  while a dev evaluation is still to come (the first one was taken): a ZO
                  step's loss scatters too much for tens of steps to tell, and the dev eval
                  that will tell has not run yet
The dev evals (the same examples at every eval, so no batch noise) carry the most weight on
short runs: a tiny random model's dev loss moves by 1e-6 at a flat learning rate, by 10% at
a sane one. But a dev set is a sample of the task: fewer than ``MIN_DEV`` examples (a 40-row
file leaves 4) say too little for their loss to make a run ``learning`` or ``diverging`` on
its own, and the verdict says so. Every verdict says what it is based on (``evidence["basis"]``,
also ending its text): the training loss of how many steps, the dev evals of how many examples.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

from workbench.config import ZO_METHODS
from workbench.telemetry.evals import main_metric, metrics_of
from workbench.telemetry.naming import short_number
from workbench.telemetry.record import RunRecord
from workbench.telemetry.values import num

STATES = ("learning", "not learning", "diverging", "diverged", "too short to tell")
#: Fewer finite losses than this (and no dev evals) tell nothing.
MIN_STEPS = 8
#: The recent loss this many times its start or its best level: diverged.
DIVERGED = 4.0
#: ... this many times (and beyond the noise): diverging.
RISING = 1.3
#: The recent loss must be at least this much below the start (ratio) to count as learning.
FALL = 1.02
#: A dev loss that moved by this fraction or more has moved (it has no batch noise).
DEV_MOVE = 0.01
#: A dev loss up by this fraction (the main metric not better): diverging.
DEV_RISE = 0.25
#: Dev examples below which the dev loss alone decides nothing.
MIN_DEV = 20
#: Standard errors a window's median must move by to count (the best level is the least of
#: many windows, so it is biased low: rises need more).
FALL_SE, RISE_SE = 3.0, 5.0
#: The loss's trend is fitted over at most this many bins (Theil-Sen is quadratic in them).
BINS = 120
#: Share of ZO steps whose two perturbed losses were equal above which eps is suspect.
EQUAL_LOSSES = 0.5


@dataclass(frozen=True)
class Health:
    """A run's learning health.

    Attributes:
        state: one of ``STATES``.
        text: one line with the numbers, e.g. "diverged: loss 4.2x its best level (step 12)".
        advice: the next thing to try, e.g. "lower lr 10x (to 0.0002)"; "" when none.
        evidence: the numbers behind it (losses as medians of ``window`` steps, in nats):
            ``steps``, ``window``, ``loss_start``, ``loss_recent``, ``loss_best``,
            ``best_step``, ``noise`` (log-loss scatter per step), ``dev_loss_start``,
            ``dev_loss_end``, ``dev_metric`` and its start / end / standard error, ...
    """

    state: str
    text: str
    advice: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Health":
        return cls(d.get("state", "too short to tell"), d.get("text", ""), d.get("advice", ""),
                   dict(d.get("evidence") or {}))


def window(n: int) -> int:
    """Steps per window of a run of ``n`` steps: an eighth of the run, at least 3."""
    return max(3, n // 8)


def health(rec: RunRecord) -> Health:
    """``rec``'s learning health (see the module docstring). Linear in the steps, vectorised:
    the live view and ``stop_on`` read it as the run goes (100,000 steps: ~0.1 s)."""
    cfg = rec.config
    lr = num(cfg.get("lr"))
    loss = _column(rec.steps, "loss")
    bad = _non_finite(rec, loss)
    if bad is not None:  # (a run that stop_on ended says "diverged at step N" itself)
        ev = _evidence(rec, loss)[2] if np.isfinite(loss).all() else {"steps": len(rec.steps)}
        return Health("diverged", bad if bad.startswith("diverged") else f"diverged: {bad}",
                      _lower_lr(lr, math.inf), ev)
    train, dev, ev = _evidence(rec, loss)
    h = _decide(rec, lr, train, dev, ev)
    basis = _basis(rec, ev)
    ev["basis"] = basis
    return Health(h.state, f"{h.text} (based on {basis})", h.advice, ev)


def _decide(rec: RunRecord, lr: float, train: dict | None, dev: dict | None,
            ev: dict[str, Any]) -> Health:
    n = ev["steps"]
    if train is None and dev is None:
        return Health("too short to tell", f"too short to tell: {n} step(s) with a "
                      f"loss (at least {MIN_STEPS}, or a dev eval before and after)",
                      f"run at least {MIN_STEPS} steps", ev)
    train, dev = train or {}, dev or {}
    # diverged / diverging: the loss far above where it was, or the dev loss
    ratio = max(train.get("rise", 1.0), dev.get("ratio", 1.0))
    if ratio >= DIVERGED and (train.get("rise_sig") or dev.get("ratio", 1.0) >= DIVERGED):
        return Health("diverged", f"diverged: {_rise_text(ev, train, dev)}",
                      _lower_lr(lr, ratio), ev)
    if train.get("rise_sig") or dev.get("rising"):
        return Health("diverging", f"diverging: {_rise_text(ev, train, dev)}",
                      _lower_lr(lr, ratio), ev)
    gains = [t for t in (train.get("fall_text"), dev.get("fall_text"), dev.get("gain_text")) if t]
    if gains:
        return Health("learning", "learning: " + "; ".join(gains),
                      "more steps go further" if len(rec.steps) < 1000 else "", ev)
    flat = "; ".join(t for t in (train.get("flat"), dev.get("flat")) if t)
    if n < MIN_STEPS:  # a few steps that changed little say nothing yet
        return Health("too short to tell", f"too short to tell: {n} step(s); {flat}",
                      f"run at least {MIN_STEPS} steps", ev)
    if _dev_to_come(rec, dev):
        return Health("too short to tell", f"too short to tell yet: {flat}; no dev evaluation "
                      "since the first, and a ZO step's loss scatters too much for the "
                      "training loss alone to say", _wait_advice(rec), ev)
    return Health("not learning", f"not learning: {flat}", _flat_advice(rec, lr), ev)


def _dev_to_come(rec: RunRecord, dev: dict) -> bool:
    """A run still going that has a dev split (its first eval was taken) and no second eval
    yet: the eval still to come is the evidence, not the noisy training loss."""
    return rec.status == "running" and not dev and any(metrics_of(e) for e in rec.evals)


def _wait_advice(rec: RunRecord) -> str:
    """When the next dev eval comes: at the next multiple of eval_every, else at the end."""
    every = num(rec.config.get("eval_every"))
    every = int(every) if math.isfinite(every) and every > 0 else 0
    steps = rec.config.get("steps")
    if every:
        nxt = every * (len(rec.steps) // every + 1)
        return f"no change yet: wait for the dev eval at step {nxt}"
    return (f"no change yet: wait for the dev eval at the end{f' (step {steps})' if steps else ''}"
            "; eval_every=N shows the dev loss during a run")


def _basis(rec: RunRecord, ev: dict[str, Any]) -> str:
    """What the verdict reads: 'the training loss of 60 steps; dev evals at steps 0 and 60
    (80 examples)'."""
    parts = [f"the training loss of {ev['steps']} step{'s' if ev['steps'] != 1 else ''}"]
    evals = [e for e in rec.evals if metrics_of(e)]
    n = int(evals[-1].get("examples") or 0) if evals else 0
    size = f" ({n} examples{', too few to weigh' if 0 < n < MIN_DEV else ''})" if n else ""
    if len(evals) >= 2:
        parts.append(f"dev evals at steps {evals[0].get('step')} and {evals[-1].get('step')}"
                     + size)
    elif evals:
        parts.append(f"one dev eval so far, at step {evals[0].get('step')}{size}")
    else:
        parts.append("no dev eval")
    return "; ".join(parts)


# --- evidence ---------------------------------------------------------------------------------
def _evidence(rec: RunRecord, loss: np.ndarray) -> tuple[dict | None, dict | None, dict]:
    """The training loss's and the dev split's evidence (None: too little of it), and the
    numbers behind both, from the steps whose ``loss`` (finite) is positive."""
    ok = loss > 0  # a cross-entropy is positive
    steps = np.array([s.get("step", i) for i, s in enumerate(rec.steps)], dtype=float)[ok]
    ev: dict[str, Any] = {"steps": int(ok.sum())}
    train = _train_evidence(np.log(loss[ok]), steps, ev)
    return train, _dev_evidence(rec, ev), ev


def _column(rows: Sequence[dict[str, Any]], key: str) -> np.ndarray:
    """``key`` of every row as floats, NaN where missing or null (run.json stores NaN as
    null)."""
    try:
        return np.array([r.get(key) for r in rows], dtype=float)
    except (TypeError, ValueError):  # text where a number belongs: not a number
        return np.array([num(r.get(key)) for r in rows], dtype=float)


def _non_finite(rec: RunRecord, loss: np.ndarray) -> str | None:
    """Why the run is lost to NaN/inf (or ended diverged), or None."""
    if rec.status == "diverged":
        return rec.error or "the run ended diverged"
    where = {"loss": np.flatnonzero(~np.isfinite(loss))}
    if rec.config.get("method") in ZO_METHODS:  # other methods have no projected gradient
        has = np.array(["projected_grad" in s for s in rec.steps], dtype=bool)
        g = _column(rec.steps, "projected_grad")
        where["projected gradient"] = np.flatnonzero(has & ~np.isfinite(g))
    first = min(((int(i[0]), what) for what, i in where.items() if len(i)), default=None)
    if first is None:
        return None
    i, what = first
    return f"the {what} is not finite at step {rec.steps[i].get('step', i)}"


def _train_evidence(y: np.ndarray, steps: np.ndarray, ev: dict[str, Any]) -> dict | None:
    """The training loss's trend over the run and its start, recent and best levels (medians
    of windows of the log losses ``y`` at ``steps``), with its noise; None below
    ``MIN_STEPS`` losses."""
    n = len(y)
    if n < MIN_STEPS:
        return None
    k = window(n)
    start, recent = float(np.median(y[:k])), float(np.median(y[-k:]))
    hop = max(1, k // 2)
    levels = [(float(np.median(y[i:i + k])), i) for i in range(0, n - 2 * k + 1, hop)]
    best, at = min(levels) if levels else (start, 0)
    noise = 1.4826 * float(np.median(np.abs(np.diff(y)))) / math.sqrt(2)
    # The noise is estimated from the run itself: a short run's estimate is rough, so its
    # tests ask for more (about Student's t at 0.1% over the few degrees of freedom).
    strict = 1 + 8 / (n - 1)
    se = 1.2533 * noise / math.sqrt(k)  # of a window's median
    change, change_se = _trend(y, noise)
    ev.update(window=k, loss_start=math.exp(start), loss_recent=math.exp(recent),
              loss_best=math.exp(best), best_step=int(steps[at + k // 2]), noise=noise,
              trend=math.exp(change) - 1, trend_se=change_se)
    out: dict[str, Any] = {}
    rise = recent - min(start, best)
    out["rise"] = math.exp(rise)
    out["rise_sig"] = (rise >= math.log(RISING)
                       and rise > RISE_SE * strict * math.sqrt(2) * se)
    out["from_best"] = best < start
    if -change >= math.log(FALL) and -change > FALL_SE * strict * change_se:
        out["fall_text"] = (f"loss {math.exp(start):.4g} -> {math.exp(recent):.4g} (its trend "
                            f"over {n} steps {_pct(math.exp(change) - 1)}, "
                            f"{-change / change_se:.1f}x its uncertainty)")
    elif not out["rise_sig"]:
        out["flat"] = (f"loss {math.exp(start):.4g} -> {math.exp(recent):.4g} over {n} steps: "
                       f"its trend {_pct(math.exp(change) - 1)} is within its noise "
                       f"(±{noise:.0%} a step)")
    return out


def _trend(y: np.ndarray, noise: float) -> tuple[float, float]:
    """Change of ``y`` from its first point to its last along a robust straight-line fit
    (Theil-Sen over at most ``BINS`` bin medians), and that change's standard error from the
    fit's residuals (MAD), at least what the step-to-step ``noise`` implies (a few residuals
    can happen to lie close to the line)."""
    n = len(y)
    size = -(-n // BINS)
    starts = range(0, n, size)
    xs = np.array([i + (min(i + size, n) - i - 1) / 2 for i in starts])
    zs = np.array([np.median(y[i:i + size]) for i in starts])
    a, b = np.triu_indices(len(zs), 1)
    slope = float(np.median((zs[b] - zs[a]) / (xs[b] - xs[a])))
    icept = float(np.median(zs - slope * xs))
    sigma = 1.4826 * float(np.median(np.abs(zs - icept - slope * xs)))
    sigma = max(sigma, 1.2533 * noise / math.sqrt(size))  # a bin's median of ``size`` steps
    sxx = float(((xs - xs.mean()) ** 2).sum())
    span = float(xs[-1] - xs[0])
    se = sigma / math.sqrt(sxx) * span if sxx > 0 else math.inf
    return slope * span, max(se, 1e-12)


def _dev_evidence(rec: RunRecord, ev: dict[str, Any]) -> dict | None:
    """The dev loss and main dev metric from the first eval to the last (None: fewer than two
    evals at different steps)."""
    evals = [e for e in rec.evals if metrics_of(e)]
    if len(evals) < 2 or evals[0].get("step") == evals[-1].get("step"):
        return None
    first, last = metrics_of(evals[0]), metrics_of(evals[-1])
    out: dict[str, Any] = {}
    d0, d1 = num(first.get("loss")), num(last.get("loss"))
    main = main_metric(rec.config)
    gain = 0.0
    if main.fraction and main.key in first and main.key in last:
        p0, p1 = num(first[main.key]), num(last[main.key])
        n = max(int(evals[-1].get("examples") or 0), 1)
        se = math.sqrt(max(p0 * (1 - p0), 1 / n) / n + max(p1 * (1 - p1), 1 / n) / n)
        ev.update(dev_metric=main.key, dev_metric_start=p0, dev_metric_end=p1,
                  dev_metric_se=se, dev_examples=n)
        gain = p1 - p0
        if gain > 2 * se:
            out["gain_text"] = f"{main.label} {p0:.3f} -> {p1:.3f} (+{gain / se:.1f} s.e.)"
        elif abs(gain) <= 2 * se:
            out["flat"] = f"{main.label} {p0:.3f} -> {p1:.3f} (within 2 s.e. = {2 * se:.3f})"
    examples = int(evals[-1].get("examples") or 0)
    few = 0 < examples < MIN_DEV  # a sample too small for its loss to decide (unknown: trusted)
    if d0 > 0 and math.isfinite(d1):
        ratio = d1 / d0
        ev.update(dev_loss_start=d0, dev_loss_end=d1, dev_examples=examples or None)
        out["ratio"] = 1.0 if few and ratio < DIVERGED else ratio
        out["rising"] = ratio - 1 >= DEV_RISE and "gain_text" not in out and not few
        if few:
            flat = (f"dev loss {d0:.4g} -> {d1:.4g} ({_pct(ratio - 1)}) over only {examples} "
                    f"dev examples (at least {MIN_DEV} to count)")
            out["flat"] = "; ".join(filter(None, [out.get("flat"), flat]))
        elif ratio <= 1 - DEV_MOVE:
            out["fall_text"] = f"dev loss {d0:.4g} -> {d1:.4g} ({_pct(ratio - 1)})"
        elif not out["rising"]:
            flat = f"dev loss {d0:.4g} -> {d1:.4g} ({_pct(ratio - 1)})"
            out["flat"] = "; ".join(filter(None, [out.get("flat"), flat]))
    return out or None


# --- words ------------------------------------------------------------------------------------
def _rise_text(ev: dict[str, Any], train: dict, dev: dict) -> str:
    parts = []
    if train.get("rise_sig"):
        where = (f"its best level {ev['loss_best']:.4g} (step {ev['best_step']})"
                 if train.get("from_best") else f"its start {ev['loss_start']:.4g}")
        parts.append(f"loss {ev['loss_recent']:.4g} over the last {ev['window']} steps, "
                     f"{train['rise']:.1f}x {where}")
    if dev.get("ratio", 1.0) - 1 >= DEV_RISE:
        parts.append(f"dev loss {ev['dev_loss_start']:.4g} -> {ev['dev_loss_end']:.4g} "
                     f"({dev['ratio']:.1f}x)")
    return "; ".join(parts)


def _lower_lr(lr: float, ratio: float) -> str:
    """Lower lr by a factor the rise suggests: 10x for a blow-up (10x or non-finite), else 3x."""
    factor = 10 if ratio >= 10 else 3
    if not lr > 0:
        return f"lower lr {factor}x"
    return f"lower lr {factor}x (to lr={short_number(lr / factor)})"


def _flat_advice(rec: RunRecord, lr: float) -> str:
    """Not learning: eps when the perturbed losses were equal, else a higher lr or more steps."""
    cfg = rec.config
    if cfg.get("method") in ("mezo", "zo-offload"):
        plus, minus = _column(rec.steps, "loss_plus"), _column(rec.steps, "loss_minus")
        both = np.isfinite(plus) & np.isfinite(minus)
        share = float((plus[both] == minus[both]).mean()) if both.any() else 0.0
        if share >= EQUAL_LOSSES:
            return (f"check eps: the two perturbed losses were equal in {share:.0%} of steps "
                    f"(eps={short_number(num(cfg.get('eps')))}, amp={cfg.get('amp', 'off')}: "
                    "the perturbation is lost in rounding)")
    if not lr > 0:
        return "lr is 0: nothing changes; set lr > 0"
    return f"raise lr 10x (to lr={short_number(lr * 10)}) or run more steps"


def _pct(log_or_frac: float) -> str:
    return f"{log_or_frac:+.0%}" if abs(log_or_frac) >= 0.01 else f"{log_or_frac:+.1%}"