"""The sweep widget driven from Python (no browser): selections, Sweep, the live comparison,
Stop, Tune; and the live dashboard's smoothing slider."""
from __future__ import annotations

import re
import time

import ipywidgets as widgets
import numpy as np
import plotly.graph_objects as go
import pytest

from workbench.config import RunConfig
from workbench.telemetry.record import RunRecord
from workbench.ui.dashboard import Dashboard
from workbench.ui.figures import dashboard_figure
from workbench.ui.panel import KnobPanel
from workbench.ui.sweep import SweepPanel

TINY = dict(method="zo-offload", model="tiny-opt", batch_size=4, seq_len=32, eval_samples=8,
            sample_hz=0.0)


pytestmark = pytest.mark.usefixtures("one_thread")


def _wait(cond, timeout: float = 60.0, what: str = "condition") -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_selectors_preview_the_grid_and_refuse_bad_ones(tmp_path):
    sp = SweepPanel(RunConfig(**TINY, steps=2), out_dir=tmp_path)
    assert set(sp.selectors) == {"overlap", "prefetch_depth", "resident_blocks", "codec"}
    assert isinstance(sp.selectors["overlap"], widgets.SelectMultiple)
    assert all(isinstance(c, widgets.SelectMultiple) for c in sp.selectors.values())
    assert list(sp.selectors["resident_blocks"].options) == [0, 1, 2, 3, 4]  # tiny-opt's blocks
    assert sp.selectors["prefetch_depth"].value == (1,)  # the base value, selected
    assert "1 point(s): 1 to run" in sp.grid_info.value
    sp.selectors["overlap"].value = (True, False)
    sp.selectors["prefetch_depth"].value = (1, 2, 3)
    assert sp.axes() == {"overlap": [True, False], "prefetch_depth": [1, 2, 3],
                         "resident_blocks": [0], "codec": ["fp32"]}
    assert "6 point(s): 6 to run" in sp.grid_info.value
    sp.selectors["codec"].value = ()
    assert "codec: select at least one value" in sp.grid_info.value
    assert sp.sweep() is None and sp.thread is None and not any(tmp_path.iterdir())


def test_sweep_fills_the_comparison_and_stop_skips_the_rest(tmp_path):
    panel = KnobPanel(out_dir=tmp_path / "panel", **TINY, steps=400)
    sp = SweepPanel(panel, out_dir=tmp_path)  # the knob panel's settings are the base
    sp.selectors["overlap"].value = (True, False)
    sp.selectors["codec"].value = ("fp32", "bf16")
    thread = sp.sweep()
    assert thread is not None and thread.daemon and sp.running
    assert sp.sweep_button.disabled and not sp.stop_button.disabled
    assert sp.selectors["overlap"].disabled
    assert sp.sweep() is None and "already going" in sp.message.value
    s = sp.sweep_obj
    _wait(lambda: s.points[0].status == "running" and "step 2 of 400" in sp.message.value,
          what="the first run's second step")
    sp.stop()
    thread.join(timeout=60)
    assert not thread.is_alive() and sp.error is None
    assert [p.status for p in s.points] == ["stopped", "skipped", "skipped", "skipped"]
    assert "stopped: 1 of 4 point(s) finished" in sp.message.value
    assert "<table class=sweep>" in sp.table.value and sp.table.value.count("skipped") == 3
    bars, timelines = sp.figures.children
    assert isinstance(bars, go.FigureWidget) and list(bars.data[0].y) == [s.points[0].name]
    assert RunRecord.load(s.points[0].dir).status == "stopped"
    assert not sp.sweep_button.disabled and sp.stop_button.disabled
    assert sp.last_dir == s.out_dir and (s.out_dir / "sweep.json").is_file()


def test_a_full_sweep_ranks_every_run(tmp_path):
    from ipywidgets.widgets.widget import _instances

    def open_figures() -> set:
        return {k for k, w in list(_instances.items()) if isinstance(w, go.FigureWidget)}

    before = open_figures()
    sp = SweepPanel(RunConfig(**TINY, steps=2), out_dir=tmp_path)
    sp.selectors["overlap"].value = (True, False)
    sp.sweep().join(timeout=120)
    s = sp.sweep_obj
    assert [p.status for p in s.points] == ["done", "done"] and sp.error is None
    ranked = [p.name for p in s.finished()]
    assert list(sp.figures.children[0].data[0].y) == ranked  # fastest first
    # the figures redrawn after each run replaced the earlier ones, which were closed: only
    # the two shown are open (each carries plotly.js, sent to the browser and saved)
    assert open_figures() - before == {w.model_id for w in sp.figures.children}
    rows = re.findall(r"<tr><td>(\d)</td><td>(true|false)</td>", sp.table.value)
    assert [f"overlap={o}" for _, o in rows] == ranked


def test_tune_button_on_a_cpu_says_why_it_cannot(tmp_path):
    sp = SweepPanel(RunConfig(**TINY, steps=30), out_dir=tmp_path, trial_steps=2)
    assert sp.tune() is None and sp.thread is None and not any(tmp_path.iterdir())
    assert sp.grid_info.value.count("tune: needs a CUDA GPU") == 1


@pytest.mark.gpu
def test_tune_button_writes_the_fastest_setting(tmp_path):
    sp = SweepPanel(RunConfig(**TINY, device="cuda", steps=30), out_dir=tmp_path, trial_steps=2)
    sp.top.value = 1
    sp.tune().join(timeout=120)
    r = sp.tune_result
    assert sp.error is None and r.toml is not None and r.toml.is_file()
    assert f"fastest: {r.best.name}" in sp.message.value
    assert "measured / predicted" in sp.table.value
    assert r.config.steps == 30 and r.sweep.points[0].cfg.steps == 2


def test_dashboard_smoothing_slider_redraws_the_loss():
    rec = RunRecord(config={"method": "mezo", "model": "tiny-opt", "steps": 5}, status="done",
                    steps=[{"step": s, "loss": float(s % 2), "seconds": 0.1, "tokens": 10,
                            "end": s * 0.1} for s in range(5)])
    d = Dashboard(rec, min_interval_s=0.0)
    ema = next(t for t in d.figure.data if t.name == "loss (EMA)")
    assert list(ema.y) != [0.0, 1.0, 0.0, 1.0, 0.0]
    d.smoothing.value = 0.0  # raw only
    names = [t.name for t in d.figure.data]
    assert "loss (EMA)" not in names
    assert list(next(t for t in d.figure.data if t.name == "loss").y) == [0.0, 1.0, 0.0, 1.0, 0.0]
    assert not d.figure.layout.sliders  # the live view's slider is the widget's


def test_live_view_reads_new_samples_only_and_draws_what_the_report_draws():
    rec = RunRecord(config={"method": "zo-offload", "model": "tiny-opt", "steps": 50,
                            "device": "cpu"}, status="running")
    d = Dashboard(rec, min_interval_s=0.0)
    for k in range(3):  # the run grows between refreshes, as live
        with rec.lock:
            for i in range(40):
                t = 0.1 * (40 * k + i)
                rec.samples.append({"t (s)": t, "host cpu (%)": float(i % 7),
                                    "host ram used (bytes)": 1e9 + t * 1e6,
                                    "process rss (bytes)": 5e8})
            rec.steps.append({"step": k, "loss": 1.0 / (k + 1), "seconds": 0.4, "tokens": 64,
                              "end": 4.0 * (k + 1)})
        d._last = float("-inf")  # past the throttle: this test is about what is drawn
        assert d.refresh()
        assert d._columns_n == len(rec.samples)
    want = dashboard_figure(rec.snapshot(), live=True)
    got = {t.name: t for t in d.figure.data}
    for t in want.data:
        np.testing.assert_allclose(np.asarray(got[t.name].y, float), np.asarray(t.y, float))
        np.testing.assert_allclose(np.asarray(got[t.name].x, float), np.asarray(t.x, float))
    assert len(got["host CPU"].y) == 120
