"""What runs learned, drawn: the training loss and the objective's dev metric, against steps,
training time or forward passes (plotly dicts and figures only, no widgets).

A step of one method is not a step of another: MeZO's takes 2 forward passes, a step of 4
central queries 8, first-order methods a forward and a backward. So the dev metric is also
drawn against the seconds and the forward passes spent to reach it. Every point sits at the
cost of the steps before it (``telemetry.cost``): the loss of step t and an eval after t steps
share an x on every axis, and so do the runs of a comparison. ``figures`` puts the loss panel
on the dashboard; the report and ``compare`` add ``dev_by_cost``.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import plotly.graph_objects as go

from workbench.telemetry.cost import (elapsed_passes, elapsed_seconds, eval_costs,
                                      forward_passes_per_step, passes_after,
                                      recorded_per_step)
from workbench.telemetry.evals import EvalMetric, main_metric, metrics_of
from workbench.telemetry.naming import run_labels
from workbench.telemetry.reach import seed_groups
from workbench.telemetry.record import RunRecord
from workbench.ui.layout import RUN_COLOURS, Panel, compose, ema, line
from workbench.ui.series import col, downsample, xy

#: Loss smoothing (EMA weight) the figures start with; the slider offers others.
SMOOTHING = 0.6
#: What the loss and the dev metric can be drawn against (the dashboard's dropdown offers the
#: keys), and each one's noun in panel titles.
X_AXES = {"steps": "steps", "wall-clock (s)": "training time", "forward passes": "forward passes"}
STEPS = "steps"
#: Between ``dev_by_cost``'s panels (a fraction of the width): room for tick labels only;
#: and their height (px): a third of the width each, they read best lower than a full row.
DEV_SPACING, DEV_HEIGHT = 0.07, 240


def per_step(rec: RunRecord) -> float:
    """Forward passes of one of the run's steps over its batch: the one count its steps
    recorded, else the settings' (NaN: the steps' counts differ, or the method is unknown)."""
    recorded = recorded_per_step(rec.steps)
    if recorded:
        return recorded.pop() if len(recorded) == 1 else math.nan
    return forward_passes_per_step(rec.config)


def cost_x(rec: RunRecord, steps: np.ndarray, x: str) -> np.ndarray:
    """Where points measured after ``steps`` steps (a float array of step counts) sit on axis
    ``x`` (an ``X_AXES`` key): the counts themselves, the training seconds spent before them
    (evals not counted), or the forward passes; NaN where that is unknown.

    Raises:
        ValueError: ``x`` is not an ``X_AXES`` key.
    """
    steps = np.asarray(steps, dtype=float)
    if x == STEPS:
        return steps
    if x == "forward passes":  # each step's recorded passes (``telemetry.cost``)
        elapsed = elapsed_passes(rec.steps, forward_passes_per_step(rec.config))
        return np.array([passes_after(elapsed, int(k), rec.config) if np.isfinite(k)
                         else math.nan for k in steps], dtype=float)
    if x == "wall-clock (s)":
        elapsed = np.asarray(elapsed_seconds(rec.steps))
        out = np.full(len(steps), math.nan)
        ok = np.isfinite(steps) & (steps >= 0) & (steps < len(elapsed))
        out[ok] = elapsed[steps[ok].astype(int)]
        return out
    raise ValueError(f"x axis {x!r}: use one of {', '.join(map(repr, X_AXES))}")


def x_title(x: str, recs: Sequence[RunRecord]) -> str:
    """The x-axis title of ``x`` for ``recs``, with its unit: short, as the live loss panel is
    about 220 px wide (hover text and the report say evals are not counted). Forward passes
    name the runs' passes per step where they share one, and first-order runs' backward."""
    if x == STEPS:
        return "step"
    if x == "wall-clock (s)":
        return "training time (s)"
    per = {v for v in map(per_step, recs) if math.isfinite(v)}
    backward = any(r.config.get("method") in ("fo", "fo-offload") for r in recs)
    if len(per) == 1:
        return f"forward passes ({per.pop():g}/step{', + backward' if backward else ''})"
    return "forward passes" + (" (fo: + backward)" if backward else "")


def dev_points(rec: RunRecord, metric: EvalMetric, x: str) -> dict[str, Any] | None:
    """The run's evals that hold ``metric``, on axis ``x``: a scatter trace (plain dict; x, y
    in % for a fraction, hover with the step, seconds and forward passes); None without any."""
    evals = [(e, c) for e, c in zip(rec.evals, eval_costs(rec))
             if metrics_of(e).get(metric.key) is not None]
    if not evals:
        return None
    y = np.array([metrics_of(e)[metric.key] for e, _ in evals], dtype=float)
    if not np.isfinite(y).any():
        return None
    scale, value = (100, "%{y:.1f} %") if metric.fraction else (1, "%{y:.4f}")
    steps = np.array([c.step for _, c in evals], dtype=float)
    return dict(type="scatter", x=cost_x(rec, steps, x), y=y * scale, mode="lines+markers",
                name=metric.label,
                customdata=[[c.step, c.seconds, c.forward_passes] for _, c in evals],
                hovertemplate=(f"{value}<br>after %{{customdata[0]:,}} steps: "
                               "%{customdata[1]:.3~f} s of training, "
                               "%{customdata[2]:,} forward passes (evals not counted)"
                               f"<extra>{metric.label}</extra>"))


def loss_panel(rec: RunRecord, smoothing: float = SMOOTHING, x: str = STEPS) -> Panel:
    """Training loss, with the objective's main dev metric (``telemetry/evals.py``), against
    ``x`` (an ``X_AXES`` key): a fraction (classify's accuracy, completion's exact match) in %
    on its own right-hand axis; lm's dev loss on the loss axis, beside the training loss it is
    measured like."""
    main = main_metric(rec.config)
    p = Panel(f"loss, {main.label}", x_title(x, [rec]), "loss")
    if main.fraction:
        # plotly.js >= 3 syncs an overlaying axis's ticks to the primary's grid (ticks at 16.5,
        # 35, ... %); fixed quarters read better, without a second grid.
        p.y2title, p.y2axis = f"{main.label} (%)", {"range": [0, 100], "tickmode": "linear",
                                                    "dtick": 25, "showgrid": False}
    if x == STEPS:
        xs, y = xy(rec.steps, "step", "loss")
    else:  # the cost before each step: its loss is measured on the weights of the steps before
        xs, y = cost_x(rec, col(rec.steps, "step"), x), col(rec.steps, "loss")
        ok = np.isfinite(xs)
        xs, y = downsample(xs[ok], y[ok])
    if np.isfinite(y).any():
        add_smoothed(p, xs, y, "loss", "#1f77b4", smoothing)
    dev = dev_points(rec, main, x)
    if dev is not None and np.isfinite(dev["x"]).any():
        dev["line"] = dict(color="#d62728")
        p.add(dev, secondary=main.fraction)
    if not p.traces:
        p.note = (f"no {X_AXES[x]} (the steps' times or the method unknown)"
                  if x != STEPS and (rec.steps or rec.evals) else "no finished steps yet")
    return p


def add_smoothed(p: Panel, x: np.ndarray, y: np.ndarray, name: str, colour: str,
                 smoothing: float, dash: str | None = None, suffix: str = " (EMA)") -> None:
    """The raw series, faint, named ``name`` (hidden from the legend when a smoothed line is
    drawn over it), and its EMA at ``smoothing`` named ``name + suffix``, both in one legend
    group; the EMA is registered for the smoothing slider."""
    raw = line(x, y, name, colour, dash=dash)
    if smoothing <= 0:
        p.add(raw)
        return
    raw.update(opacity=0.3, showlegend=False, legendgroup=name, line={**raw["line"], "width": 1})
    p.add(raw)
    i = p.add(line(x, ema(y, smoothing), name + suffix, colour, dash=dash))
    p.traces[i]["legendgroup"] = name
    p.smooth.append((i, y))


def compare_loss(recs: Sequence[RunRecord], smoothing: float = SMOOTHING) -> go.Figure:
    """Loss per step of each run, overlaid: raw (faint) and smoothed (EMA, with a slider). A
    run whose losses equal an earlier run's is dashed and says so in its legend entry."""
    p = Panel("training loss", "step", "loss")
    labels, seen = run_labels(recs), []
    for i, (rec, label) in enumerate(zip(recs, labels)):
        x, y = xy(rec.steps, "step", "loss")
        if not np.isfinite(y).any():
            continue
        twin = next((other for other, ox, oy in seen if same(x, y, ox, oy)), None)
        seen.append((label, x, y))
        name = f"{label} (identical to {twin})" if twin else label
        # the legend lists the smoothed lines by the runs' names alone (the raw ones are faint)
        add_smoothed(p, x, y, name, RUN_COLOURS[i % len(RUN_COLOURS)], smoothing,
                     dash="dash" if twin else None, suffix="")
    p.note = "" if p.traces else "no finished steps"
    return compose([[p]], slider=True, smoothing=smoothing)


def dev_by_cost(recs: Sequence[RunRecord]) -> go.Figure:
    """The main dev metric (the first run's objective's) of each run against steps, training
    time (s) and forward passes: three panels side by side on one y range (titled on the
    first), a colour per run (the legend once, on the left). Where the runs' passes per step differ, each legend entry
    gives its run's; a run whose evals equal an earlier run's step for step is dashed (else it
    would hide it) and says so. Several seeds of one configuration (``telemetry.reach.
    seed_groups``: settings equal but the seed) are one colour: their mean over the evals all
    of them took, in a band of +- one standard deviation (``seed_band``)."""
    main = main_metric(next((r.config for r in recs if r.evals), recs[0].config if recs else {}))
    groups = seed_groups([r.config for r in recs])
    reps = [recs[g[0]] for g in groups]  # a configuration's label and passes: its first run's
    labels = run_labels(reps)
    passes = [per_step(r) for r in reps]
    differ = len({v for v in passes if math.isfinite(v)}) > 1
    panels = []
    for j, x in enumerate(X_AXES):
        # one y range, titled once: the panels read alike, and sit closer together
        p = Panel(f"{main.label} by {X_AXES[x]}", x_title(x, recs),
                  "" if j else f"{main.label}{' (%)' if main.fraction else ''}",
                  yaxis={"matches": "y"} if j else {})
        seen: list[tuple[str, Any]] = []
        for i, (group, label) in enumerate(zip(groups, labels)):
            colour, n = RUN_COLOURS[i % len(RUN_COLOURS)], passes[i]
            note = f" ({n:g} forward pass{'' if n == 1 else 'es'} per step)" if differ else ""
            if len(group) > 1:
                for trace in seed_band([recs[k] for k in group], main, x, label, colour, note):
                    trace["showlegend"] = not j and trace.get("showlegend", True)
                    p.add(trace)
                seen.append((label, None))
                continue
            rec = recs[group[0]]
            trace = dev_points(rec, main, x)
            if trace is None:
                continue
            key = (list(trace["y"]), [c[0] for c in trace["customdata"]])
            twin = next((other for other, k in seen if k == key), None)
            seen.append((label, key))
            # "overlaps", not "identical": a coarse dev metric (80 examples) often repeats
            name = label + note + (f" (overlaps {twin})" if twin else "")
            trace.update(name=name, legendgroup=label, showlegend=not j,
                         line=dict(color=colour, dash="dash" if twin else None))
            trace["hovertemplate"] = trace["hovertemplate"].replace(
                f"<extra>{main.label}</extra>", f"<extra>{label}</extra>")
            if np.isfinite(trace["x"]).any():
                p.add(trace)
        p.note = "" if p.traces else (f"no {X_AXES[x]} (steps' times or method unknown)"
                                      if seen else f"no {main.label} (no evals recorded)")
        panels.append(p)
    return compose([panels], h_spacing=DEV_SPACING, row_height=DEV_HEIGHT)


def seed_band(recs: Sequence[RunRecord], metric: EvalMetric, x: str, label: str,
              colour: str, note: str = "") -> list[dict[str, Any]]:
    """Seeds of one configuration on axis ``x``: a band of mean +- std (sample std over the
    seeds) and the mean line over it, at the evals every seed took (same step); x is the
    seeds' mean there (their seconds differ; steps and passes do not). [] when the seeds share
    no eval with the metric."""
    traces = [dev_points(r, metric, x) for r in recs]
    traces = [t for t in traces if t is not None]
    if len(traces) < 2:
        return []
    steps = [[c[0] for c in t["customdata"]] for t in traces]
    common = sorted(set(steps[0]).intersection(*steps[1:]))
    if not common:
        return []
    pick = [[s.index(k) for k in common] for s in steps]
    xs = np.array([np.asarray(t["x"], dtype=float)[i] for t, i in zip(traces, pick)])
    ys = np.array([np.asarray(t["y"], dtype=float)[i] for t, i in zip(traces, pick)])
    ok = np.isfinite(xs).all(axis=0)
    if not ok.any():
        return []
    mx, my, sd = xs.mean(axis=0)[ok], ys.mean(axis=0)[ok], ys.std(axis=0, ddof=1)[ok]
    n, name = len(traces), f"{label}{note} ({len(traces)} seeds: mean ± std)"
    band = dict(type="scatter", x=np.concatenate([mx, mx[::-1]]),
                y=np.concatenate([my + sd, (my - sd)[::-1]]), fill="toself", mode="lines",
                line=dict(width=0, color=colour), fillcolor=colour, opacity=0.2,
                hoverinfo="skip", showlegend=False, legendgroup=label, name=f"{label} band")
    unit = " %" if metric.fraction else ""
    mean = dict(type="scatter", x=mx, y=my, mode="lines+markers", name=name,
                legendgroup=label, line=dict(color=colour),
                customdata=np.stack([np.asarray(common, dtype=float)[ok], sd], axis=1),
                hovertemplate=(f"%{{y:.2f}}{unit} ± %{{customdata[1]:.2f}} over {n} seeds<br>"
                               f"after %{{customdata[0]:,}} steps<extra>{label}</extra>"))
    return [band, mean]


def same(x: np.ndarray, y: np.ndarray, ox: np.ndarray, oy: np.ndarray) -> bool:
    """Two series with the same steps and bit-equal values (NaN where the other has NaN)."""
    return (len(x) == len(ox) and np.array_equal(x, ox)
            and np.array_equal(y, oy, equal_nan=True))
