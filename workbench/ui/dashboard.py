"""Live view of one run: a plotly ``FigureWidget`` redrawn from snapshots of its ``RunRecord``.

The widget holds display state only. Each refresh takes ``record.snapshot()``, builds the
panels of the figure the report shows (``figures.dashboard_panels``, the builders behind
``figures.dashboard_figure``) and copies their trace data into the existing widget inside one
``batch_update``, so the browser gets one message per refresh and the user's zoom survives.
The subplot grid is laid out once: rebuilding it costs ~10x more than the data, and a refresh
runs on the interpreter the training loop needs. Refreshes are throttled (default at most 2
per second): the training loop never waits for the view.
"""
from __future__ import annotations

import html
import logging
import math
import threading
import time
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from workbench.telemetry.record import RunRecord
from workbench.telemetry.steady import throughput
from workbench.ui.figures import dashboard_figure, dashboard_panels, dashboard_title, fill

log = logging.getLogger(__name__)

#: Record states after which nothing more will arrive.
FINAL_STATES = ("done", "stopped", "failed")


class Dashboard:
    """Args:
        record: the run to show (live: the recipe's record; saved: ``RunRecord.load(dir)``).
        last_steps: steps shown in the stream timeline.
        min_interval_s: least time between two refreshes (s); calls in between are skipped.

    Attributes:
        widget: the ipywidgets container to display.
        figure: the ``go.FigureWidget`` inside it.
        refreshes: how many refreshes have redrawn the figure.
    """

    def __init__(self, record: RunRecord, last_steps: int = 3, min_interval_s: float = 0.5):
        self.record, self.last_steps = record, last_steps
        self.min_interval_s = max(float(min_interval_s), 0.0)
        snap = record.snapshot()
        panels = dashboard_panels(snap, last_steps)
        self.figure = go.FigureWidget(dashboard_figure(snap, last_steps, panels))
        self.status = widgets.HTML(_status_html(snap))
        self.widget = widgets.VBox([self.status, self.figure])
        self.refreshes = 0
        # compose() puts the subplot titles first; notes follow and are redrawn on refresh.
        n_panels = sum(len(row) for row in panels)
        self._titles = tuple(self.figure.layout.annotations[:n_panels])
        self._layout: dict[str, Any] = {}
        self._notes: list[str] | None = None
        self._last = -math.inf
        self._lock = threading.Lock()  # one refresh at a time (timer thread vs. caller)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed_once = False

    def refresh(self, force: bool = False) -> bool:
        """Redraw from a fresh snapshot; returns False when skipped by the throttle."""
        with self._lock:
            now = time.monotonic()
            if not force and now - self._last < self.min_interval_s:
                return False
            self._last = now
            snap = self.record.snapshot()
            traces, layout, notes = fill(self.figure, dashboard_panels(snap, self.last_steps))
            layout["title"] = {"text": dashboard_title(snap)}
            self._apply(traces, layout, notes)
            self.status.value = _status_html(snap)
            self.refreshes += 1
            return True

    def _apply(self, traces: list[Any], layout: dict[str, Any], notes: list[Any]) -> None:
        fig = self.figure
        with fig.batch_update():
            if _shape(fig.data) != _shape(traces):
                # A series appeared (first step, first eval, a new op): swap the traces, but
                # keep the widget, so the notebook's output cell stays the same object.
                fig.data = []
                fig.add_traces([_props(t, keep_type=True) for t in traces])
            else:
                for old, tr in zip(fig.data, traces):
                    old.update(_props(tr), overwrite=True)
            if layout != self._layout:
                fig.update_layout(layout)
                self._layout = layout
            texts = [n.text for n in notes]
            if texts != self._notes:
                # update_layout merges arrays item by item; notes come and go, so set them whole.
                fig.layout.annotations = [*self._titles, *notes]
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
    return [(t.type, t.name, t.xaxis, t.yaxis) for t in data]


def _props(trace: Any, keep_type: bool = False) -> dict[str, Any]:
    d = trace.to_plotly_json()
    d.pop("uid", None)
    if not keep_type:
        d.pop("type", None)
    return d


def _status_html(rec: RunRecord) -> str:
    """One line: state, steps done of planned, latest loss and steady throughput."""
    parts = [f"<b>{html.escape(rec.name)}</b>", html.escape(rec.status)]
    planned = rec.config.get("steps")
    parts.append(f"step {len(rec.steps)}" + (f" of {planned}" if planned else ""))
    if rec.steps:
        last = rec.steps[-1]
        if last.get("loss") is not None:
            parts.append(f"loss {last['loss']:.4f}")
        speed = throughput(rec.steps)
        if math.isfinite(speed["tokens_per_s"]):
            parts.append(f"steady {speed['tokens_per_s']:,.0f} tokens/s, median step "
                         f"{speed['step_seconds']:.4f} s ({speed['warmup_steps']} warm-up "
                         f"step{'s' if speed['warmup_steps'] != 1 else ''} left out)")
    if rec.evals and rec.evals[-1]["accuracy"] is not None:
        parts.append(f"dev accuracy {rec.evals[-1]['accuracy'] * 100:.1f} %")
    elif rec.evals:
        parts.append(f"dev loss {rec.evals[-1]['loss']:.4f}")
    return " · ".join(parts)
