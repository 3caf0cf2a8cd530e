"""Figures of runs, built from ``RunRecord``s by pure functions (plotly only, no widgets).

The live dashboard, a reloaded run directory and the HTML report all call these builders, so
what a notebook shows during training is what the report shows afterwards. Builders never raise
on missing data (a CPU run without NVML, telemetry off, a run that has not finished a step):
the panel is drawn empty, with its axes, and a note says what is missing. GPU panels are drawn
for runs on a GPU only; host CPU and memory for every run.

Units: time in seconds since the run's time origin, memory in GB (1e9 bytes), transfer rates in
GB/s, transfer sizes in MB (1e6 bytes), durations in hover text in ms. Every trace is bounded to
about ``MAX_POINTS`` points (``series``: min/max per bucket, so peaks survive). How panels are
laid out is ``layout``'s business; the loss and the dev metric (against steps, training time
or forward passes) are ``learning``'s, imported here. Longer than our usual module: the one-run
panels and the comparisons share their series and units, and the live view calls the same
builders.
"""
from __future__ import annotations

import math
import zlib
from typing import Any, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative

from workbench.telemetry import noise
from workbench.telemetry.naming import run_labels  # noqa: F401  (views import it from here)
from workbench.telemetry.record import RunRecord
from workbench.telemetry.summary import summary_metrics  # noqa: F401  (ditto)
from workbench.telemetry.trace import block_label
from workbench.telemetry.verdict import verdict
from workbench.ui.layout import (LEGEND_LINE, ROW_HEIGHT, SMOOTHING_STEPS,  # noqa: F401
                                 RUN_COLOURS, TEMPLATE, Panel, compose, ema, fill)
from workbench.ui.layout import line as _line
# the loss and dev-metric figures live in ``learning``; views import them from here too
from workbench.ui.learning import (SMOOTHING, STEPS, X_AXES, compare_loss,  # noqa: F401
                                   dev_by_cost, loss_panel as _loss_panel)
from workbench.ui.series import (MAX_POINTS, col, downsample, finite, num,  # noqa: F401
                                 seed_columns, shared_columns, xy)

GB, MB = 1e9, 1e6
#: Timeline rows, top to bottom; streams not listed follow in name order.
STREAM_ROWS = ("upload", "compute", "gpu update", "cpu update", "offload", "update",
               "checkpoint")
#: fo-offload's optimizer ops drawn in lanes of their own (not their stream's row), so the GPU
#: and CPU subgroup updates, and what each side waits for, interleave visibly; their bars carry
#: the subgroup's number.
LANES = {"gpu-update": "gpu update", "gpu-wait": "gpu update", "cpu-update": "cpu update",
         "cpu-wait": "cpu update", "downcast": "cpu update"}
#: fo-offload's per-subgroup ops: ``OpEvent.block`` is a subgroup, not a transformer block.
SUBGROUP_OPS = ("grad-d2h", "cpu-wait", "cpu-update", "downcast", "upload-weights",
                "prefetch", "gpu-update", "flush-out")
OP_COLOURS = {"upload": "#1f77b4", "compute": "#2ca02c", "offload": "#ff7f0e",
              "update": "#9467bd", "eval": "#7f7f7f", "checkpoint": "#8c564b",
              "gpu-update": "#2ca02c", "cpu-update": "#9467bd", "cpu-wait": "#c7c7c7",
              "gpu-wait": "#c7c7c7"}
#: Narrowest a timeline bar is drawn, as a fraction of the shown window, so a 10 us transfer
#: beside 10 ms computes stays visible (its outline keeps it so when zoomed in); the hover
#: text gives the true duration.
MIN_BAR = 0.002
#: The live view's compact sizes (px): it shares a 900 px high window with the knob panel.
LIVE_ROW_HEIGHT, LIVE_ROW_GAP = 135 - LEGEND_LINE, 82 + LEGEND_LINE


def has_gpu(rec: RunRecord) -> bool:
    """Whether the run has GPU panels: it ran on CUDA (a CPU run on a GPU machine samples a GPU
    it does not use). A record without a device setting: whether it holds GPU data."""
    device = rec.config.get("device")
    if device:
        return str(device).startswith("cuda")
    if any(num(r.get("mem_allocated"), 0.0) > 0 for r in rec.steps[-5:]):
        return True
    return any(math.isfinite(num(s.get("gpu util (%)"))) for s in rec.samples[-20:])


# --- one run ----------------------------------------------------------------------------------
def timeline(rec: RunRecord, last_steps: int | None = 3, title: str = "") -> go.Figure:
    """Gantt chart of stream operations: one row per stream, one bar per ``OpEvent`` of the
    last ``last_steps`` steps that have events (None: all kept steps); x in s. ``title``: a
    figure title, in a band of its own above the panel's."""
    return compose([[_timeline_panel(rec, last_steps)]], bars=True, title=title)


def memory(rec: RunRecord) -> go.Figure:
    """GPU memory (GB) over time (s): torch allocated / reserved / peak at each step's end, and
    NVML's used memory from the samples."""
    return compose([[_memory_panel(rec)]])


def pcie(rec: RunRecord) -> go.Figure:
    """PCIe RX (host->GPU) and TX (GPU->host) in GB/s over time (s), with the link's peak."""
    return compose([[_pcie_panel(rec)]])


def utilisation(rec: RunRecord) -> go.Figure:
    """GPU (NVML, GPU runs) and host CPU utilisation (%) over time (s)."""
    return compose([[_util_panel(rec)]])


def host_memory(rec: RunRecord) -> go.Figure:
    """Host RAM in use, this process's resident memory and (GPU runs) the pinned host memory
    the planner counts for the run, in GB over time (s)."""
    return compose([[_host_memory_panel(rec)]])


def progress(rec: RunRecord, smoothing: float = SMOOTHING, x: str = STEPS) -> go.Figure:
    """Tokens/s per step, and the loss (raw, faint, and an EMA with a slider) with the
    objective's main dev metric against ``x``: steps, wall-clock (s) or forward passes
    (``learning.X_AXES``; ``learning.loss_panel``)."""
    return compose([[_throughput_panel(rec), _loss_panel(rec, smoothing, x)]], slider=True,
                   smoothing=smoothing)


def dashboard_figure(rec: RunRecord, last_steps: int | None = 3,
                     panels: list[list[Panel]] | None = None, smoothing: float = SMOOTHING,
                     live: bool = False, x: str = STEPS) -> go.Figure:
    """Everything about one run in one figure: what the live view and the report show.

    Args:
        panels: ``dashboard_panels(rec, last_steps, smoothing, live, x)`` when the caller
            already built them.
        live: the live view's compact figure (rows of ``LIVE_ROW_HEIGHT``, no title: its header
            says it; smoothing is a widget there, not a plotly slider); else the report's.
        x: what the loss panel's x axis counts: steps, wall-clock (s) or forward passes
            (``learning.X_AXES``).
    """
    grid = panels or dashboard_panels(rec, last_steps, smoothing, live, x)
    if live:
        return compose(grid, bars=True, row_height=LIVE_ROW_HEIGHT, row_gap=LIVE_ROW_GAP)
    return compose(grid, bars=True, title=dashboard_title(rec), slider=True, smoothing=smoothing)


def dashboard_panels(rec: RunRecord, last_steps: int | None = 3, smoothing: float = SMOOTHING,
                     live: bool = False, x: str = STEPS) -> list[list[Panel]]:
    """The dashboard's panels, row by row (``compose`` lays them out; the live view refills
    its existing figure from them through ``fill``). Live, the grid's shape depends only on
    whether the run has GPU data (GPU runs get three columns there, to fit the height); for a
    saved run (the report) it holds the panels that have data, the loss first. ``x``: the loss
    panel's x axis (``learning.X_AXES``); the other panels keep theirs."""
    with shared_columns():
        tl = _timeline_panel(rec, last_steps)
        tput, loss = _throughput_panel(rec), _loss_panel(rec, smoothing, x)
        util, host = _util_panel(rec), _host_memory_panel(rec)
        if has_gpu(rec):
            mem, link = _memory_panel(rec), _pcie_panel(rec)
    if live:  # a fixed grid, refilled on every refresh; the loss axis in the last column
        if not has_gpu(rec):
            return [[tl], [tput, loss], [util, host]]
        return [[tl], [tput, util, loss], [mem, link, host]]
    # A saved run: the loss first (the smoothing slider sits right above it), then only the
    # panels that have data (a CPU run has no GPU panels, telemetry off no timeline).
    grid = [[tput, loss], [tl], *([[mem, link]] if has_gpu(rec) else []), [util, host]]
    kept = [[p for p in row if p.traces] for row in grid]
    return [row for row in kept if row] or [[loss]]


def dashboard_title(rec: RunRecord) -> str:
    return f"{rec.name} ({rec.status}, {len(rec.steps)} steps)"


# --- two runs or more -------------------------------------------------------------------------
def compare_bars(recs: Sequence[RunRecord]) -> go.Figure:
    """Steady throughput (tokens/s, warm-up steps left out) and, where a run has GPU data, its
    peak GPU memory (GB, the run's own), one horizontal bar per run (the first on top, run names
    once, on the left: long sweep names never collide), labelled with the ratio to the first
    run; a throughput ratio within the runs' timing noise says so (``telemetry.noise``).
    Throughput comes first: it always has data, and carries the names."""
    labels, metrics = run_labels(recs), [summary_metrics(r) for r in recs]
    panels = []
    bars = [("tokens_per_s", "steady throughput", 1.0, "tokens/s")]
    if any(m["peak_gpu_mem_bytes"] > 0 for m in metrics):  # no empty panel for CPU runs
        bars.append(("peak_gpu_mem_bytes", "peak GPU memory", GB, "GB"))
    for key, title, scale, unit in bars:
        values = [m[key] / scale for m in metrics]
        p = Panel(title, f"{title} ({unit})", "", yaxis=dict(
            type="category", categoryorder="array", categoryarray=labels, autorange="reversed",
            automargin=True, **({} if not panels else {"showticklabels": False})))
        base = values[0] if values else math.nan
        text = [_ratio_text(v, base, i, (metrics[0]["noise"], metrics[i]["noise"])
                            if key == "tokens_per_s" else None) for i, v in enumerate(values)]
        p.add(dict(type="bar", y=labels, x=[v if math.isfinite(v) else 0.0 for v in values],
                   text=text, orientation="h", textposition="auto", name=title,
                   showlegend=False,
                   marker_color=[RUN_COLOURS[i % len(RUN_COLOURS)] for i in range(len(recs))],
                   hovertemplate=f"%{{y}}<br>%{{x:.4g}} {unit}<extra></extra>"))
        if not any(math.isfinite(v) and v > 0 for v in values):
            p.note = f"no {title} data"
        panels.append(p)
    return compose([panels], row_height=max(160, 34 * len(recs) + 40))


def compare_memory(recs: Sequence[RunRecord]) -> go.Figure:
    """Each run's own GPU memory (GB) over time (s), overlaid: torch's allocated memory at each
    step's end (solid) and its peak so far (dashed), less what the process held before the run
    (``run_memory``), so two runs of one process are drawn as the table counts them."""
    p = Panel("GPU memory (each run's own)", "time (s)", "GPU memory (GB)")
    for i, (rec, label) in enumerate(zip(recs, run_labels(recs))):
        colour = RUN_COLOURS[i % len(RUN_COLOURS)]
        series = run_memory(rec)
        for key, dash in (("allocated", None), ("peak", "dash")):
            if key in series:
                x, y = series[key]
                p.add(_line(x, y / GB, f"{label} {key}", colour, dash=dash))
    p.note = "" if p.traces else "no GPU memory data (CPU runs)"
    return compose([[p]])


def run_memory(rec: RunRecord) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The run's own GPU memory in bytes over time (s): torch's ``allocated``, ``reserved``
    and ``peak`` at each step's end less torch's allocation before the run, and NVML's ``nvml``
    reading less NVML's before the run (the CUDA context, other processes, an earlier run's
    leftovers: ``recipes.train`` reads both before building anything). Series without data
    (CPU runs, no NVML) are left out."""
    env = rec.environment
    torch0 = num(env.get("torch allocated before run (bytes)"), 0.0)
    nvml0 = num(env.get("gpu mem used before run (bytes)"), 0.0)
    out = {}
    for key, name in (("mem_allocated", "allocated"), ("mem_reserved", "reserved"),
                      ("mem_peak", "peak")):
        x, y = xy(rec.steps, "end", key)
        if (np.isfinite(y) & (y > 0)).any():  # CPU runs report 0: that is "no data"
            out[name] = (x, np.maximum(y - torch0, 0.0))
    x, y = xy(rec.samples, "t (s)", "gpu mem used (bytes)")
    if np.isfinite(y).any():
        out["nvml"] = (x, np.maximum(y - nvml0, 0.0))
    return out


def compare_timelines(recs: Sequence[RunRecord], last_steps: int | None = 3) -> go.Figure:
    """The runs' timelines stacked, each shifted to start at 0 on one shared time axis, so the
    same steps can be compared bar for bar; each titled with its run and its bound."""
    grid = [[_timeline_panel(r, last_steps, align=True, title=f"{label}: {verdict(r).kind}")]
            for r, label in zip(recs, run_labels(recs))]
    return compose(grid, bars=True, shared_x=True, row_height=max(140, ROW_HEIGHT // 2))


# --- panels: one subplot's traces and axes ---------------------------------------------------
def _timeline_panel(rec: RunRecord, last_steps: int | None, align: bool = False,
                    title: str = "stream timeline") -> Panel:
    p = Panel(title, "time from window start (s)" if align else "time (s)", "stream")
    chosen = sorted({e.step for e in rec.events})
    keep = set(chosen if last_steps is None else chosen[-last_steps:] if last_steps > 0 else [])
    shown = [e for e in rec.events if e.step in keep]
    if not shown:
        p.note = "no stream events (telemetry off, or no step finished yet)"
        return p
    streams = {_lane(e) for e in shown}
    rows = [s for s in STREAM_ROWS if s in streams] + sorted(streams - set(STREAM_ROWS))
    t0 = min(e.start for e in shown) if align else 0.0
    least = MIN_BAR * (max(e.end for e in shown) - min(e.start for e in shown))
    ops = sorted({e.op for e in shown}, key=lambda o: (list(OP_COLOURS).index(o)
                                                       if o in OP_COLOURS else 99, o))
    for op in ops:
        evs = [e for e in shown if e.op == op]
        colour = op_colour(op)
        lane = op in LANES
        p.add(dict(
            type="bar", orientation="h", y=[_lane(e) for e in evs],
            base=[e.start - t0 for e in evs],
            x=[max(e.end - e.start, least) for e in evs], width=0.8, name=op, legendgroup=op,
            # every op keyed (its colour is what a reader looks up), in every timeline of a stack
            showlegend=True, marker=dict(color=colour, line=dict(color=colour, width=1)),
            **(dict(text=[str(e.block) for e in evs], textposition="inside",
                    insidetextanchor="middle") if lane and op in SUBGROUP_OPS else {}),
            customdata=[[_where(e), e.step, e.nbytes / MB, (e.end - e.start) * 1e3,
                         e.detail] for e in evs],
            hovertemplate=("%{customdata[0]} %{customdata[4]}<br>step %{customdata[1]}<br>"
                           "%{customdata[2]:.3f} MB<br>%{customdata[3]:.3f} ms"
                           "<extra>%{fullData.name}</extra>")))
    # Category order is explicit so upload sits on top and rows never reshuffle as ops arrive.
    p.yaxis = dict(type="category", categoryorder="array", categoryarray=rows,
                   autorange="reversed")
    return p


def _lane(e) -> str:
    return LANES.get(e.op, e.stream)


def _where(e) -> str:
    """What an event's ``block`` names: a subgroup, a block, or (a step-wide wait) nothing."""
    if e.op in SUBGROUP_OPS:
        return f"subgroup {e.block}"
    return "" if e.op in LANES else block_label(e.block)


def _memory_panel(rec: RunRecord) -> Panel:
    p = Panel("GPU memory (this run's)", "time (s)", "GPU memory (GB)")
    series = run_memory(rec)
    for key, name, colour, dash in (("allocated", "allocated", None, None),
                                    ("reserved", "reserved", None, "dot"),
                                    ("peak", "peak", None, "dash"),
                                    ("nvml", "NVML", "#d62728", None)):
        if key in series:
            x, y = series[key]
            p.add(_line(x, y / GB, name, colour, dash=dash))
    p.note = "" if p.traces else "no GPU memory data (no step yet, or NVML unavailable)"
    return p


def _pcie_panel(rec: RunRecord) -> Panel:
    return _gb_samples_panel(
        rec, "PCIe throughput", "PCIe throughput (GB/s)",
        [("pcie rx (bytes/s)", "RX host→GPU", "#1f77b4"),
         ("pcie tx (bytes/s)", "TX GPU→host", "#ff7f0e")],
        num(rec.environment.get("pcie peak (bytes/s)")),
        ("link peak", "%{y:.2f} GB/s", "link peak (per direction)"),
        "no PCIe samples (NVML unavailable)")


def _util_panel(rec: RunRecord) -> Panel:
    gpu = has_gpu(rec)
    p = Panel("utilisation" if gpu else "host CPU", "time (s)", "utilisation (%)",
              yaxis={"range": [0, 105]})
    _sample_lines(p, rec, [("gpu util (%)", "GPU util", "#2ca02c")] * gpu
                  + [("host cpu (%)", "host CPU", "#8c564b"),
                     ("process cpu (%)", "this process", "#1f77b4")])
    p.note = "" if p.traces else "no utilisation samples (sample_hz=0, or no sample yet)"
    return p


def _host_memory_panel(rec: RunRecord) -> Panel:
    pinned = planned_pinned_bytes(rec)
    return _gb_samples_panel(
        rec, "host memory", "host memory (GB)",
        [("host ram used (bytes)", "host RAM used", "#17becf"),
         ("process rss (bytes)", "this process (RSS)", "#1f77b4")],
        pinned if pinned > 0 else math.nan,
        ("pinned (planner)", "%{y:.3f} GB", "pinned host memory (planner)"),
        "no host samples (sample_hz=0, or no sample yet)")


def _gb_samples_panel(rec: RunRecord, title: str, ylabel: str,
                      series: list[tuple[str, str, str]], level_bytes: float,
                      level: tuple[str, str, str], empty: str) -> Panel:
    """Sampled byte quantities in GB over time, with a dashed level (name, hover, what) at
    ``level_bytes`` where it is finite; ``empty`` is the note when no series has data."""
    p = Panel(title, "time (s)", ylabel)
    _sample_lines(p, rec, series, GB)
    if p.traces and math.isfinite(level_bytes):
        _level(p, rec, level_bytes / GB, *level)
    p.note = "" if p.traces else empty
    return p


def _sample_lines(p: Panel, rec: RunRecord, series: list[tuple[str, str, str]],
                  scale: float = 1.0) -> None:
    """One line per (sample key, name, colour) that has data, over time, divided by ``scale``."""
    for key, name, colour in series:
        x, y = xy(rec.samples, "t (s)", key)
        if np.isfinite(y).any():
            p.add(_line(x, y / scale, name, colour))


def _level(p: Panel, rec: RunRecord, value: float, name: str, hover: str, what: str) -> None:
    """A dashed horizontal line at ``value`` across the samples' time span (a limit, a plan)."""
    t = finite(col(rec.samples, "t (s)"))
    if len(t):
        p.add(dict(type="scatter", x=[float(t.min()), float(t.max())], y=[value] * 2,
                   mode="lines", name=name, line=dict(dash="dash", color="#555"),
                   hovertemplate=f"{hover}<extra>{what}</extra>"))


def planned_pinned_bytes(rec: RunRecord) -> float:
    """Page-locked host memory of the run as the planner counted it when the run started
    (bytes, ``info["plan"]`` of its record; 0 on a CPU run or a record without a plan)."""
    return num((rec.info.get("plan") or {}).get("pinned_host_bytes"), 0.0)


def _throughput_panel(rec: RunRecord) -> Panel:
    p = Panel("throughput", "step", "throughput (tokens/s)")
    x, tokens = xy(rec.steps, "step", "tokens")
    _, secs = xy(rec.steps, "step", "seconds")
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(secs > 0, tokens / secs, np.nan)
    if np.isfinite(y).any():
        p.add(_line(x, y, "tokens/s", "#9467bd"))
        p.traces[-1]["showlegend"] = False  # the panel's title says what it is
    p.note = "" if p.traces else "no finished steps yet"
    return p


# --- data helpers -----------------------------------------------------------------------------
def op_colour(op: str) -> str:
    """Fixed colour of an operation, the same in every figure and run."""
    if op in OP_COLOURS:
        return OP_COLOURS[op]
    palette = qualitative.Dark24
    return palette[zlib.crc32(op.encode()) % len(palette)]  # stable across processes


def _ratio_text(v: float, base: float, i: int, noises: tuple | None = None) -> str:
    """"1234 (0.31x)"; with ``noises`` (the two runs' ``telemetry.noise``) a ratio within
    them reads "1234 (0.98x, within noise)"."""
    if not math.isfinite(v):
        return "-"
    if not (math.isfinite(base) and base > 0):
        return f"{v:.4g}"
    ratio = v / base
    if noises is not None and i and noise.within(ratio, *noises):
        return f"{v:.4g} ({ratio:.2f}x, within noise)"
    return f"{v:.4g} ({ratio:.2f}x)"
