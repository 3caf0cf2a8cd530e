"""The loss and dev metric against steps, training time and forward passes: the x values of
the traces under each axis, one x meaning across the runs of a comparison, and the live
dashboard's x-axis dropdown."""
from __future__ import annotations

import numpy as np
import pytest

from workbench.telemetry.record import RunRecord
from workbench.ui import figures as F
from workbench.ui.dashboard import Dashboard
from workbench.ui.learning import X_AXES, cost_x, dev_by_cost, loss_panel
from workbench.ui.report import comparison_figures, write_report


def _record(config: dict, step_s: float, evals_at=(0, 2, 4), n=4, start=0.5) -> RunRecord:
    """``n`` steps of ``step_s`` s each; evals after ``evals_at`` steps (2 s each, in ``end``
    only), accuracy ``start`` rising 0.05 an eval."""
    steps, end = [], 0.0
    for t in range(n):
        end += step_s + (2.0 if t + 1 in evals_at else 0.0)
        steps.append({"step": t, "loss": 1.0 - 0.1 * t, "seconds": step_s, "tokens": 64,
                      "end": end})
    evals = [{"step": k, "accuracy": start + 0.05 * i, "loss": 0.7, "examples": 8}
             for i, k in enumerate(evals_at)]
    return RunRecord(config={"model": "tiny-opt", **config}, steps=steps, evals=evals,
                     status="done")


Q1 = _record({"method": "mezo", "queries": 1}, 0.5, start=0.6)  # 2 forward passes a step
Q4 = _record({"method": "mezo", "queries": 4}, 2.0)  # 8 a step, 4x the time


def _trace(fig, name: str, axis: str | None = None):
    return next(t for t in fig.data if t.name == name and (axis is None or t.xaxis == axis))


@pytest.mark.parametrize("x, loss_x, dev_x", [
    ("steps", [0, 1, 2, 3], [0, 2, 4]),
    ("wall-clock (s)", [0, 2, 4, 6], [0, 4, 8]),  # the evals' 2 s are not training time
    ("forward passes", [0, 8, 16, 24], [0, 16, 32]),
])
def test_the_loss_panel_on_each_x_axis(x, loss_x, dev_x):
    fig = F.progress(Q4, smoothing=0.0, x=x)
    # the loss of step t and an eval after t steps sit at the cost of the t steps before them
    np.testing.assert_allclose(_trace(fig, "loss").x, loss_x)
    np.testing.assert_allclose(_trace(fig, "dev accuracy").x, dev_x)
    np.testing.assert_allclose(_trace(fig, "dev accuracy").y, [50, 55, 60])
    title = fig.layout.xaxis2.title.text
    assert title == {"steps": "step", "wall-clock (s)": "training time (s)",
                     "forward passes": "forward passes (8/step)"}[x]
    assert [c[0] for c in _trace(fig, "dev accuracy").customdata] == [0, 2, 4]  # hover: steps


def test_an_unknown_x_axis_says_which_ones_exist():
    with pytest.raises(ValueError, match="'steps', 'wall-clock \\(s\\)', 'forward passes'"):
        loss_panel(Q1, x="tokens")
    with pytest.raises(ValueError):
        Dashboard(Q1, x="tokens")


def test_dev_by_cost_puts_every_run_on_the_same_three_axes():
    fig = dev_by_cost([Q1, Q4])
    titles = [a.text for a in fig.layout.annotations[:3]]
    assert titles == ["dev accuracy by steps", "dev accuracy by training time",
                      "dev accuracy by forward passes"]
    want = {"x": ([0, 2, 4], [0, 2, 4]), "x2": ([0, 1, 2], [0, 4, 8]),
            "x3": ([0, 4, 8], [0, 16, 32])}
    for axis, (q1, q4) in want.items():
        a, b = [t for t in fig.data if t.xaxis == axis]
        np.testing.assert_allclose(a.x, q1)
        np.testing.assert_allclose(b.x, q4)
        assert (a.line.color, b.line.color) == (F.RUN_COLOURS[0], F.RUN_COLOURS[1])
    # the runs' passes per step differ: each legend entry gives its own, once (first panel)
    names = [t.name for t in fig.data if t.showlegend is not False]
    assert names == ["mezo queries=1 (2 forward passes per step)",
                     "mezo queries=4 (8 forward passes per step)"]
    assert fig.layout.xaxis3.title.text == "forward passes"  # each run's: in the legend
    assert fig.layout.yaxis2.matches == "y" and fig.layout.yaxis3.matches == "y"


def test_dev_by_cost_of_runs_alike_in_cost_and_first_order_runs():
    fo = _record({"method": "fo"}, 0.5)
    fig = dev_by_cost([fo, _record({"method": "forward-grad"}, 0.5, start=0.4)])
    assert all("per step" not in t.name for t in fig.data)  # 1 each: nothing to point out
    assert fig.layout.xaxis3.title.text == "forward passes (1/step, + backward)"
    assert dev_by_cost([fo, Q4]).layout.xaxis3.title.text == "forward passes (fo: + backward)"
    # equal evals step for step: the later run is dashed, so it does not hide the first
    twin = dev_by_cost([Q1, _record({"method": "mezo", "queries": 2}, 0.5, start=0.6)])
    a, b = [t for t in twin.data if t.xaxis == "x"]
    assert a.line.dash is None and b.line.dash == "dash"
    assert b.name == "mezo queries=2 (4 forward passes per step) (overlaps mezo queries=1)"


def test_dev_by_cost_without_evals_says_so():
    fig = dev_by_cost([RunRecord(config={"method": "mezo"}, status="done")])
    assert not fig.data
    assert sum(a.text == "no dev accuracy<br>(no evals recorded)"
               for a in fig.layout.annotations) == 3


def test_the_report_and_compare_draw_the_dev_metric_by_cost(tmp_path):
    assert any("dev accuracy by forward passes" in [a.text for a in f.layout.annotations]
               for f in comparison_figures([Q1, Q4]))
    assert not any(f.layout.annotations and "dev accuracy by steps" in
                   [a.text for a in f.layout.annotations]
                   for f in comparison_figures([RunRecord(config={"method": "mezo"})] * 2))
    two = write_report([Q1, Q4], tmp_path / "two.html").read_text(encoding="utf-8")
    one = write_report([Q4], tmp_path / "one.html").read_text(encoding="utf-8")
    for page in (two, one):  # in the comparison, or in the one run's section
        assert page.count("dev accuracy by training time") == 1
        assert "training time (s)" in page and "count the training steps only" in page


def test_the_dashboard_dropdown_redraws_the_loss_panel_on_its_axis():
    d = Dashboard(Q4, min_interval_s=0.0)
    assert d.x_axis.options == tuple(X_AXES) and d.x_axis.value == "steps"
    dev = _trace(d.figure, "dev accuracy")
    np.testing.assert_allclose(dev.x, [0, 2, 4])
    axis = "xaxis" + dev.xaxis[1:]
    d.figure.layout[axis].range = [0, 3]  # a zoom in steps
    d.figure.layout[axis].autorange = False
    d.x_axis.value = "forward passes"
    np.testing.assert_allclose(_trace(d.figure, "dev accuracy").x, [0, 16, 32])
    np.testing.assert_allclose(_trace(d.figure, "loss (EMA)").x, [0, 8, 16, 24])
    assert d.figure.layout[axis].title.text == "forward passes (8/step)"
    assert d.figure.layout[axis].autorange is True  # the steps' zoom is let go
    d.x_axis.value = "wall-clock (s)"
    np.testing.assert_allclose(_trace(d.figure, "dev accuracy").x, [0, 4, 8])
    # the other panels keep their own axes
    tput = _trace(d.figure, "tokens/s")
    np.testing.assert_allclose(tput.x, [0, 1, 2, 3])


def test_cost_x_of_steps_beyond_the_record_is_unknown():
    x = cost_x(Q1, np.array([0.0, 4.0, 9.0, np.nan]), "wall-clock (s)")
    np.testing.assert_allclose(x, [0.0, 2.0, np.nan, np.nan])


def test_a_run_without_its_method_says_its_forward_passes_are_unknown():
    rec = _record({}, 0.5)  # a run.json whose config was lost: no method
    assert F.progress(rec, x="steps").data  # steps and seconds are still known
    np.testing.assert_allclose(_trace(F.progress(rec, x="wall-clock (s)"), "dev accuracy").x,
                               [0, 1, 2])
    fig = F.progress(rec, x="forward passes")
    assert not [t for t in fig.data if t.xaxis == "x2"]
    assert "no forward passes<br>(the steps' times or the method unknown)" in [
        a.text for a in fig.layout.annotations]


def _seed(seed: int, accuracies, step_s: float = 0.5, **config) -> RunRecord:
    rec = _record({"method": "mezo", "queries": 1, "lr": 1e-5, **config, "seed": seed}, step_s)
    for e, a in zip(rec.evals, accuracies):
        e["accuracy"] = a
    return rec


def test_dev_by_cost_draws_seeds_of_one_configuration_as_a_band():
    """Three seeds of one lr: one colour, their mean and a +- std band on every axis (x the
    seeds' mean: their seconds differ); another lr stays a run of its own."""
    seeds = [_seed(0, [0.5, 0.6, 0.7]), _seed(1, [0.5, 0.7, 0.8], step_s=1.0),
             _seed(2, [0.5, 0.8, 0.9])]
    other = _seed(0, [0.5, 0.55, 0.6], lr=2e-5)
    fig = dev_by_cost([*seeds, other])
    name = "mezo lr=1e-5 (3 seeds: mean ± std)"
    names = [t.name for t in fig.data if t.showlegend is not False]
    assert names == [name, "mezo lr=2e-5"]
    mean = _trace(fig, name, "x")
    np.testing.assert_allclose(mean.y, [50, 70, 80])  # %
    np.testing.assert_allclose(mean.x, [0, 2, 4])
    band = _trace(fig, "mezo lr=1e-5 band", "x")
    np.testing.assert_allclose(band.x, [0, 2, 4, 4, 2, 0])
    np.testing.assert_allclose(band.y, [50, 80, 90, 70, 60, 50])  # mean +- sample std (10)
    assert band.fill == "toself" and band.line.color == mean.line.color == F.RUN_COLOURS[0]
    # seconds: the seeds' mean (steps of 0.5, 1.0, 0.5 s: 2 steps take 1.33 s on average)
    np.testing.assert_allclose(_trace(fig, name, "x2").x, [0, 4 / 3, 8 / 3])
    np.testing.assert_allclose(_trace(fig, name, "x3").x, [0, 4, 8])  # 2 passes a step
    assert _trace(fig, "mezo lr=2e-5", "x").line.color == F.RUN_COLOURS[1]
    # without several seeds of one configuration, runs are drawn one by one as before
    assert not [t for t in dev_by_cost([seeds[0], other]).data if "band" in (t.name or "")]


def test_a_band_is_drawn_at_the_evals_every_seed_took():
    short = _record({"method": "mezo", "seed": 1}, 0.5, evals_at=(0, 2))  # stopped early
    fig = dev_by_cost([_record({"method": "mezo", "seed": 0}, 0.5), short])
    mean = _trace(fig, "mezo tiny-opt (2 seeds: mean ± std)", "x3")
    np.testing.assert_allclose(mean.x, [0, 4])
