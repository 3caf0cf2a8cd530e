"""Live view of one run: a plotly ``FigureWidget`` redrawn from snapshots of its ``RunRecord``.

The widget holds display state only (the loss smoothing, the loss panel's x axis: steps,
wall-clock seconds or forward passes, and the throttle). Each refresh takes
``record.snapshot()``, builds the panels of the figure the report shows
(``figures.dashboard_panels``, the builders behind ``figures.dashboard_figure``) and copies
their trace data into the existing widget inside one ``batch_update``, so the browser gets one
message per refresh and the user's zoom survives. The subplot grid is laid out once: rebuilding
it costs ~10x more than the data, and a refresh runs on the interpreter the training loop needs.
Refreshes are throttled (default at most 2 per second, and at most ``BUDGET`` = 2% of the time:
a refresh of a long run that took 40 ms waits 2 s for the next): the training loop never waits
for the view. The header says the run's state and its learning health (``health``: learning,
diverging, ... with the next thing to try), why its step takes what it takes (``verdict``) and
the planner's best next knob (``advice``), from the same record.
"""
from __future__ import annotations

import html
import logging
import math
import threading
import time
from typing import Any

import ipywidgets as widgets
import numpy as np
from plotly.basedatatypes import Undefined

from workbench.telemetry.advice import Advice, next_knob
from workbench.telemetry.evals import eval_value, main_metric
from workbench.telemetry.health import Health, health
from workbench.telemetry.naming import run_labels
from workbench.telemetry.record import RunRecord
from workbench.telemetry.steady import throughput
from workbench.telemetry.verdict import Verdict, verdict
from workbench.ui.figures import (SMOOTHING, STEPS, X_AXES, dashboard_figure,
                                  dashboard_panels, fill)
from workbench.ui.series import col, seed_columns, shared_columns
from workbench.ui.fit import figure_widget

log = logging.getLogger(__name__)

#: Most of the interpreter's time the view may take: after a refresh of t seconds the next
#: waits at least t / BUDGET (the training loop shares the interpreter).
BUDGET = 0.02
#: The trace properties a refresh changes; the rest (names, colours, axes) make a trace's shape.
DATA_KEYS = ("x", "y", "base", "customdata", "text")
#: Every this many refreshes (and on a forced one) the layout is sent whole again.
RESYNC_EVERY = 10
#: Record states after which nothing more will arrive.
FINAL_STATES = ("done", "stopped", "failed", "diverged")


class Dashboard:
    """Args:
        record: the run to show (live: the recipe's record; saved: ``RunRecord.load(dir)``).
        last_steps: steps shown in the stream timeline.
        min_interval_s: least time between two refreshes (s); calls in between are skipped.
        smoothing: the loss EMA weight at first (0 = raw; the header's slider changes it).
        x: what the loss panel's x axis counts at first: ``"steps"``, ``"wall-clock (s)"``
            or ``"forward passes"`` (``learning.X_AXES``; the dropdown above the figure changes it).

    Attributes:
        widget: the ipywidgets container to display.
        figure: the ``go.FigureWidget`` inside it.
        status: the header (state, health, verdict, next knob); smoothing: its slider;
            x_axis: the loss panel's x-axis dropdown.
        refreshes: how many refreshes have redrawn the figure.
        verdict / advice / health: what the header shows (None until there is something to
            say).
    """

    def __init__(self, record: RunRecord, last_steps: int = 3, min_interval_s: float = 0.5,
                 smoothing: float = SMOOTHING, x: str = STEPS):
        if x not in X_AXES:
            raise ValueError(f"x={x!r}: use one of {', '.join(map(repr, X_AXES))}")
        self.record, self.last_steps = record, last_steps
        self.min_interval_s = max(float(min_interval_s), 0.0)
        snap = record.snapshot()
        self.verdict: Verdict | None = None
        self.advice: Advice | None = None
        self.health: Health | None = None
        self._verdict_steps = -1
        self._health_key: tuple = ()
        self._advice_key: Any = None
        self.smoothing = widgets.FloatSlider(
            value=smoothing, min=0.0, max=0.99, step=0.01, description="loss smoothing",
            continuous_update=False, readout_format=".2f", style={"description_width": "100px"},
            tooltip="EMA weight of the smoothed loss line (0 = raw only)",
            layout=widgets.Layout(width="300px", flex="0 0 auto"))
        # Methods cost different forward passes per step: per step, a q=4 run looks 4x
        # better than it is; the loss panel can count seconds or forward passes instead. A
        # dropdown, not buttons: beside the slider it fits the knob panel's 580 px column on
        # one row (three buttons left the slider a 30 px track), so the figure stays in a
        # 900 px window.
        self.x_axis = widgets.Dropdown(
            options=list(X_AXES), value=x, description="loss x axis",
            tooltip="what the loss panel's x axis counts (training time and forward passes: "
                    "evals not counted; first-order methods: each pass with a backward)",
            style={"description_width": "70px"},
            layout=widgets.Layout(width="220px", flex="0 0 auto"))
        panels = dashboard_panels(snap, last_steps, smoothing, live=True, x=x)
        self.figure = figure_widget(dashboard_figure(snap, last_steps, panels, live=True))
        self.status = widgets.HTML(self._header(snap),
                                   layout=widgets.Layout(width="100%", min_width="0"))
        # The header takes the whole width (beside the slider it wrapped to a dozen lines in
        # the knob panel's column); the loss panel's controls have a row of their own,
        # right-aligned (the loss panel is in the right-hand column), wrapping when narrow:
        # one row keeps the figure inside a 900 px window beside the knob panel.
        self.widget = widgets.VBox(
            [self.status,
             widgets.HBox([self.x_axis, self.smoothing], layout=widgets.Layout(
                 width="100%", justify_content="flex-end", flex_flow="row wrap")),
             self.figure], layout=widgets.Layout(width="100%", min_width="0"))
        self.refreshes = 0
        self.last_refresh_s = 0.0  # CPU time the last refresh took on its thread (s)
        self._once_s = 0.0  # of which one-off work (the planner's advice)
        self._columns: dict[str, np.ndarray] = {}  # the samples' columns, read so far
        self._columns_n = 0
        self._shape: list[tuple] | None = None  # the figure's traces, as ``_key`` sees them
        # compose() puts the subplot titles first; notes follow and are redrawn on refresh.
        n_panels = sum(len(row) for row in panels)
        self._titles = tuple(self.figure.layout.annotations[:n_panels])
        self._grid = _grid_key(panels)
        self._layout: dict[str, Any] = {}
        self._notes: list[str] | None = None
        self._last = -math.inf
        self._lock = threading.Lock()  # one refresh at a time (timer thread vs. caller)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed_once = False
        self.smoothing.observe(lambda _: self.refresh(force=True), names="value")
        self.x_axis.observe(lambda _: self._new_x_axis(), names="value")

    def refresh(self, force: bool = False) -> bool:
        """Redraw from a fresh snapshot; returns False when skipped by the throttle: within
        ``min_interval_s`` of the last refresh, or before the last one's cost is paid back
        (refreshes take at most ``BUDGET`` of the time, however long the run has grown)."""
        with self._lock:
            now = time.monotonic()
            gap = max(self.min_interval_s, self.last_refresh_s / BUDGET)
            if not force and now - self._last < gap:
                return False
            self._last = now
            self._once_s = 0.0
            cpu = time.thread_time()
            try:
                return self._redraw(force)
            finally:
                # This thread's CPU time, not the wall time: waiting for the interpreter while
                # the training loop holds it costs the loop nothing. The planner's advice is
                # worked out once per run: not a cost to pace by.
                self.last_refresh_s = max(time.thread_time() - cpu - self._once_s, 0.0)

    def _redraw(self, force: bool) -> bool:
        snap = self.record.snapshot()
        with shared_columns():
            seed_columns(snap.samples, self._sample_columns(snap.samples))
            panels = dashboard_panels(snap, self.last_steps, self.smoothing.value, live=True,
                                      x=self.x_axis.value)
        if _grid_key(panels) != self._grid:  # e.g. a record swapped for another device's
            self._rebuild(snap, panels)
        else:
            self._apply(*fill(self.figure, panels, bars=True))
            if force or self.refreshes % RESYNC_EVERY == 1:
                self._resync()
        self.status.value = self._header(snap)
        self.refreshes += 1
        return True

    def _new_x_axis(self) -> None:
        """Redraw on the chosen x axis, and let the loss panel's range fit it: a zoom in steps
        means nothing in seconds."""
        self.refresh(force=True)
        ours = ("loss", "loss (EMA)", main_metric(self.record.config).label)
        names = {t.xaxis or "x" for t in self.figure.data if t.name in ours}
        with self.figure.batch_update():
            for name in names:
                self.figure.layout[name.replace("x", "xaxis", 1)].autorange = True

    def _resync(self) -> None:
        """Send the whole layout (axes, legends, notes) to the browser again. plotly's widget
        sends only changes, and a view of this figure displayed in a second output while a
        change was on its way kept the old axes and notes (seen in JupyterLab 4); a full
        relayout now and then brings every view back in line."""
        layout = self.figure.layout.to_plotly_json()
        for key in ("template", "width", "height"):  # unchanged; a height would end autosize
            layout.pop(key, None)
        layout["autosize"] = True  # and measure the container again (see ``fit``)
        self.figure._send_relayout_msg(layout)  # plotly's own sender; the diffing one skips

    def _sample_columns(self, samples: list[dict[str, float]]) -> dict[str, np.ndarray]:
        """The samples as columns, reading only the rows added since the last refresh (the
        sampler only appends; a shorter list means another record: start over)."""
        n = self._columns_n
        if len(samples) < n:
            self._columns, n = {}, 0
        new = samples[n:]
        if new:
            for key in set(self._columns).union(new[0], new[-1]):  # a sample's keys are fixed
                old = self._columns.get(key, np.full(n, np.nan))
                self._columns[key] = np.concatenate([old, col(new, key)])
        self._columns_n = len(samples)
        return self._columns

    def _rebuild(self, snap: RunRecord, panels: list) -> None:
        """A new grid: a new figure in the same container."""
        self.figure = figure_widget(dashboard_figure(snap, self.last_steps, panels, live=True))
        self._titles = tuple(self.figure.layout.annotations[:sum(len(r) for r in panels)])
        self._grid, self._layout, self._notes = _grid_key(panels), {}, None
        self._shape = None
        self.widget.children = (*self.widget.children[:2], self.figure)

    def _header(self, snap: RunRecord) -> str:
        """Status line, then the verdict and the next knob (recomputed when a step was added;
        the advice once per config and GPU, as it depends on nothing else)."""
        if len(snap.steps) != self._verdict_steps:
            self._verdict_steps = len(snap.steps)
            v = verdict(snap)
            self.verdict = v if v.kind != "unknown" or snap.steps else None
        key = (tuple(sorted((k, str(v)) for k, v in snap.config.items())),
               snap.environment.get("gpu name"), bool(snap.environment))
        if snap.environment and key != self._advice_key:  # the environment arrives at setup
            t = time.thread_time()
            self._advice_key, self.advice = key, next_knob(snap)
            self._once_s = time.thread_time() - t
        seen = (len(snap.steps), len(snap.evals), snap.status)
        if seen != self._health_key:  # linear in the steps: only when something was added
            self._health_key, self.health = seen, health(snap) if snap.steps else None
        return _status_html(snap, self.verdict, self.advice, self.health)

    def _apply(self, traces: list[dict], layout: dict[str, Any], notes: list[dict]) -> None:
        fig = self.figure
        shape = [_key(t) for t in traces]
        if self._shape is None:  # reading plotly's traces back is slow: done once a figure
            self._shape = _shape(fig.data)
        if shape != self._shape:
            # A series appeared (first step, first eval, a new op): swap the traces, but keep
            # the widget, so the notebook's output cell stays the same object.
            with fig.batch_update():
                fig.data = []
                fig.add_traces(traces)
            self._shape = shape
        else:
            # The same series with new data: one restyle of the data arrays, which plotly
            # stores without re-validating (validating every property cost ~50 ms a refresh).
            data = {k: [t.get(k, Undefined) for t in traces] for k in DATA_KEYS
                    if any(k in t for t in traces)}
            fig.plotly_restyle(data, list(range(len(traces))))
        if layout != self._layout:
            fig.update_layout(layout)
            self._layout = layout
        texts = [n["text"] for n in notes]
        if texts != self._notes:  # one note per panel (empty when it has data)
            with fig.batch_update():
                for ann, text in zip(fig.layout.annotations[len(self._titles):], texts):
                    ann.text = text
            self._notes = texts

    # --- timer ------------------------------------------------------------------------------
    def start_auto_refresh(self, interval_s: float = 0.5) -> threading.Thread:
        """Refresh every ``interval_s`` seconds (no faster than ``min_interval_s``) on a daemon
        thread, until the record reaches a final state or ``stop_auto_refresh()``."""
        self.stop_auto_refresh()
        interval = max(float(interval_s), self.min_interval_s, 0.05)
        stop = self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(stop, interval), daemon=True,
                                        name="workbench-dashboard")
        self._thread.start()
        return self._thread

    def stop_auto_refresh(self, timeout_s: float = 5.0) -> None:
        """Stop the timer thread (waits up to ``timeout_s`` seconds for it)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
        self._thread = None

    @property
    def auto_refreshing(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self, stop: threading.Event, interval: float) -> None:
        while not stop.is_set():
            final = self.record.status in FINAL_STATES  # read first: the last redraw is complete
            try:
                self.refresh(force=final)
            except Exception:  # a drawing bug must not kill the view; say it once
                if not self._failed_once:
                    log.exception("dashboard refresh failed")
                    self._failed_once = True
            if final:
                return
            stop.wait(interval)


def _shape(data: Any) -> list[tuple]:
    return [(t.type, t.name, t.xaxis, t.yaxis, t.showlegend is not False) for t in data]


def _key(trace: dict[str, Any]) -> tuple:
    """What ``_shape`` reads of a figure's trace, from a panel's trace dict."""
    return (trace.get("type"), trace.get("name"), trace.get("xaxis", "x"),
            trace.get("yaxis", "y"), trace.get("showlegend") is not False)


def _grid_key(panels: list) -> tuple:
    return tuple(tuple(p.title for p in row) for row in panels)


#: Header colours of the health states (the report's too).
HEALTH_COLOURS = {"learning": "#1a7f37", "not learning": "#666", "diverging": "#b35900",
                  "diverged": "#b00020", "too short to tell": "#666"}


def _short_basis(basis: str) -> str:
    """The health's basis for the header: 'on the training loss of 40 steps; one dev eval so
    far, at step 0 (80 examples)' without its article, to keep the row short."""
    return "on " + basis.replace("the training loss", "training loss")


def _status_html(rec: RunRecord, v: Verdict | None = None, advice: Advice | None = None,
                 h: Health | None = None) -> str:
    """Line 1: the run (its folder, method and model), state, steps done of planned, learning
    health (its evidence and the next thing to try on hover), latest loss and steady
    throughput, and why GPU metrics are off when they are. A diverging or diverged run: its
    evidence and what to try, on a line of its own. Last: the bottleneck verdict and the
    planner's next knob."""
    parts = [f"<b>{html.escape(run_labels([rec])[0])}</b>", html.escape(rec.status)]
    planned = rec.config.get("steps")
    parts.append(f"step {len(rec.steps)}" + (f" of {planned}" if planned else ""))
    if rec.steps:
        last = rec.steps[-1]
        if last.get("loss") is not None:
            parts.append(f"loss {last['loss']:.4f}")
        speed = throughput(rec.steps)
        if math.isfinite(speed["tokens_per_s"]):
            # short: the header shares its row with the smoothing slider (the CLI and the
            # report say how many warm-up steps were left out)
            parts.append(f"{speed['tokens_per_s']:,.0f} tokens/s steady, step "
                         f"{speed['step_seconds']:.3f} s")
    main = main_metric(rec.config)  # the objective's main dev metric, as the loss panel plots
    value = eval_value(rec, main.key, "end")
    if value is not None:
        parts.append(f"{main.label} {value * 100:.1f} %" if main.fraction
                     else f"{main.label} {value:.4f}")
    nvml = str(rec.environment.get("nvml", "ok"))
    if nvml != "ok":
        off = nvml.split(":")[0] if nvml.startswith("NVML unavailable") else nvml
        parts.append(f"<span style='color:#666'>GPU metrics off ({html.escape(off)})</span>")
    if h is not None:  # the state here, its evidence on hover (the header stays short)
        full = h.text + (f"; next: {h.advice}" if h.advice else "")
        basis = h.evidence.get("basis")  # what it read, in view: the state alone overclaims
        on = (f" <span style='color:#666'>({html.escape(_short_basis(basis))})</span>"
              if basis else "")
        parts.insert(3, f"<b style='color:{HEALTH_COLOURS.get(h.state, '#222')}' "
                        f"title='{html.escape(full, quote=True)}'>{html.escape(h.state)}</b>"
                        + on)
    lines = [" · ".join(parts)]
    if h is not None and h.state in ("diverging", "diverged"):  # worth a line of its own
        lines.append(f"<b style='color:{HEALTH_COLOURS[h.state]}'>{html.escape(h.text)}</b>"
                     + (f" · next: {html.escape(h.advice)}" if h.advice else ""))
    why = []
    if v is not None:
        why.append(f"<b>{html.escape(v.text)}</b>")
    if advice is not None and advice.text:
        why.append(f"next knob: {html.escape(advice.text)}")
    if why:
        lines.append(" · ".join(why))
    return "<div style='line-height:1.35'>" + "<br>".join(lines) + "</div>"
