"""Figures of runs, built from ``RunRecord``s by pure functions (plotly only, no widgets).

The live dashboard, a reloaded run directory and the HTML report all call these builders, so
what a notebook shows during training is what the report shows afterwards. Builders never raise
on missing data (a CPU run without NVML, telemetry off, a run that has not finished a step):
the panel is drawn empty, with its axes, and a note says what is missing.

Units: time in seconds since the run's time origin, memory in GB (1e9 bytes), transfer rates in
GB/s, transfer sizes in MB (1e6 bytes), durations in hover text in ms. Every trace is bounded to
about ``MAX_POINTS`` points (min/max per bucket, so peaks survive) so an hour-long run stays
smooth in the browser.

Over the ~400-line guide on purpose: panels, their layout and the data helpers are one concept
(how a record becomes a chart, in one set of units); split, the units would drift apart.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from workbench.telemetry.record import RunRecord
from workbench.telemetry.steady import throughput
from workbench.telemetry.trace import block_label

MAX_POINTS = 2000
GB, MB = 1e9, 1e6
#: Timeline rows, top to bottom; streams not listed follow in name order.
STREAM_ROWS = ("upload", "compute", "offload", "update", "checkpoint")
OP_COLOURS = {"upload": "#1f77b4", "compute": "#2ca02c", "offload": "#ff7f0e",
              "update": "#9467bd", "eval": "#7f7f7f", "checkpoint": "#8c564b"}
RUN_COLOURS = qualitative.D3
ROW_HEIGHT = 300  # px per subplot row
TEMPLATE = "plotly_white"


# --- numbers shared by figures, tables and reports ------------------------------------------
def summary_metrics(rec: RunRecord) -> dict[str, Any]:
    """Headline numbers of a run, from ``rec.summary`` where the run was saved, else computed
    from its steps (a live run has no summary yet).

    Returns:
        ``tokens_per_s`` and ``step_seconds`` (s, median) over steady steps,
        ``wall_tokens_per_s`` over all steps, ``warmup_steps`` (``telemetry.steady``),
        ``peak_gpu_mem_bytes``, ``bytes_h2d`` and ``bytes_d2h`` (bytes per step),
        ``final_loss``, ``eval_accuracy_start`` and ``eval_accuracy`` (fractions), ``steps``,
        ``status``, ``param_digest``; NaN where unknown.
    """
    s, steps = rec.summary, rec.steps
    speed = throughput(steps)
    tail = [_num(r.get("loss")) for r in steps[-max(1, len(steps) // 10):]]
    tail = [x for x in tail if math.isfinite(x)]
    n = max(len(steps), 1)
    peak = _num(s.get("peak_gpu_mem_bytes"))
    if not peak > 0:  # CPU run or no summary: the allocator's per-step peak, then NVML
        peak = max((_num(r.get("mem_peak"), 0.0) for r in steps), default=0.0)
    if not peak > 0:
        peak = max((v for v in _col(rec.samples, "gpu mem used (bytes)") if math.isfinite(v)),
                   default=math.nan)
    out = {
        **{k: s.get(k, v) for k, v in speed.items() if k != "steady_steps"},
        "peak_gpu_mem_bytes": peak,
        "bytes_h2d": s.get("bytes_h2d", sum(_num(r.get("bytes_h2d"), 0.0) for r in steps) / n),
        "bytes_d2h": s.get("bytes_d2h", sum(_num(r.get("bytes_d2h"), 0.0) for r in steps) / n),
        "final_loss": s.get("final_loss", sum(tail) / len(tail) if tail else math.nan),
        "eval_accuracy_start": rec.evals[0]["accuracy"] if rec.evals else math.nan,
        "eval_accuracy": rec.evals[-1]["accuracy"] if rec.evals else math.nan,
        "steps": len(steps),
        "status": rec.status,
        "param_digest": rec.param_digest,
    }
    return {k: _num(v) if k not in ("status", "param_digest", "steps", "warmup_steps") else v
            for k, v in out.items()}


def run_labels(recs: Sequence[RunRecord]) -> list[str]:
    """One distinct label per run (its name, numbered where two runs share one)."""
    names = [r.name for r in recs]
    return [f"{n} #{names[:i].count(n) + 1}" if names.count(n) > 1 else n
            for i, n in enumerate(names)]


# --- one run ----------------------------------------------------------------------------------
def timeline(rec: RunRecord, last_steps: int | None = 3) -> go.Figure:
    """Gantt chart of stream operations: one row per stream, one bar per ``OpEvent`` of the
    last ``last_steps`` steps that have events (None: all kept steps); x in s."""
    return compose([[_timeline_panel(rec, last_steps)]], bars=True)


def memory(rec: RunRecord) -> go.Figure:
    """GPU memory (GB) over time (s): torch allocated / reserved / peak at each step's end, and
    NVML's used memory from the samples."""
    return compose([[_memory_panel(rec)]])


def pcie(rec: RunRecord) -> go.Figure:
    """PCIe RX (host->GPU) and TX (GPU->host) in GB/s over time (s), with the link's peak."""
    return compose([[_pcie_panel(rec)]])


def utilisation(rec: RunRecord) -> go.Figure:
    """GPU utilisation (%) over time (s), from NVML samples."""
    return compose([[_util_panel(rec)]])


def progress(rec: RunRecord) -> go.Figure:
    """Loss per step (dev accuracy in % on a secondary axis) and tokens/s per step."""
    return compose([[_loss_panel(rec), _throughput_panel(rec)]])


def dashboard_figure(rec: RunRecord, last_steps: int | None = 3,
                     panels: list[list[Panel]] | None = None) -> go.Figure:
    """Everything about one run in one figure: what the live view and the report show.
    ``panels``: ``dashboard_panels(rec, last_steps)`` when the caller already built them."""
    fig = compose(panels or dashboard_panels(rec, last_steps), bars=True)
    fig.update_layout(title_text=dashboard_title(rec))
    return fig


def dashboard_panels(rec: RunRecord, last_steps: int | None = 3) -> list[list[Panel]]:
    """The dashboard's panels, row by row (``compose`` lays them out; the live view refills
    its existing figure from them through ``fill``)."""
    return [[_timeline_panel(rec, last_steps)],
            [_loss_panel(rec), _throughput_panel(rec)],
            [_memory_panel(rec), _pcie_panel(rec)],
            [_util_panel(rec)]]


def dashboard_title(rec: RunRecord) -> str:
    return f"{rec.name} ({rec.status}, {len(rec.steps)} steps)"


# --- two runs or more -------------------------------------------------------------------------
def compare_bars(recs: Sequence[RunRecord]) -> go.Figure:
    """Peak GPU memory (GB) and steady throughput (tokens/s, warm-up steps left out), one bar
    per run, labelled with the ratio to the first run."""
    labels, metrics = run_labels(recs), [summary_metrics(r) for r in recs]
    panels = []
    for key, title, scale, unit in (("peak_gpu_mem_bytes", "peak GPU memory", GB, "GB"),
                                    ("tokens_per_s", "steady throughput", 1.0, "tokens/s")):
        values = [m[key] / scale for m in metrics]
        p = Panel(title, "run", f"{title} ({unit})")
        base = values[0] if values else math.nan
        text = [_ratio_text(v, base, i) for i, v in enumerate(values)]
        p.add(go.Bar(x=labels, y=[v if math.isfinite(v) else 0.0 for v in values], text=text,
                     textposition="auto", name=title, showlegend=False,
                     marker_color=[RUN_COLOURS[i % len(RUN_COLOURS)] for i in range(len(recs))],
                     hovertemplate=f"%{{x}}<br>%{{y:.4g}} {unit}<extra></extra>"))
        if not any(math.isfinite(v) and v > 0 for v in values):
            p.note = f"no {title} data" + (" (CPU runs)" if key.startswith("peak") else "")
        panels.append(p)
    return compose([panels])


def compare_loss(recs: Sequence[RunRecord]) -> go.Figure:
    """Loss per step of each run, overlaid."""
    p = Panel("training loss", "step", "loss")
    for i, (rec, label) in enumerate(zip(recs, run_labels(recs))):
        x, y = _xy(rec.steps, "step", "loss")
        if np.isfinite(y).any():
            p.add(_line(x, y, label, RUN_COLOURS[i % len(RUN_COLOURS)]))
    p.note = "" if p.traces else "no finished steps"
    return compose([[p]])


def compare_memory(recs: Sequence[RunRecord]) -> go.Figure:
    """GPU memory (GB) over time (s) of each run, overlaid: NVML's used memory where sampled,
    else torch's allocated memory at each step's end."""
    p = Panel("GPU memory", "time (s)", "GPU memory (GB)")
    for i, (rec, label) in enumerate(zip(recs, run_labels(recs))):
        colour = RUN_COLOURS[i % len(RUN_COLOURS)]
        x, y = _xy(rec.samples, "t (s)", "gpu mem used (bytes)")
        source = "NVML used"
        if not (np.isfinite(y) & (y > 0)).any():
            x, y = _xy(rec.steps, "end", "mem_allocated")
            source = "torch allocated"
        if (np.isfinite(y) & (y > 0)).any():
            p.add(_line(x, y / GB, f"{label} ({source})", colour))
    p.note = "" if p.traces else "no GPU memory data (CPU runs, or NVML unavailable)"
    return compose([[p]])


def compare_timelines(recs: Sequence[RunRecord], last_steps: int | None = 3) -> go.Figure:
    """The runs' timelines stacked, each shifted to start at 0 on one shared time axis, so the
    same steps can be compared bar for bar."""
    legend: set[str] = set()
    grid = [[_timeline_panel(r, last_steps, align=True, legend=legend, title=label)]
            for r, label in zip(recs, run_labels(recs))]
    return compose(grid, bars=True, shared_x=True)


# --- panels: one subplot's traces and axes ---------------------------------------------------
@dataclass
class Panel:
    """One subplot: its traces, axis titles (with units) and a note shown when it is empty."""

    title: str
    xtitle: str
    ytitle: str
    traces: list[Any] = field(default_factory=list)
    secondary: list[bool] = field(default_factory=list)
    y2title: str = ""
    note: str = ""
    yaxis: dict[str, Any] = field(default_factory=dict)
    y2axis: dict[str, Any] = field(default_factory=dict)

    def add(self, trace: Any, secondary: bool = False) -> None:
        self.traces.append(trace)
        self.secondary.append(secondary)


def _timeline_panel(rec: RunRecord, last_steps: int | None, align: bool = False,
                    legend: set[str] | None = None, title: str = "stream timeline") -> Panel:
    p = Panel(title, "time from window start (s)" if align else "time (s)", "stream")
    chosen = sorted({e.step for e in rec.events})
    keep = set(chosen if last_steps is None else chosen[-last_steps:] if last_steps > 0 else [])
    shown = [e for e in rec.events if e.step in keep]
    if not shown:
        p.note = "no stream events (telemetry off, or no step finished yet)"
        return p
    streams = {e.stream for e in shown}
    rows = [s for s in STREAM_ROWS if s in streams] + sorted(streams - set(STREAM_ROWS))
    t0 = min(e.start for e in shown) if align else 0.0
    ops = sorted({e.op for e in shown}, key=lambda o: (list(OP_COLOURS).index(o)
                                                       if o in OP_COLOURS else 99, o))
    legend = set() if legend is None else legend
    for op in ops:
        evs = [e for e in shown if e.op == op]
        p.add(go.Bar(
            orientation="h", y=[e.stream for e in evs], base=[e.start - t0 for e in evs],
            x=[max(e.end - e.start, 0.0) for e in evs], width=0.8, name=op, legendgroup=op,
            showlegend=op not in legend, marker_color=op_colour(op),
            customdata=[[block_label(e.block), e.step, e.nbytes / MB, (e.end - e.start) * 1e3,
                         e.detail] for e in evs],
            hovertemplate=("%{customdata[0]} %{customdata[4]}<br>step %{customdata[1]}<br>"
                           "%{customdata[2]:.3f} MB<br>%{customdata[3]:.3f} ms"
                           "<extra>%{fullData.name}</extra>")))
        legend.add(op)
    # Category order is explicit so upload sits on top and rows never reshuffle as ops arrive.
    p.yaxis = dict(type="category", categoryorder="array", categoryarray=rows,
                   autorange="reversed")
    return p


def _memory_panel(rec: RunRecord) -> Panel:
    p = Panel("GPU memory", "time (s)", "GPU memory (GB)")
    for key, name, dash in (("mem_allocated", "torch allocated", None),
                            ("mem_reserved", "torch reserved", "dot"),
                            ("mem_peak", "torch peak", "dash")):
        x, y = _xy(rec.steps, "end", key)
        if (np.isfinite(y) & (y > 0)).any():  # CPU runs report 0: that is "no data"
            p.add(_line(x, y / GB, name, None, dash=dash))
    x, y = _xy(rec.samples, "t (s)", "gpu mem used (bytes)")
    if np.isfinite(y).any():
        p.add(_line(x, y / GB, "NVML used", "#d62728"))
    p.note = "" if p.traces else "no GPU memory data (CPU run, or NVML unavailable)"
    return p


def _pcie_panel(rec: RunRecord) -> Panel:
    p = Panel("PCIe throughput", "time (s)", "PCIe throughput (GB/s)")
    for key, name, colour in (("pcie rx (bytes/s)", "RX host→GPU", "#1f77b4"),
                              ("pcie tx (bytes/s)", "TX GPU→host", "#ff7f0e")):
        x, y = _xy(rec.samples, "t (s)", key)
        if np.isfinite(y).any():
            p.add(_line(x, y / GB, name, colour))
    peak = _num(rec.environment.get("pcie peak (bytes/s)"))
    if p.traces and math.isfinite(peak):
        t = _finite(_col(rec.samples, "t (s)"))
        p.add(go.Scatter(x=[float(t.min()), float(t.max())], y=[peak / GB] * 2, mode="lines",
                         name="link peak (per direction)", line=dict(dash="dash", color="#555"),
                         hovertemplate="%{y:.2f} GB/s<extra>link peak</extra>"))
    p.note = "" if p.traces else "no PCIe samples (CPU run, or NVML unavailable)"
    return p


def _util_panel(rec: RunRecord) -> Panel:
    p = Panel("GPU utilisation", "time (s)", "GPU utilisation (%)", yaxis={"range": [0, 105]})
    x, y = _xy(rec.samples, "t (s)", "gpu util (%)")
    if np.isfinite(y).any():
        p.add(_line(x, y, "GPU util", "#2ca02c"))
    p.note = "" if p.traces else "no utilisation samples (CPU run, or NVML unavailable)"
    return p


def _loss_panel(rec: RunRecord) -> Panel:
    p = Panel("loss and dev accuracy", "step", "loss", y2title="dev accuracy (%)",
               # plotly.js >= 3 syncs an overlaying axis's ticks to the primary's grid
               # (ticks at 16.5, 35, ... %); fixed quarters read better, without a second grid.
               y2axis={"range": [0, 100], "tickmode": "linear", "dtick": 25, "showgrid": False})
    x, y = _xy(rec.steps, "step", "loss")
    if np.isfinite(y).any():
        p.add(_line(x, y, "loss", "#1f77b4"))
    x, y = _xy(rec.evals, "step", "accuracy")
    if np.isfinite(y).any():
        p.add(go.Scatter(x=x, y=y * 100, mode="lines+markers", name="dev accuracy",
                         line=dict(color="#d62728"),
                         hovertemplate="step %{x}<br>%{y:.1f} %<extra>dev accuracy</extra>"),
              secondary=True)
    p.note = "" if p.traces else "no finished steps yet"
    return p


def _throughput_panel(rec: RunRecord) -> Panel:
    p = Panel("throughput", "step", "throughput (tokens/s)")
    x, tokens = _xy(rec.steps, "step", "tokens")
    _, secs = _xy(rec.steps, "step", "seconds")
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(secs > 0, tokens / secs, np.nan)
    if np.isfinite(y).any():
        p.add(_line(x, y, "tokens/s", "#9467bd"))
    p.note = "" if p.traces else "no finished steps yet"
    return p


# --- composition ------------------------------------------------------------------------------
def compose(grid: list[list[Panel]], bars: bool = False, shared_x: bool = False) -> go.Figure:
    """Lay panels out on a grid; a row holding one panel spans the full width."""
    cols = max(len(row) for row in grid)
    specs = [[{"colspan": cols, "secondary_y": bool(row[0].y2title)}] + [None] * (cols - 1)
             if len(row) == 1 else [{"secondary_y": bool(p.y2title)} for p in row]
             for row in grid]
    titles = [p.title for row in grid for p in row]
    fig = make_subplots(rows=len(grid), cols=cols, specs=specs, subplot_titles=titles,
                        shared_xaxes=shared_x, vertical_spacing=min(0.3 / len(grid), 0.12),
                        # room for a right-hand axis title beside the next panel's left one
                        horizontal_spacing=0.14 if any(p.y2title for row in grid for p in row)
                        else 0.1)
    traces, layout, notes = fill(fig, grid)
    fig.add_traces(traces)
    fig.update_layout(layout, annotations=[*fig.layout.annotations, *notes], template=TEMPLATE,
                      height=ROW_HEIGHT * len(grid) + 80, margin=dict(l=60, r=30, t=70, b=40),
                      hovermode="closest",
                      # Overlay keeps each timeline bar on its own start time instead of
                      # shifting bars of different ops side by side within a row.
                      barmode="overlay" if bars else "group")
    return fig


def fill(fig: go.Figure, grid: list[list[Panel]]) -> tuple[list[Any], dict[str, Any], list[Any]]:
    """The traces (bound to their subplot's axes), axis settings and notes of ``grid``, for a
    figure that ``compose`` made from a grid of the same shape.

    One ``add_traces`` and one ``update_layout`` with these cost a tenth of plotly's per-subplot
    ``row=/col=`` helpers, which matters to the live view: it refills its figure on every
    refresh, on the interpreter the training loop runs on.
    """
    traces: list[Any] = []
    layout: dict[str, Any] = {}
    notes: list[Any] = []
    for r, row in enumerate(grid, start=1):
        for c, p in enumerate(row, start=1):
            main = fig.get_subplot(r, c)
            x, y = main.xaxis.plotly_name, main.yaxis.plotly_name  # "xaxis2", "yaxis3", ...
            ref = {"xaxis": x.replace("axis", ""), "yaxis": y.replace("axis", "")}
            ref2 = dict(ref)
            if p.y2title:
                y2 = fig.get_subplot(r, c, secondary_y=True).yaxis.plotly_name
                ref2["yaxis"] = y2.replace("axis", "")
                layout[y2] = {"title": {"text": p.y2title}, **p.y2axis}
            for trace, secondary in zip(p.traces, p.secondary):
                trace.update(ref2 if secondary else ref)
                traces.append(trace)
            layout[x] = {"title": {"text": p.xtitle}}
            layout[y] = {"title": {"text": p.ytitle}, **p.yaxis}
            if p.note:
                # Centred on the subplot in paper coordinates: plotly.js draws no axes for a
                # subplot without traces, and an "x4 domain" reference to such an axis falls
                # back to the first subplot, piling every empty panel's note onto the timeline.
                (x0, x1), (y0, y1) = main.xaxis.domain, main.yaxis.domain
                notes.append(go.layout.Annotation(
                    # the reason in parentheses on its own line: a half-width panel of the
                    # 700 px live widget is narrower than the whole note
                    text=p.note.replace(" (", "<br>(", 1), x=(x0 + x1) / 2, y=(y0 + y1) / 2,
                    xref="paper", yref="paper", xanchor="center", yanchor="middle",
                    showarrow=False,
                    font=dict(color="#888", size=13)))
    return traces, layout, notes


# --- data helpers -----------------------------------------------------------------------------
def op_colour(op: str) -> str:
    """Fixed colour of an operation, the same in every figure and run."""
    if op in OP_COLOURS:
        return OP_COLOURS[op]
    palette = qualitative.Dark24
    return palette[zlib.crc32(op.encode()) % len(palette)]  # stable across processes


def _num(v: Any, default: float = math.nan) -> float:
    """A float, or ``default`` for None / text (JSON stores NaN as null)."""
    try:
        return default if v is None else float(v)
    except (TypeError, ValueError):
        return default


def _col(rows: Sequence[dict[str, Any]], key: str) -> np.ndarray:
    return np.array([_num(r.get(key)) for r in rows], dtype=float)


def _finite(a: np.ndarray) -> np.ndarray:
    return a[np.isfinite(a)]


def _xy(rows: Sequence[dict[str, Any]], xkey: str, ykey: str,
        max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Columns ``xkey``/``ykey`` as float arrays (rows without an x dropped), bounded."""
    x, y = _col(rows, xkey), _col(rows, ykey)
    ok = np.isfinite(x)
    return downsample(x[ok], y[ok], max_points)


def downsample(x: np.ndarray, y: np.ndarray,
               max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most ``max_points`` points: the min and the max of ``y`` in each of ``max_points/2``
    equal-count buckets, in x order, so spikes (memory peaks, PCIe bursts) stay visible."""
    n = len(x)
    if n <= max_points:
        return x, y
    edges = np.linspace(0, n, max_points // 2 + 1).astype(int)
    keep: list[int] = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        seg = y[lo:hi]
        if hi <= lo:
            continue
        if not np.isfinite(seg).any():  # an all-NaN bucket stays a gap
            keep.append(lo)
            continue
        a, b = lo + int(np.nanargmin(seg)), lo + int(np.nanargmax(seg))
        keep += sorted({a, b})
    idx = np.array(keep)
    return x[idx], y[idx]


def _line(x: np.ndarray, y: np.ndarray, name: str, colour: str | None,
          dash: str | None = None) -> go.Scatter:
    return go.Scatter(x=x, y=y, mode="lines", name=name, line=dict(color=colour, dash=dash),
                      hovertemplate=f"%{{x:.5~g}}<br>%{{y:.4g}}<extra>{name}</extra>")


def _ratio_text(v: float, base: float, i: int) -> str:
    if not math.isfinite(v):
        return "-"
    ratio = f" ({v / base:.2f}x)" if math.isfinite(base) and base > 0 else ""
    return f"{v:.4g}{ratio}"
