"""How panels become one figure: the subplot grid, its spacing in pixels, the legend, the loss
smoothing slider, and the live refill (plotly only, no widgets, no records).

Figures size to their container's width (``autosize``; plotly.js ``responsive`` in pages), so
every horizontal gap is a fraction of a width only known in the browser. The layout therefore
keeps the text that could collide apart by construction: a right-hand (secondary) axis is only
ever drawn in a grid's last column, beside the figure's right margin; vertical gaps are set in
pixels from the known height; each panel has its own small legend on a line of its own above
its title, left-aligned with it: outside the data, clear of the axes, and never on the title
however long either is. The browser test checks the result from the SVG
text boxes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

TEMPLATE = "plotly_white"
ROW_HEIGHT = 300  # px per subplot row (reports); the live view passes a smaller one
#: Smallest label (px) drawn inside a timeline bar.
UNIFORM_TEXT_PX = 10
#: px of a panel's legend line, above its title line (``TITLE_LINE`` px over the plot)
LEGEND_LINE, TITLE_LINE = 18, 26
#: px between rows: x tick labels, x-axis title, the next row's legend and subplot title
ROW_GAP = 78 + LEGEND_LINE
TOP = 40 + LEGEND_LINE  # px above the first row: its legends and subplot titles
TITLE = 36  # px more for a figure title
SLIDER = 70  # px more for the smoothing slider
AXIS_BELOW = 52  # px under the last row: its tick labels and x-axis title
LEFT, RIGHT, RIGHT_Y2 = 64, 24, 64  # px margins (RIGHT_Y2: a secondary axis in the last column)
H_SPACING = 0.15  # between columns: the right panel's tick labels and y-axis title
#: A legend's width, estimated: px per character at its font size, and per entry (the symbol
#: and the gaps); figures are laid out for the narrowest width they are drawn at.
CHAR_PX, ENTRY_PX, MIN_WIDTH = 6.0, 46, 560
#: Smoothing weights the slider offers (0 = raw), as experiment trackers do.
SMOOTHING_STEPS = (0.0, 0.3, 0.6, 0.8, 0.9, 0.95, 0.99)
#: One colour per run, in the runs' order, the same in every comparison figure.
RUN_COLOURS = qualitative.D3


@dataclass
class Panel:
    """One subplot: its traces, axis titles (with units) and a note shown when it is empty.

    Traces are plain plotly dicts (``{"type": "scatter", ...}``): building them costs nothing
    on the live view's refresh path; ``compose`` validates them into a figure.
    ``smooth``: (index into ``traces``, raw y) of each smoothed line, for the slider.
    """

    title: str
    xtitle: str
    ytitle: str
    traces: list[dict[str, Any]] = field(default_factory=list)
    secondary: list[bool] = field(default_factory=list)
    y2title: str = ""
    note: str = ""
    yaxis: dict[str, Any] = field(default_factory=dict)
    y2axis: dict[str, Any] = field(default_factory=dict)
    smooth: list[tuple[int, np.ndarray]] = field(default_factory=list)

    def add(self, trace: dict[str, Any], secondary: bool = False) -> int:
        self.traces.append(trace)
        self.secondary.append(secondary)
        return len(self.traces) - 1


def line(x: np.ndarray, y: np.ndarray, name: str, colour: str | None,
         dash: str | None = None) -> dict[str, Any]:
    """A line trace (a plain dict, as ``Panel.traces`` holds), hover: x and y."""
    return dict(type="scatter", x=x, y=y, mode="lines", name=name,
                line=dict(color=colour, dash=dash),
                hovertemplate=f"%{{x:.5~g}}<br>%{{y:.4g}}<extra>{name}</extra>")


def ema(y: Sequence[float], weight: float) -> np.ndarray:
    """Exponential moving average with TensorBoard's debiasing (the first points are not pulled
    towards 0); NaNs are skipped and stay NaN. ``weight`` 0 returns ``y``."""
    y = np.asarray(y, dtype=float)
    if weight <= 0:
        return y.copy()
    out = np.full(len(y), math.nan)
    last, n = 0.0, 0
    for i, v in enumerate(y):
        if not math.isfinite(v):
            continue
        last = last * weight + (1 - weight) * v
        n += 1
        out[i] = last / (1 - weight ** n)
    return out


def compose(grid: list[list[Panel]], bars: bool = False, shared_x: bool = False,
            row_height: int = ROW_HEIGHT, title: str = "", slider: bool = False,
            smoothing: float = 0.6, row_gap: int = ROW_GAP,
            h_spacing: float = H_SPACING) -> go.Figure:
    """Lay panels out on a grid; a row holding one panel spans the full width.

    Args:
        row_height, row_gap: px per row and between rows (the figure's height follows from
            them; its width is the container's).
        title: figure title (its own band at the top).
        h_spacing: between columns, a fraction of the width (less where only the first panel
            has a y-axis title).
        slider: add a loss-smoothing slider (static figures: reports, notebooks) that restyles
            every panel's ``smooth`` lines; ``smoothing`` is the weight they were drawn with.
    """
    cols = max(len(row) for row in grid)
    specs = [[{"colspan": cols, "secondary_y": bool(row[0].y2title)}] + [None] * (cols - 1)
             if len(row) == 1 else [{"secondary_y": bool(p.y2title)} for p in row]
             for row in grid]
    for row in grid:  # a right-hand axis title would sit on the next panel's left one
        if any(p.y2title for p in row[:-1]):
            raise ValueError("secondary (right-hand) axes go in the last column of a row")
    slider = slider and any(p.smooth for row in grid for p in row)
    rows = len(grid)
    extra = (legend_lines(grid) - 1) * LEGEND_LINE  # a long legend wraps: room for its lines
    row_gap += extra
    top = TOP + extra + (TITLE if title else 0) + (SLIDER if slider else 0)
    plot = rows * row_height + (rows - 1) * row_gap
    fig = make_subplots(rows=rows, cols=cols, specs=specs,
                        subplot_titles=[p.title for row in grid for p in row],
                        shared_xaxes=shared_x, vertical_spacing=row_gap / plot,
                        horizontal_spacing=h_spacing)
    # Subplot titles (one annotation per panel, in grid order) start at their panel's left
    # edge: the right of the title band is where a full-width panel's legend goes.
    at = [fig.get_subplot(r, c).xaxis.domain[0]
          for r, row in enumerate(grid, start=1) for c in range(1, len(row) + 1)]
    # Lifted a little: the top tick label of a right-hand axis reaches above the plot.
    for label, x in zip(fig.layout.annotations, at):
        label.update(x=x, xanchor="left", yshift=8)
    traces, layout, notes = fill(fig, grid, bars, plot_px=plot)
    fig.add_traces(traces)
    bottom = AXIS_BELOW
    right = RIGHT_Y2 if any(row[-1].y2title for row in grid) else RIGHT
    fig.update_layout(
        layout, annotations=[*fig.layout.annotations, *notes], template=TEMPLATE,
        autosize=True, height=top + plot + bottom,
        margin=dict(l=LEFT, r=right, t=top, b=bottom),
        title=dict(text=title, x=0, xanchor="left", xref="paper", y=1, yref="container",
                   yanchor="top", pad=dict(t=10)) if title else None,
        showlegend=True,
        hovermode="closest",
        # Overlay keeps each timeline bar on its own start time instead of shifting bars of
        # different ops side by side within a row.
        barmode="overlay" if bars else "group",
        # A bar's label (a subgroup's number) that would have to shrink below a readable size
        # to fit its bar is hidden instead (its hover says it); zoomed in, it shows.
        **({"uniformtext": dict(minsize=UNIFORM_TEXT_PX, mode="hide")} if bars else {}))
    if slider:
        fig.update_layout(sliders=[smoothing_slider(grid, fig, smoothing, top)])
    return fig


def legend_lines(grid: list[list[Panel]], width: float = MIN_WIDTH) -> int:
    """Lines the longest legend of ``grid`` wraps to in a figure ``width`` px wide (plotly
    wraps a horizontal legend at the plot's width, then gives every entry the widest one's
    room); at least 1."""
    plot = width - LEFT - RIGHT_Y2
    lines = 1
    for row in grid:
        for p in row:
            sizes = [ENTRY_PX + CHAR_PX * len(str(t["name"])) for t in p.traces
                     if t.get("showlegend") is not False and t.get("name")]
            if sizes and sum(sizes) > plot:
                per_line = max(1, int(plot // max(sizes)))
                lines = max(lines, -(-len(sizes) // per_line))
    return lines


def smoothing_slider(grid: list[list[Panel]], fig: go.Figure, active: float,
                     top: int) -> dict[str, Any]:
    """A slider over ``SMOOTHING_STEPS`` whose steps restyle the smoothed lines' y (computed
    here, in Python: the page needs no code of its own)."""
    index, raws = [], []
    offset = 0
    for row in grid:
        for p in row:
            for i, raw in p.smooth:
                index.append(offset + i)
                raws.append(raw)
            offset += len(p.traces)
    steps = [dict(method="restyle", label=f"{w:g}",
                  args=[{"y": [ema(r, w).tolist() for r in raws]}, index])
             for w in SMOOTHING_STEPS]
    near = min(range(len(SMOOTHING_STEPS)), key=lambda k: abs(SMOOTHING_STEPS[k] - active))
    # Its top edge under the figure title; the first row's subplot titles sit below it.
    below_title = top - (TITLE if fig.layout.title.text else 0)
    return dict(active=near, steps=steps, x=1, xanchor="right", len=0.45,
                y=1 + below_title / _plot_px(fig), yanchor="top", pad=dict(t=0, b=0),
                font=dict(size=10), ticklen=3,
                currentvalue=dict(prefix="loss smoothing (EMA weight): ", font=dict(size=12),
                                  xanchor="right", offset=4))


def _plot_px(fig: go.Figure) -> float:
    m = fig.layout.margin
    return fig.layout.height - m.t - m.b


def fill(fig: go.Figure, grid: list[list[Panel]], bars: bool = False,
         plot_px: float | None = None) -> tuple[list[dict], dict[str, Any], list[dict]]:
    """The traces (bound to their subplot's axes), axis settings and notes of ``grid``, for a
    figure that ``compose`` made from a grid of the same shape.

    One ``add_traces`` and one ``update_layout`` with these cost a tenth of plotly's per-subplot
    ``row=/col=`` helpers, which matters to the live view: it refills its figure on every
    refresh, on the interpreter the training loop runs on. ``plot_px``: the height of the
    figure's plotting area (default: read from ``fig``), which places the legend lines.
    """
    above = TITLE_LINE / (plot_px or _plot_px(fig))  # the legend line's bottom, in paper units
    traces: list[dict[str, Any]] = []
    layout: dict[str, Any] = {}
    notes: list[dict[str, Any]] = []
    panel_no = 0
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
            # One legend per panel, named by its place in the grid and always in the layout,
            # listed traces or not: a legend that first appeared on a live refresh reached
            # plotly.js as "legend2" and "legend2.xref" at once, which it refuses ("cannot set
            # legend2.xref and a parent attribute simultaneously").
            legend = "legend" if not panel_no else f"legend{panel_no + 1}"
            panel_no += 1
            for trace, secondary in zip(p.traces, p.secondary):
                trace = {**trace, **(ref2 if secondary else ref)}  # the panel keeps its own
                trace["legend"] = legend
                traces.append(trace)
            layout[legend] = _legend_at(main.xaxis.domain, main.yaxis.domain[1] + above)
            # An empty panel keeps its titles but no tick labels: plotly.js would number its
            # default ranges, and the note says what is missing. x tick labels stand off the
            # axis so the x and y zeros at a corner do not touch.
            shown = bool(p.traces) and not p.note
            layout[x] = {"title": {"text": p.xtitle}, "showticklabels": shown,
                         "ticklabelstandoff": 6}
            # the y title close to its tick labels: the gap to the panel on the left is a
            # fraction of a width that can be small
            layout[y] = {"title": {"text": p.ytitle, "standoff": 6}, "showticklabels": shown,
                         **p.yaxis}
            if not shown:
                layout[y]["showticklabels"] = False
            # One note per panel, empty when it has data: the live view then changes texts,
            # never the number of annotations (plotly.js kept removed ones on screen).
            # Centred on the subplot in paper coordinates: plotly.js draws no axes for a
            # subplot without traces, and an "x4 domain" reference to such an axis falls back
            # to the first subplot, piling every empty panel's note onto the timeline.
            (x0, x1), (y0, y1) = main.xaxis.domain, main.yaxis.domain
            notes.append(dict(
                # the reason in parentheses on its own line: a half-width panel is narrower
                # than the whole note
                text=p.note.replace(" (", "<br>(", 1), x=(x0 + x1) / 2, y=(y0 + y1) / 2,
                xref="paper", yref="paper", xanchor="center", yanchor="middle",
                showarrow=False, font=dict(color="#888", size=13)))
    return traces, layout, notes


def _legend_at(xdomain: Sequence[float], bottom: float) -> dict[str, Any]:
    """A panel's legend: one row on its own line right above the panel's title, its bottom at
    ``bottom`` (paper units), left-aligned with the title (so each legend reads as its panel's,
    however close the next panel's is)."""
    return dict(xref="paper", yref="paper", xanchor="left", x=xdomain[0], font=dict(size=10),
                bgcolor="rgba(255,255,255,0)", itemclick="toggle", tracegroupgap=2,
                orientation="h", y=bottom, yanchor="bottom", valign="middle")
