"""Knob panel: one control per ``RunConfig`` field, Run / Stop / Export buttons (the report, the
model), a live view.

Controls are built from the config's field metadata (``knob_info``): the label is the field
name (the same name as ``--set`` and the report), the tooltip is its help, range and unit.
The panel never checks values itself: ``config()`` builds a ``RunConfig``, whose validator
reports every problem, and the panel shows them inline. A run goes through the same
``TrainRecipe`` as the CLI, on a daemon thread; during it only live knobs (lr, weight_decay)
stay enabled, and changing one calls ``recipe.set_live``.
"""
from __future__ import annotations

import html
import logging
import threading
import time
from dataclasses import fields
from functools import partial
from pathlib import Path
from typing import Any, Callable

import ipywidgets as widgets

from workbench.config import (PEFT_METHODS, STREAMING_METHODS, ConfigError, RunConfig,
                              check_environment, knob_info, range_text)
from workbench.recipes.train import TrainRecipe
from workbench.ui.dashboard import Dashboard
from workbench.ui.forecast import load_planner, prediction_html

log = logging.getLogger(__name__)

#: Groups shown for every method; others depend on the method (see ``groups_for``). The
#: "distributed" knobs only matter under torchrun, which the panel does not start.
COMMON_GROUPS = ("run", "optim", "task", "telemetry", "checkpoint", "planner")
SLIDER_MAX_SPAN = 64  # int ranges up to this wide get a slider; wider ones a text box
#: Wide enough for the longest knob name (gpu_resident_ratio) at JupyterLab's widget font.
LABEL_STYLE = {"description_width": "136px"}
#: The knob column's width: beside it, the dashboard takes the rest of the row (and wraps
#: below it when the row is narrower than ``KNOBS_WIDTH`` + ``VIEW_MIN_WIDTH``). Controls fill
#: the column, so no input is cut at its edge.
KNOBS_WIDTH, VIEW_MIN_WIDTH = "370px", "560px"


def groups_for(method: str) -> list[str]:
    """Config groups that matter for ``method`` (offload knobs only for streaming methods)."""
    groups = ["run", "optim"]
    if method in STREAMING_METHODS:
        groups.append("offload")
    if method.startswith("fo"):
        groups.append("fo")
    if method in PEFT_METHODS:
        groups.append("peft")
    return groups + [g for g in COMMON_GROUPS if g not in groups]


def make_control(name: str, value: Any) -> widgets.ValueWidget:
    """The control for config field ``name``, showing ``value``.

    Literal choices get a dropdown, bools a checkbox, narrow int ranges a slider. Other numbers
    get plain text boxes: a bounded widget would clamp a typo (lr=-1 becomes 0) silently, where
    the config's validator says what is allowed.
    """
    info = knob_info(name)
    t, lo, hi = info["type"], info.get("lo"), info.get("hi")
    rng = f" {range_text(info)}" if lo is not None and hi is not None else ""
    unit = f" {info['unit']}" if info.get("unit") else ""
    live = " (live: changeable during a run)" if info.get("live") else ""
    common = dict(description=name, tooltip=f"{info['help']}{rng}{unit}{live}",
                  style=LABEL_STYLE, layout=widgets.Layout(width="auto"))  # the column, less margins
    if info["choices"]:
        return widgets.Dropdown(options=list(info["choices"]), value=value, **common)
    if t in ("bool", bool):
        return widgets.Checkbox(value=value, indent=True, **common)
    if t in ("int", int):
        if lo is not None and hi is not None and hi - lo <= SLIDER_MAX_SPAN:
            return widgets.IntSlider(value=value, min=lo, max=hi, continuous_update=False,
                                     **common)
        return widgets.IntText(value=value, **common)
    if t in ("float", float):
        return widgets.FloatText(value=value, **common)
    if name in ("model", "data"):  # free text, with the built-in names offered
        from workbench.models.tiny import supported_types
        from workbench.presets import PRESETS, TINY_PREFIX

        options = ([*PRESETS, *(TINY_PREFIX + t for t in supported_types())]
                   if name == "model" else ["embedded", "sst2", "synthetic"])
        return widgets.Combobox(value=value, options=options, ensure_option=False, **common)
    return widgets.Text(value=str(value), **common)  # update_stride: "auto" or a whole number


class KnobPanel:
    """Args:
        method: the method selected at first.
        out_dir: each run writes ``out_dir/<time>-<method>/``.
        refresh_s: dashboard refresh interval during a run (s).
        **defaults: starting values of other config fields.

    Raises:
        ConfigError: ``defaults`` name unknown fields or give invalid values.

    Attributes:
        widget: the container to display. controls: field name -> control.
        recipe / thread / dashboard: those of the current or last run (None before the first).
        last_run_dir: the directory of the last finished run.
    """

    def __init__(self, method: str = "mezo", out_dir: str | Path = "runs/panel",
                 refresh_s: float = 0.5, **defaults: Any):
        known = {f.name for f in fields(RunConfig)}
        unknown = sorted(set(defaults) - known)
        if unknown:
            raise ConfigError([f"{k}: unknown setting (known: {', '.join(sorted(known))})"
                               for k in unknown])
        start = RunConfig(method=method, **defaults)  # invalid defaults fail here, listed
        self.out_dir, self.refresh_s = Path(out_dir), refresh_s
        self.recipe: TrainRecipe | None = None
        self.thread: threading.Thread | None = None
        self.dashboard: Dashboard | None = None
        self.last_run_dir: Path | None = None
        self.error: BaseException | None = None
        self.planner = load_planner()

        self.controls: dict[str, widgets.ValueWidget] = {
            f.name: make_control(f.name, getattr(start, f.name)) for f in fields(RunConfig)}
        self._sections: dict[str, widgets.VBox] = {}
        for f in fields(RunConfig):
            group = knob_info(f.name)["group"]
            if group not in self._sections:
                self._sections[group] = widgets.VBox(layout=widgets.Layout(width="100%"))
                self._sections[group].add_class(f"wb-group-{group}")  # the page, for a browser
            box = self._sections[group]
            box.children = (*box.children, self.controls[f.name])
        for name, ctl in self.controls.items():
            ctl.observe(self._on_change(name), names="value")

        self.run_button = widgets.Button(description="Run", button_style="success", icon="play")
        self.stop_button = widgets.Button(description="Stop", button_style="danger", icon="stop",
                                          disabled=True)
        self.export_button = widgets.Button(description="Export report", icon="file",
                                            disabled=True)
        self.model_button = widgets.Button(description="Export model", icon="download",
                                           disabled=True, tooltip="RUN_DIR/model: a Hugging "
                                           "Face folder, as python -m workbench export")
        self.run_button.on_click(lambda _: self.run())
        self.stop_button.on_click(lambda _: self.stop())
        self.export_button.on_click(lambda _: self._export_clicked())
        self.model_button.on_click(lambda _: self.export_model(background=True))
        self.problems = widgets.HTML()
        self.prediction = widgets.HTML()
        self.message = widgets.HTML()
        self.view = widgets.Box(layout=widgets.Layout(flex=f"1 1 {VIEW_MIN_WIDTH}",
                                                      min_width=VIEW_MIN_WIDTH))
        # One page of knobs per group, so the panel stays as short as its longest group and
        # the dashboard fits beside it in one window. The group buttons take the width of
        # their names and wrap onto a second row (a tab bar would cut the names to fit one).
        self.group_picker = widgets.ToggleButtons(
            style={"button_width": "auto"}, layout=widgets.Layout(width="100%"),
            tooltips=[])
        self.sections = widgets.Stack(layout=widgets.Layout(width="100%"))
        widgets.link((self.group_picker, "index"), (self.sections, "selected_index"))
        self.knobs = widgets.VBox([self.group_picker, self.sections],
                                  layout=widgets.Layout(width="100%"))
        self.knobs.add_class("wb-knobs")
        self._show_groups(method)
        buttons = (self.run_button, self.stop_button, self.export_button, self.model_button)
        for b in buttons:  # each as wide as its name; the row wraps rather than cut one
            b.layout = widgets.Layout(width="auto", flex="0 0 auto")
        column = widgets.VBox([
            self.knobs, widgets.HBox(list(buttons), layout=widgets.Layout(flex_flow="row wrap")),
            self.problems, self.prediction, self.message],
            layout=widgets.Layout(width=KNOBS_WIDTH, flex=f"0 0 {KNOBS_WIDTH}"))
        self.widget = widgets.HBox([column, self.view], layout=widgets.Layout(
            width="100%", flex_flow="row wrap", align_items="flex-start", grid_gap="12px"))
        self._update_prediction()

    # --- settings ---------------------------------------------------------------------------
    def config(self) -> RunConfig:
        """The run the controls describe.

        Raises:
            ConfigError: every invalid setting, as the CLI would report it.
        """
        shown = set(groups_for(self.controls["method"].value))
        return RunConfig(**{name: ctl.value if knob_info(name)["group"] in shown  # hidden knobs
                            else knob_info(name)["default"]  # do not apply: their defaults
                            for name, ctl in self.controls.items()})

    @property
    def groups(self) -> list[str]:
        """The knob groups shown for the selected method, in order."""
        return list(self.group_picker.options)

    def show_group(self, group: str) -> None:
        """Bring ``group``'s knobs forward (what clicking its button does)."""
        self.group_picker.value = group

    def _show_groups(self, method: str) -> None:
        groups = [g for g in groups_for(method) if g in self._sections]
        selected = self.group_picker.value or groups[0]
        self.sections.children = [self._sections[g] for g in groups]
        self.group_picker.options = groups  # resets the selection: set again below
        self.group_picker.value = selected if selected in groups else groups[0]
        self.sections.selected_index = self.group_picker.index

    def _on_change(self, name: str) -> Callable[[dict], None]:
        def handler(change: dict) -> None:
            if name == "method":
                self._show_groups(change["new"])
            if self.running and knob_info(name).get("live"):
                self._set_live(name, change["new"])
            elif not self.running:
                self._update_prediction()
        return handler

    def _update_prediction(self) -> None:
        """Re-check the settings as knobs move; show problems and the planner's forecast."""
        try:
            cfg = self.config()
        except ConfigError as e:
            self._show_problems(e.problems)
            self.prediction.value = ""
            return
        self._show_problems([])
        self.prediction.value = prediction_html(self.planner, cfg)

    def _show_problems(self, problems: list[str]) -> None:
        self.problems.value = "".join(
            f"<div style='color:#b00020'>error: {html.escape(p)}</div>" for p in problems)

    def _say(self, text: str) -> None:
        self.message.value = f"<span>{html.escape(text)}</span>"

    # --- running ----------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def run(self, force: bool = False) -> threading.Thread | None:
        """Start a run of ``config()`` on a daemon thread; None (and the problems shown) when the
        settings are invalid, the planner says the run cannot fit (``force`` starts it anyway)
        or a run is already going."""
        if self.running:
            self._say("a run is already going: Stop it first")
            return None
        try:
            cfg = self.config()
            check_environment(cfg)
            recipe = TrainRecipe(cfg, self._new_run_dir(cfg.method), progress=False, force=force)
            recipe.prepare()  # the checks that need no model, the fit included
        except ConfigError as e:
            self._show_problems(e.problems)
            return None
        self._show_problems([])
        self.error = None
        run_dir = recipe.out_dir
        self.recipe = recipe
        old = self.dashboard  # the next run keeps the loss panel's x axis (display state)
        self.dashboard = Dashboard(recipe.record, min_interval_s=min(self.refresh_s, 0.5),
                                   x=old.x_axis.value if old is not None else "steps")
        self.view.children = [self.dashboard.widget]
        self._set_running(True)
        self._say(f"running {cfg.method} on {cfg.model} ({cfg.steps} steps) -> {run_dir}")
        self.thread = threading.Thread(target=self._work, args=(recipe, self.dashboard),
                                       name="workbench-run", daemon=True)
        self.thread.start()
        self.dashboard.start_auto_refresh(self.refresh_s)
        return self.thread

    def _work(self, recipe: TrainRecipe, dashboard: Dashboard) -> None:
        text = ""
        try:
            recipe.setup()
            recipe.train()
            recipe.save()
            self.last_run_dir = recipe.out_dir
            text = recipe.outcome()  # e.g. "diverged at step N (loss = nan); ..."
        except BaseException as e:  # shown in the panel: a notebook thread has no traceback
            recipe.fail(e)
            self.error = e
            log.exception("run failed")
            text = f"failed: {recipe.record.error or type(e).__name__}"
        finally:
            recipe.cleanup()
            dashboard.stop_auto_refresh()
            try:
                dashboard.refresh(force=True)  # the final state, whatever the timer last drew
            except Exception:
                log.exception("final dashboard refresh failed")
            self._set_running(False)
            self._say(text)

    def stop(self) -> None:
        """Ask the running loop to stop; it finishes the current step, evaluates and saves."""
        if self.recipe is not None and self.running:
            self.recipe.stop_event.set()
            self._say("stopping after the current step")

    def _set_running(self, running: bool) -> None:
        for name, ctl in self.controls.items():
            if not knob_info(name).get("live"):
                ctl.disabled = running
        self.run_button.disabled = running
        self.stop_button.disabled = not running
        self.export_button.disabled = running or self.last_run_dir is None
        self.model_button.disabled = running or self.last_run_dir is None

    def _set_live(self, name: str, value: Any) -> None:
        recipe = self.recipe
        try:
            recipe.cfg.replace(**{name: value})  # the config's range check, nothing else
        except ConfigError as e:
            self._show_problems(e.problems)
            return
        self._show_problems([])
        recipe.set_live(**{name: float(value)})
        self._say(f"{name} = {value:g} from the next step")

    def _new_run_dir(self, method: str) -> Path:
        return new_folder(self.out_dir, method)

    # --- report -----------------------------------------------------------------------------
    def export_report(self, path: str | Path | None = None) -> Path:
        """Write the HTML report of the last finished run (default: ``RUN_DIR/report.html``).

        Raises:
            RuntimeError: no run has finished yet.
        """
        from workbench.ui.report import write_report

        if self.last_run_dir is None:
            raise RuntimeError("no finished run to report yet: press Run first")
        out = write_report([self.last_run_dir], path or self.last_run_dir / "report.html")
        self._say(f"report written to {out}")
        return out

    def export_model(self, background: bool = False) -> None:
        """Export the last finished run's weights to ``RUN_DIR/model`` as ``python -m
        workbench export`` does (on a thread with ``background``); the message line says how
        it went."""
        from workbench.export.exporter import export_line

        if self.last_run_dir is None:
            raise RuntimeError("no finished run to export yet: press Run first")
        self._say(f"exporting {self.last_run_dir} ...")
        work = partial(lambda run: self._say(export_line(run, run / "model")), self.last_run_dir)
        threading.Thread(target=work, daemon=True).start() if background else work()

    def _export_clicked(self) -> None:
        try:
            self.export_report()
        except Exception as e:
            self._say(f"report failed: {type(e).__name__}: {e}")


def new_folder(parent: Path, kind: str) -> Path:
    """``parent/<time>-<kind>``, numbered if that exists: a press never reuses a folder."""
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{kind}"
    path, n = parent / stem, 1
    while path.exists():
        n += 1
        path = parent / f"{stem}-{n}"
    return path
