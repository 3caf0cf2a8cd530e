"""Sweep widget: pick knobs and values (multi-selects), press Sweep, watch the comparison fill in as each run
finishes, Stop at any time; Tune asks the planner for settings and measures the best few.

    sweeper = SweepPanel(RunConfig(method="zo-offload", model="tiny-opt"), out_dir="runs/sweeps")
    sweeper.widget                       # in a notebook
    sweeper.selectors["overlap"].value = (True, False)    # what clicking does
    sweeper.sweep()                      # the Sweep button: a thread, like the knob panel's Run

The widget holds display state only: the grid, the runs and the manifest are
``recipes.sweep.Sweep``'s (the CLI's ``sweep`` command), the table is ``sweep_view``'s, the
figures are ``figures``' comparisons of the finished runs' records. Each press writes a new
folder under ``out_dir`` (``<time>-sweep`` / ``<time>-tune``), so nothing saved is replaced.
"""
from __future__ import annotations

import html
import logging
import threading
from pathlib import Path
from typing import Any, Callable

import ipywidgets as widgets

from workbench.config import ConfigError, RunConfig, knob_info
from workbench.engine.events import StepEvent
from workbench.models.shape import shape_of
from workbench.recipes.sweep import Point, Sweep
from workbench.ui import figures
from workbench.ui.fit import figure_widget
from workbench.ui.panel import new_folder
from workbench.ui.sweep_view import sweep_table_html

log = logging.getLogger(__name__)

#: The scheduler knobs the widget offers by default.
SCHEDULER_KNOBS = ("overlap", "prefetch_depth", "resident_blocks", "codec")


def make_selector(name: str, current: Any, layers: int) -> widgets.SelectMultiple:
    """A multi-select of the knob's values (bools, choices, the whole numbers of its range up
    to ``layers`` for resident_blocks and 16 past the minimum otherwise); the current value is
    selected at first. Ctrl / Shift + click selects several."""
    info = knob_info(name)
    if info["type"] in ("bool", bool):
        options: list[Any] = [("true", True), ("false", False)]
    elif info["choices"]:
        options = list(info["choices"])
    elif info["type"] in ("int", int):
        lo = int(info["lo"])
        hi = layers if name == "resident_blocks" else min(int(info["hi"]), lo + 16)
        options = list(range(lo, hi + 1))
    else:
        raise ValueError(f"{name}: the sweep widget offers bools, choices and whole numbers")
    return widgets.SelectMultiple(
        options=options, value=(current,), rows=min(len(options), 4), description=name,
        tooltip=f"{info['help']}: the values to sweep (Ctrl/Shift + click for several)",
        style={"description_width": "110px"}, layout=widgets.Layout(width="250px"))


class SweepPanel:
    """Args:
        base: the settings every point shares: a ``RunConfig``, or a ``KnobPanel`` (its
            current knobs are read when Sweep or Tune is pressed); None: ``RunConfig(**defaults)``.
        out_dir: each press writes ``out_dir/<time>-sweep/`` (or ``-tune``).
        knobs: the knobs offered.
        trial_steps: steps per Tune trial.

    Attributes:
        widget: the container to display. selectors: knob -> its control.
        sweep_obj: the current or last ``Sweep``; thread: its thread; last_dir: its folder;
        error: what the last sweep raised, if anything; tune_result: the last tune's result.
    """

    def __init__(self, base: Any = None, out_dir: str | Path = "runs/sweeps",
                 knobs: tuple[str, ...] = SCHEDULER_KNOBS, trial_steps: int = 6,
                 **defaults: Any):
        self._base = base if base is not None else RunConfig(**defaults)
        self.out_dir, self.trial_steps = Path(out_dir), trial_steps
        self.sweep_obj: Sweep | None = None
        self.thread: threading.Thread | None = None
        self.last_dir: Path | None = None
        self.error: BaseException | None = None
        self.tune_result: Any = None
        self._stop_early = False  # Stop pressed before Tune's trials exist
        start = self._base_config()
        layers = shape_of(start.model).num_layers
        self.selectors = {k: make_selector(k, getattr(start, k), layers) for k in knobs}
        for ctl in self.selectors.values():
            ctl.observe(lambda _: self._preview(), names="value")
        self.sweep_button = widgets.Button(description="Sweep", button_style="success",
                                           icon="play", layout=widgets.Layout(width="auto"))
        self.stop_button = widgets.Button(description="Stop", button_style="danger",
                                          icon="stop", disabled=True,
                                          layout=widgets.Layout(width="auto"))
        self.tune_button = widgets.Button(description="Tune", icon="magic",
                                          tooltip="the planner proposes settings that fit; "
                                          "short trials measure the best few",
                                          layout=widgets.Layout(width="auto"))
        self.budget = widgets.FloatText(value=0.0, description="GPU GiB",
                                        tooltip="Tune: GPU memory the settings must fit "
                                        "(0 = this GPU's free memory)",
                                        style={"description_width": "60px"},
                                        layout=widgets.Layout(width="150px"))
        self.top = widgets.IntSlider(value=3, min=1, max=8, description="candidates",
                                     style={"description_width": "80px"},
                                     layout=widgets.Layout(width="250px"))
        self.sweep_button.on_click(lambda _: self.sweep())
        self.stop_button.on_click(lambda _: self.stop())
        self.tune_button.on_click(lambda _: self.tune())
        self.grid_info = widgets.HTML()
        self.message = widgets.HTML()
        self.table = widgets.HTML()
        self.figures = widgets.VBox(layout=widgets.Layout(width="100%"))
        picks = widgets.HBox(list(self.selectors.values()),
                             layout=widgets.Layout(flex_flow="row wrap", grid_gap="6px"))
        buttons = widgets.HBox([self.sweep_button, self.stop_button, self.tune_button,
                                self.budget, self.top],
                               layout=widgets.Layout(flex_flow="row wrap", align_items="center"))
        self.widget = widgets.VBox([picks, buttons, self.grid_info, self.message, self.table,
                                    self.figures], layout=widgets.Layout(width="100%"))
        self._preview()

    # --- settings ---------------------------------------------------------------------------
    def _base_config(self) -> RunConfig:
        return self._base.config() if hasattr(self._base, "config") else self._base

    def axes(self) -> dict[str, list[Any]]:
        """The selected values per knob, in the order the widget lists them."""
        return {name: list(ctl.value) for name, ctl in self.selectors.items()}

    def _plan(self, folder: Path) -> Sweep:
        """The grid of the current selection (checked by the config and the planner); a knob
        with one value selected is a setting of every point, not an axis."""
        axes = self.axes()
        empty = [k for k, v in axes.items() if not v]
        if empty:
            raise ConfigError([f"{k}: select at least one value" for k in empty])
        fixed = {k: v[0] for k, v in axes.items() if len(v) == 1}
        base = self._base_config().replace(**fixed)
        return Sweep.grid(base, {k: v for k, v in axes.items() if len(v) > 1}, folder)

    def _preview(self) -> None:
        try:
            s = self._plan(self.out_dir / "preview")
        except ConfigError as e:
            self.grid_info.value = _problems(e.problems)
            return
        refused = [p for p in s.points if p.status == "refused"]
        text = f"{len(s.points)} point(s): {len(s.points) - len(refused)} to run"
        if refused:
            text += f", {len(refused)} refused (" + "; ".join(
                html.escape(f"{p.name}: {p.reason}") for p in refused[:3]) + ")"
        self.grid_info.value = f"<i>{text}</i>"

    # --- running ----------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def sweep(self) -> threading.Thread | None:
        """Start the selected grid on a daemon thread (the Sweep button); None (problems shown)
        when the settings are invalid, nothing can run, or a sweep is already going."""
        if self.running:
            self._say("a sweep is already going: Stop it first")
            return None
        folder = self._folder("sweep")
        try:
            s = self._plan(folder)
        except ConfigError as e:
            self.grid_info.value = _problems(e.problems)
            return None
        if not s.runnable:
            self.grid_info.value = _problems(["every point was refused: " + "; ".join(
                f"{p.name}: {p.reason}" for p in s.points)])
            return None
        self.sweep_obj = s

        def work() -> str:
            s.run(on_update=self._on_update, on_step=self._on_step)
            return (f"{s.status}: {len(s.finished())} of {len(s.points)} point(s) finished; "
                    f"folder {s.out_dir}")

        return self._start(work, folder, f"sweeping {len(s.runnable)} run(s) -> {folder}")

    def tune(self) -> threading.Thread | None:
        """Tune the base settings on a daemon thread (the Tune button): the planner's ``top``
        settings within the budget, ``trial_steps`` steps each; the fastest goes to
        ``<folder>/best.toml``."""
        from workbench.recipes.tune import gpu_problems, tune

        if self.running:
            self._say("a sweep is already going: Stop it first")
            return None
        try:
            base = self._base_config()
        except ConfigError as e:
            self.grid_info.value = _problems(e.problems)
            return None
        refused = gpu_problems(base)  # on a CPU: one line, no thread, no folder
        if refused:
            self.grid_info.value = _problems(refused)
            return None
        folder = self._folder("tune")
        budget = self.budget.value or None

        def work() -> str:
            r = self.tune_result = tune(base, folder, budget_gb=budget, top=self.top.value,
                                        trial_steps=self.trial_steps, on_update=self._on_update,
                                        start=self._adopt)
            if r.toml is None:
                return f"{r.sweep.status}: no trial finished; folder {folder}"
            tied = r.sweep.extra.get("within_noise") or []
            if len(tied) > 1:  # no winner: the planner's first choice among them is kept
                return (f"no winner: {len(tied)} trials within noise of each other; kept the "
                        f"planner's first choice, {r.best.name}; settings written to {r.toml}")
            return f"fastest: {r.best.name}; settings written to {r.toml}"

        return self._start(work, folder, f"tuning: planning candidates -> {folder}")

    def _adopt(self, s: Sweep) -> None:
        self.sweep_obj = s
        if self._stop_early:
            s.stop()

    def stop(self) -> None:
        """Stop the running point after its step and skip the rest (the Stop button)."""
        self._stop_early = True
        if self.sweep_obj is not None and self.running:
            self.sweep_obj.stop()
            self._say("stopping after the current step")

    def _start(self, work: Callable[[], str], folder: Path, text: str) -> threading.Thread:
        self.error, self.last_dir, self._stop_early = None, folder, False
        self.table.value = ""
        self._set_figures([])
        self._set_running(True)
        self._say(text)
        self.thread = threading.Thread(target=self._work, args=(work,), daemon=True,
                                       name="workbench-sweep")
        self.thread.start()
        return self.thread

    def _work(self, work: Callable[[], str]) -> None:
        try:
            self._say(work())
        except BaseException as e:  # shown in the widget: a notebook thread has no traceback
            self.error = e
            log.exception("sweep failed")
            problems = e.problems if isinstance(e, ConfigError) else [f"{type(e).__name__}: {e}"]
            self._say("failed: " + "; ".join(problems))
        finally:
            self._show()
            self._set_running(False)

    def _on_update(self, s: Sweep, p: Point) -> None:
        self.sweep_obj = s
        if p.status == "running":
            self._say(f"run {s.points.index(p) + 1} of {len(s.points)}: {p.name}")
        else:
            self._show()

    def _on_step(self, p: Point, e: StepEvent) -> None:
        s = self.sweep_obj
        if s is not None and p.cfg is not None:
            self._say(f"run {s.points.index(p) + 1} of {len(s.points)}: {p.name} · step "
                      f"{e.step + 1} of {p.cfg.steps}")

    def _show(self) -> None:
        """Redraw the table and the comparison of the finished runs (best first)."""
        s = self.sweep_obj
        if s is None:
            return
        points = [p.to_json(s.out_dir) for p in s.points]
        self.table.value = sweep_table_html(points, predicted_vs_measured=s.kind == "tune",
                                            rank=s.rank, config=s.base.to_dict())
        try:
            recs = s.records()
        except FileNotFoundError:  # a run directory removed under us: the table still stands
            recs = []
        if recs:
            self._set_figures([figure_widget(f) for f in (
                figures.compare_bars(recs), figures.compare_timelines(recs, last_steps=1))])

    def _set_figures(self, new: list) -> None:
        """Show ``new`` in place of the figures shown so far, and close those: each plotly
        FigureWidget carries its own copy of plotly.js (~5 MB), which a widget left open keeps
        sending to the browser and saving in the notebook after it is no longer shown."""
        old, self.figures.children = self.figures.children, new
        for w in old:
            w.close()

    def _set_running(self, running: bool) -> None:
        for ctl in (*self.selectors.values(), self.budget, self.top):
            ctl.disabled = running
        self.sweep_button.disabled = self.tune_button.disabled = running
        self.stop_button.disabled = not running

    def _folder(self, kind: str) -> Path:
        return new_folder(self.out_dir, kind)

    def _say(self, text: str) -> None:
        self.message.value = f"<span>{html.escape(text)}</span>"


def _problems(problems: list[str]) -> str:
    return "".join(f"<div style='color:#b00020'>error: {html.escape(p)}</div>" for p in problems)
