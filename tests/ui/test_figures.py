"""Figure builders: numbers in the traces, not just "it drew something"."""
from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest

from workbench.config import RunConfig
from workbench.engine.events import EMBED, HEAD, OpEvent
from workbench.recipes.train import run
from workbench.telemetry.record import RunRecord
from workbench.ui.layout import TITLE
from workbench.ui import figures as F
from workbench.ui.dashboard import _status_html

TINY = dict(model="tiny-opt", steps=3, batch_size=4, seq_len=32, eval_samples=8)


@pytest.fixture(scope="module")
def offload_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ui-fig") / "zo-offload"
    rec = run(RunConfig(method="zo-offload", **TINY), out_dir=out, progress=False)
    return rec, out


def synthetic(steps: int = 5, blocks: int = 2, samples: int = 50) -> RunRecord:
    """A record with known events: per step, upload/compute/offload per block, one update, and
    a codec pass on its own stream in the last step."""
    events, rows, t = [], [], 0.0
    for s in range(steps):
        for b in [EMBED, *range(blocks), HEAD]:
            events.append(OpEvent("upload", "upload", s, b, 2_000_000, t, t + 0.001))
            events.append(OpEvent("compute", "compute", s, b, 0, t + 0.001, t + 0.004, "+"))
            events.append(OpEvent("offload", "offload", s, b, 2_000_000, t + 0.004, t + 0.005))
            t += 0.005
        events.append(OpEvent("update", "update", s, -1, 0, t, t + 0.002))
        t += 0.002
        if s == steps - 1:
            events.append(OpEvent("codec", "zcodec", s, 0, 1_000_000, t, t + 0.001))
        rows.append({"step": s, "loss": 1.0 - 0.1 * s, "seconds": 0.5, "tokens": 100 * (s + 1),
                     "end": t, "mem_allocated": (s + 1) * 10**9, "mem_reserved": 2 * 10**9,
                     "mem_peak": 3 * 10**9, "lr": 1e-3})
    smp = [{"t (s)": i * 0.01, "gpu mem used (bytes)": 4e9 + (i % 10) * 1e6,
            "pcie rx (bytes/s)": 8e9, "pcie tx (bytes/s)": 4e9, "gpu util (%)": 50.0 + (i % 2),
            "host cpu (%)": 25.0, "host ram used (bytes)": 12e9, "process rss (bytes)": 3e9}
           for i in range(samples)]
    return RunRecord(config={"method": "zo-offload", "model": "tiny-opt", "steps": steps},
                     environment={"pcie peak (bytes/s)": 31.5e9}, steps=rows,
                     evals=[{"step": 0, "accuracy": 0.5, "loss": 0.7, "examples": 8},
                            {"step": steps, "accuracy": 0.75, "loss": 0.6, "examples": 8}],
                     events=events, samples=smp, status="done")


def _bars(fig):
    return [t for t in fig.data if t.type == "bar"]


def _notes(fig) -> list[str]:
    return [a.text for a in fig.layout.annotations if a.text.startswith("no ")]


# --- timeline ---------------------------------------------------------------------------------
def test_timeline_one_bar_per_event_of_last_steps():
    rec = synthetic(steps=5, blocks=2)
    fig = F.timeline(rec, last_steps=3)
    want = [e for e in rec.events if e.step >= 2]
    bars = _bars(fig)
    assert sum(len(b.x) for b in bars) == len(want)
    # one trace per op, each bar of it placed at its event's start with its duration
    for b in bars:
        evs = [e for e in want if e.op == b.name]
        assert list(b.y) == [e.stream for e in evs]
        np.testing.assert_allclose(b.base, [e.start for e in evs])
        np.testing.assert_allclose(b.x, [e.end - e.start for e in evs])
    assert list(fig.layout.yaxis.categoryarray) == ["upload", "compute", "offload", "update",
                                                    "zcodec"]
    assert fig.layout.xaxis.title.text == "time (s)"
    up = next(b for b in bars if b.name == "upload")
    assert up.customdata[0][0] == "embed" and up.customdata[-1][0] == "head"
    assert up.customdata[1][0] == "block 0"
    assert up.customdata[0][1] == 2 and up.customdata[0][2] == pytest.approx(2.0)  # step, MB
    assert up.customdata[0][3] == pytest.approx(1.0)  # ms
    assert up.marker.color != next(b for b in bars if b.name == "compute").marker.color


def test_timeline_title_gets_a_band_of_its_own():
    """A titled timeline (notebook 5's update phases) is taller at the top by the title's band,
    so the title sits above the panel's own title and legend, not on them."""
    rec = synthetic(steps=2, blocks=2)
    plain, titled = F.timeline(rec), F.timeline(rec, title="update phase of step 1")
    assert titled.layout.title.text == "update phase of step 1" and not plain.layout.title.text
    assert titled.layout.margin.t - plain.layout.margin.t == TITLE
    assert titled.layout.height - plain.layout.height == TITLE


def test_timeline_real_run_rows_and_counts(offload_run):
    rec, _ = offload_run
    steps = sorted({e.step for e in rec.events})
    fig = F.timeline(rec, last_steps=2)
    want = [e for e in rec.events if e.step in steps[-2:]]
    assert sum(len(b.x) for b in _bars(fig)) == len(want) > 0
    rows = list(fig.layout.yaxis.categoryarray)
    assert rows == [s for s in ("upload", "compute", "offload", "update", "checkpoint")
                    if s in {e.stream for e in want}]
    assert {b.name for b in _bars(fig)} == {e.op for e in want}


def test_fo_offload_timeline_has_update_lanes_with_each_subgroup_once_per_step(tmp_path):
    cfg = RunConfig(method="fo-offload", update_stride="3", gpu_resident_ratio=0.25,
                    subgroup_size=20000, update_threads=1, **TINY)
    rec = run(cfg, out_dir=tmp_path / "fo", progress=False)
    n_sub = rec.info["fo_perf_inputs"]["subgroups"]
    steps = sorted({e.step for e in rec.events})
    assert len(steps) == 3
    for fig in (F.timeline(rec, last_steps=None), F.dashboard_figure(rec, last_steps=None)):
        bars = {b.name: b for b in _bars(fig)}
        axis = bars["cpu-update"].yaxis.replace("y", "yaxis")  # the timeline's, in a dashboard
        rows = list(fig.layout[axis].categoryarray)
        assert rows.index("compute") < rows.index("gpu update") < rows.index("cpu update")
        cpu, gpu = bars["cpu-update"], bars["gpu-update"]
        assert set(cpu.y) == {"cpu update"} and set(gpu.y) == {"gpu update"}
        assert set(bars["cpu-wait"].y if "cpu-wait" in bars else ["cpu update"]) == {"cpu update"}
        assert set(bars["gpu-wait"].y) == {"gpu update"}
        for step in steps:  # the number on each bar is its subgroup: each exactly once a step
            ids = [int(t) for b in (cpu, gpu) for t, c in zip(b.text, b.customdata)
                   if c[1] == step]
            assert sorted(ids) == list(range(n_sub))
        assert all(c[0] == f"subgroup {t}" for c, t in zip(cpu.customdata, cpu.text))
        assert {c[4] for c in cpu.customdata} == {"1 thread"}
        assert {c[4] for c in gpu.customdata} == {"resident", "interleaved"}
        # a subgroup's number that would shrink below a readable size in its bar is hidden
        assert fig.layout.uniformtext.mode == "hide" and fig.layout.uniformtext.minsize >= 9
    # notebook 05's tables of the schedule: readable rows, not run.json's dictionaries
    from workbench.ui.fo_tables import fo_tables_html

    page = fo_tables_html(rec)
    assert "{" not in page.replace("{text}", "") and "'per_s'" not in page
    assert "<td style='text-align:left'>schedule kept</td>" in page
    assert f"{n_sub} of 20,000 parameters" in page
    for part in ("fp32 masters up the link", "update on the CPU (AdamW)"):
        assert part in page
    assert page.count("kept</td>") >= 1 + bool(rec.info.get("fo_trial"))


def test_timeline_without_events_has_note():
    fig = F.timeline(RunRecord(), last_steps=3)
    assert not fig.data and _notes(fig) and fig.layout.xaxis.title.text == "time (s)"
    fig.to_json()


# --- one-run figures --------------------------------------------------------------------------
def test_memory_pcie_utilisation_values_in_units():
    rec = synthetic(samples=50)
    mem = F.memory(rec)
    assert mem.layout.yaxis.title.text == "GPU memory (GB)"
    assert mem.layout.xaxis.title.text == "time (s)"
    by = {t.name: t for t in mem.data}
    assert set(by) == {"allocated", "reserved", "peak", "NVML"}
    np.testing.assert_allclose(by["allocated"].y, [1, 2, 3, 4, 5])
    np.testing.assert_allclose(by["allocated"].x, [r["end"] for r in rec.steps])
    assert by["NVML"].y[0] == pytest.approx(4.0)
    # the run's own: what the process held before it (read at setup) is left out
    rec.environment.update({"torch allocated before run (bytes)": 0.5e9,
                            "gpu mem used before run (bytes)": 3e9})
    by = {t.name: t for t in F.memory(rec).data}
    np.testing.assert_allclose(by["allocated"].y, [0.5, 1.5, 2.5, 3.5, 4.5])
    np.testing.assert_allclose(by["peak"].y, [2.5] * 5)
    assert by["NVML"].y[0] == pytest.approx(1.0)

    pc = F.pcie(rec)
    assert pc.layout.yaxis.title.text == "PCIe throughput (GB/s)"
    by = {t.name: t for t in pc.data}
    np.testing.assert_allclose(by["RX host→GPU"].y, 8.0)
    np.testing.assert_allclose(by["TX GPU→host"].y, 4.0)
    peak = by["link peak"]
    assert list(peak.y) == [31.5, 31.5] and peak.line.dash == "dash"

    ut = F.utilisation(rec)
    assert ut.layout.yaxis.title.text == "utilisation (%)"
    by = {t.name: t for t in ut.data}
    assert list(by["GPU util"].y[:2]) == [50.0, 51.0]
    np.testing.assert_allclose(by["host CPU"].y, 25.0)

    hm = F.host_memory(rec)
    assert hm.layout.yaxis.title.text == "host memory (GB)"
    by = {t.name: t for t in hm.data}
    np.testing.assert_allclose(by["host RAM used"].y, 12.0)
    np.testing.assert_allclose(by["this process (RSS)"].y, 3.0)
    assert "pinned (planner)" not in by  # no device in the config: nothing planned


def test_pinned_host_memory_is_the_planners_figure_from_the_record():
    """The figure draws the plan the run recorded when it started (a pure function of the
    record): a record whose config no longer plans, or names a folder gone since, draws it."""
    from workbench.plan.planner import plan

    rec = synthetic()
    planned = plan(RunConfig(method="zo-offload", model="opt-125m", device="cuda"))
    assert planned.pinned_host_bytes > 0
    rec.config = {"method": "zo-offload", "model": "/gone/since", "device": "cuda"}
    rec.info["plan"] = planned.to_dict()
    pinned = next(t for t in F.host_memory(rec).data if t.name == "pinned (planner)")
    np.testing.assert_allclose(pinned.y, planned.pinned_host_bytes / 1e9)
    del rec.info["plan"]  # a record written before runs kept their plan: nothing drawn
    assert "pinned (planner)" not in {t.name for t in F.host_memory(rec).data}


def test_progress_loss_accuracy_and_tokens_per_s():
    rec = synthetic(steps=5)
    fig = F.progress(rec)
    by = {t.name: t for t in fig.data}
    np.testing.assert_allclose(by["loss"].y, [1.0, 0.9, 0.8, 0.7, 0.6])
    assert by["loss"].opacity < 1 and by["loss"].showlegend is False  # raw, faint, behind
    np.testing.assert_allclose(by["loss (EMA)"].y, _ema_reference([1.0, 0.9, 0.8, 0.7, 0.6],
                                                                  F.SMOOTHING))
    np.testing.assert_allclose(by["dev accuracy"].y, [50.0, 75.0])
    assert by["dev accuracy"].yaxis != by["loss"].yaxis  # its own, right-hand axis
    np.testing.assert_allclose(by["tokens/s"].y, [200, 400, 600, 800, 1000])
    titles = {ax.title.text for ax in (fig.layout.yaxis, fig.layout.yaxis2, fig.layout.yaxis3)}
    assert {"loss", "dev accuracy (%)", "throughput (tokens/s)"} <= titles
    # the right-hand axis belongs to the last column, beside the figure's right margin
    acc = fig.layout[by["dev accuracy"].yaxis.replace("y", "yaxis")]
    right = max(fig.layout[k].domain[1] for k in fig.layout.to_plotly_json()
                if k.startswith("xaxis"))
    assert acc.side == "right"
    assert fig.layout[by["loss"].xaxis.replace("x", "xaxis")].domain[1] == right


@pytest.mark.parametrize("objective, name, y, right", [
    ("completion", "dev exact match", [20.0, 60.0], True),  # a fraction: in %, right-hand axis
    ("lm", "dev loss", [5.5, 4.25], False)])  # the training loss's units: its axis
def test_loss_panel_plots_the_objectives_main_dev_metric(objective, name, y, right):
    rec = synthetic(steps=5)
    rec.config["objective"] = objective
    metrics = ({"loss": 5.5, "perplexity": 244.7, "exact_match": 0.2, "token_f1": 0.3},
               {"loss": 4.25, "perplexity": 70.1, "exact_match": 0.6, "token_f1": 0.7})
    rec.evals = [{"step": s, "accuracy": None, "loss": m["loss"], "examples": 5,
                  "metrics": {k: v for k, v in m.items()
                              if objective == "completion" or k in ("loss", "perplexity")}}
                 for s, m in zip((0, 5), metrics)]
    fig = F.progress(rec)
    by = {t.name: t for t in fig.data}
    assert "dev accuracy" not in by
    np.testing.assert_allclose(by[name].y, y)
    assert (by[name].yaxis != by["loss"].yaxis) == right
    titles = {a.text for a in fig.layout.annotations}
    assert f"loss, {name}" in titles
    if right:
        assert fig.layout[by[name].yaxis.replace("y", "yaxis")].title.text == f"{name} (%)"
    header = f"{name} {y[-1]:.1f} %" if right else f"{name} {y[-1]:.4f}"
    assert header in _status_html(rec)  # the dashboard's header line says it too


def _ema_reference(ys, w):
    """TensorBoard's smoothing, written out independently: EMA with bias correction."""
    out, acc = [], 0.0
    for n, v in enumerate(ys, start=1):
        acc = w * acc + (1 - w) * v
        out.append(acc / (1 - w ** n))
    return out


def test_smoothing_slider_restyles_the_ema_lines():
    rec = synthetic(steps=6)
    rec.steps[2]["loss"] = None  # a gap stays a gap
    fig = F.progress(rec, smoothing=0.6)
    (slider,) = fig.layout.sliders
    idx = [i for i, t in enumerate(fig.data) if t.name == "loss (EMA)"]
    raw = [1.0, 0.9, 0.7, 0.6, 0.5]
    assert [float(s.label) for s in slider.steps] == list(F.SMOOTHING_STEPS)
    assert F.SMOOTHING_STEPS[slider.active] == 0.6
    for step in slider.steps:
        w = float(step.label)
        (ys,) = step.args[0]["y"]
        assert step.method == "restyle" and list(step.args[1]) == idx
        want = _ema_reference(raw, w) if w else raw
        got = [v for v in ys if v is not None and not math.isnan(v)]
        np.testing.assert_allclose(got, want)
        assert ys[2] is None or math.isnan(ys[2])
    assert "sliders" not in F.progress(RunRecord()).to_plotly_json()["layout"]  # nothing to smooth
    fig.to_json()


def test_smoothing_zero_draws_the_raw_line_only():
    fig = F.progress(synthetic(steps=4), smoothing=0.0)
    names = [t.name for t in fig.data]
    assert "loss" in names and "loss (EMA)" not in names


def test_identical_runs_are_told_apart():
    a, b, c = synthetic(steps=5), synthetic(steps=5), synthetic(steps=5)
    a.info["name"], b.info["name"], c.info["name"] = "mezo", "zo-offload", "other"
    c.steps[3]["loss"] = 0.123
    fig = F.compare_loss([a, b, c])
    # the smoothed lines are the ones the legend lists, by the runs' names alone
    ema = {t.name: t for t in fig.data if t.showlegend is not False}
    assert set(ema) == {"mezo", "zo-offload (identical to mezo)", "other"}
    assert ema["zo-offload (identical to mezo)"].line.dash == "dash"
    assert ema["mezo"].line.dash is None and ema["other"].line.dash is None


def test_cpu_run_and_missing_data_give_empty_figures_with_notes(offload_run):
    rec, _ = offload_run  # CPU: torch memory is 0, NVML is off
    for build in (F.memory, F.pcie):
        fig = build(rec)
        assert len(fig.data) == 0 and _notes(fig)
        assert fig.layout.xaxis.showticklabels is False  # no numbers on an empty panel
        fig.to_json()
    # host panels are drawn for every run; GPU panels only for GPU runs
    dash = F.dashboard_figure(rec)
    titles = {a.text for a in dash.layout.annotations}
    assert {"utilisation", "GPU memory", "PCIe throughput"}.isdisjoint(titles)
    assert {"host CPU", "host memory", "throughput", "loss, dev accuracy"} <= titles
    assert {"host CPU", "host RAM used", "this process (RSS)"} <= {t.name for t in dash.data}
    assert not _notes(dash)
    nan_rec = RunRecord(steps=[{"step": 0, "loss": None, "seconds": 0.0, "tokens": 10,
                                "end": None}],
                        samples=[{"t (s)": 0.1, "gpu mem used (bytes)": math.nan}])
    for build in (F.timeline, F.memory, F.pcie, F.utilisation, F.progress, F.dashboard_figure):
        build(nan_rec).to_json()
    assert len(F.dashboard_figure(RunRecord()).data) == 0


def test_dashboard_figure_has_every_panel():
    fig = F.dashboard_figure(synthetic())
    names = {t.name for t in fig.data}
    assert {"upload", "loss", "loss (EMA)", "tokens/s", "NVML", "RX host→GPU", "GPU util",
            "host CPU", "host RAM used"} <= names
    fig.to_json()


@pytest.mark.parametrize("live", [False, True])
def test_gpu_dashboard_grid_keeps_right_axes_in_the_last_column(live):
    rec = synthetic()
    rec.config["device"] = "cuda"
    grid = F.dashboard_panels(rec, live=live)
    # a saved run's loss comes first, the smoothing slider right above it
    assert [len(row) for row in grid] == ([1, 3, 3] if live else [2, 1, 2, 2])
    assert live or grid[0][1].title.startswith("loss")
    assert all(not p.y2title for row in grid for p in row[:-1])
    fig = F.dashboard_figure(rec, live=live)
    assert fig.layout.autosize and fig.layout.width is None  # sized by its container
    assert bool(fig.layout.sliders) is not live and bool(fig.layout.title.text) is not live
    legends = [k for k in fig.layout.to_plotly_json() if k.startswith("legend")]
    assert len(legends) == sum(len(row) for row in grid)  # one small legend per panel


def test_short_transfers_get_a_minimum_width_and_their_true_duration():
    rec = synthetic(steps=2)
    rec.events.append(OpEvent("upload", "upload", 1, 7, 4096, 0.05, 0.05 + 1e-6))
    fig = F.timeline(rec, last_steps=2)
    up = next(b for b in _bars(fig) if b.name == "upload")
    shown = [e for e in rec.events if e.step >= 0]
    window = max(e.end for e in shown) - min(e.start for e in shown)
    i = [c[0] for c in up.customdata].index("block 7")
    assert up.x[i] == pytest.approx(F.MIN_BAR * window)  # drawn wider than it lasted
    assert up.customdata[i][3] == pytest.approx(1e-3)  # hover: 1 us in ms
    assert up.marker.line.width >= 1  # an outline: visible at any zoom


def test_long_runs_are_downsampled_keeping_peaks():
    rec = synthetic(samples=100_000)
    rec.samples[54_321]["gpu mem used (bytes)"] = 99e9  # one spike
    fig = F.memory(rec)
    nvml = next(t for t in fig.data if t.name == "NVML")
    assert len(nvml.x) <= F.MAX_POINTS
    assert max(nvml.y) == pytest.approx(99.0)
    assert np.all(np.diff(nvml.x) > 0)


def _downsample_reference(x, y, max_points):
    """The same rule written plainly: equal buckets of ceil(n / (max_points // 2)) points, each
    keeping the positions of its smallest and largest finite value (its first if none)."""
    n, k = len(x), max_points // 2
    size = -(-n // k)
    keep = set()
    for lo in range(0, n, size):
        seg = [(v, i) for i, v in enumerate(y[lo:lo + size], start=lo) if math.isfinite(v)]
        if not seg:
            keep.add(lo)
            continue
        keep.add(min(seg)[1])
        keep.add(max(seg, key=lambda t: (t[0], -t[1]))[1])
    idx = sorted(keep)
    return x[idx], y[idx]


@pytest.mark.parametrize("n", [2001, 4096, 10_007])
def test_downsample_matches_a_plain_reference(n):
    rng = np.random.default_rng(n)
    x = np.arange(n, dtype=float)
    y = rng.normal(size=n)
    y[rng.random(n) < 0.05] = np.nan
    y[100:400] = np.nan  # whole buckets of gaps
    got, want = F.downsample(x, y, 2000), _downsample_reference(x, y, 2000)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert len(got[0]) <= 2000


# --- comparisons ------------------------------------------------------------------------------
def _with_summary(rec: RunRecord, peak: float, tps: float, name: str,
                  spread: float = 0.05) -> RunRecord:
    rec.summary = {"peak_gpu_mem_bytes": peak, "tokens_per_s": tps,
                   "noise": {"step_spread": spread, "steady_steps": 20}}
    rec.info["name"] = name
    return rec


def test_compare_bars_one_bar_per_run_per_metric():
    a = _with_summary(synthetic(), 4e9, 1000.0, "mezo")
    b = _with_summary(synthetic(), 1e9, 2000.0, "offload")
    fig = F.compare_bars([a, b])
    tps, mem = fig.data
    assert list(mem.y) == ["mezo", "offload"] and list(tps.y) == ["mezo", "offload"]
    np.testing.assert_allclose(mem.x, [4.0, 1.0])
    np.testing.assert_allclose(tps.x, [1000.0, 2000.0])
    assert "(0.25x)" in mem.text[1] and "(2.00x)" in tps.text[1] and "(1.00x)" in tps.text[0]
    assert fig.layout.xaxis.title.text == "steady throughput (tokens/s)"
    assert fig.layout.xaxis2.title.text == "peak GPU memory (GB)"
    # run names once, on the left; the first run on top
    assert fig.layout.yaxis.showticklabels and fig.layout.yaxis2.showticklabels is False
    assert fig.layout.yaxis.autorange == "reversed"
    # a ratio inside the runs' step spread is marked, never shown as a win
    noisy = F.compare_bars([a, _with_summary(synthetic(), 1e9, 1100.0, "offload", 0.2)])
    assert noisy.data[0].text[1] == "1100 (1.10x, within noise)"
    assert noisy.data[1].text[1] == "1 (0.25x)"  # memory: no noise mark
    # CPU runs: no GPU memory panel at all (not an empty one)
    cpu = [_with_summary(synthetic(), 0.0, 1000.0, n) for n in ("a", "b")]
    for r in cpu:
        for row in r.steps:
            row.update(mem_allocated=0, mem_reserved=0, mem_peak=0)
        r.samples = [{k: v for k, v in x.items() if not k.startswith(("gpu", "pcie"))}
                     for x in r.samples]
    bars = F.compare_bars(cpu)
    assert len(bars.data) == 1 and "xaxis2" not in bars.layout.to_plotly_json()


def test_compare_bars_labels_are_distinct():
    a, b = synthetic(), synthetic()
    assert list(F.compare_bars([a, b]).data[0].y) == ["zo-offload tiny-opt #1",
                                                      "zo-offload tiny-opt #2"]


def test_compare_loss_memory_timelines():
    a, b = synthetic(steps=4), synthetic(steps=6)
    loss = F.compare_loss([a, b])
    assert [len(t.y) for t in loss.data if t.showlegend is not False] == [4, 6]
    mem = F.compare_memory([a, b])  # each run's torch allocated and peak (not NVML's)
    assert [t.name for t in mem.data] == ["zo-offload steps=4 allocated",
                                          "zo-offload steps=4 peak",
                                          "zo-offload steps=6 allocated",
                                          "zo-offload steps=6 peak"]
    tl = F.compare_timelines([a, b], last_steps=2)
    per_run = [len([e for e in r.events if e.step >= len(r.steps) - 2]) for r in (a, b)]
    by_axis: dict[str, int] = {}
    for t in tl.data:
        by_axis[t.yaxis] = by_axis.get(t.yaxis, 0) + len(t.x)
    assert sorted(by_axis.values()) == sorted(per_run)
    assert len(by_axis) == 2
    assert min(min(t.base) for t in tl.data) == pytest.approx(0.0)  # aligned to window start
    for axis in by_axis:  # every op keyed once in each timeline's own legend
        keyed = [t.name for t in tl.data if t.yaxis == axis and t.showlegend is not False]
        assert sorted(keyed) == sorted({t.name for t in tl.data if t.yaxis == axis})


def test_save_load_gives_the_same_figure(offload_run):
    live, out = offload_run
    saved = RunRecord.load(out)
    a, b = F.dashboard_figure(live), F.dashboard_figure(saved)
    assert len(a.data) == len(b.data) > 0
    for ta, tb in zip(a.data, b.data):
        assert ta.name == tb.name
        for key in ("x", "y", "base"):
            va, vb = getattr(ta, key, None), getattr(tb, key, None)
            if va is None:
                assert vb is None
                continue
            if key == "y" and ta.type == "bar":
                assert list(va) == list(vb)
            else:
                np.testing.assert_array_equal(np.asarray(va, float), np.asarray(vb, float))
        if ta.customdata is not None:
            assert [list(r) for r in ta.customdata] == [list(r) for r in tb.customdata]


def test_layering_ui_is_imported_only_from_the_top():
    root = Path(F.__file__).resolve().parents[1]
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("ui/", "cli/")) or rel == "__main__.py":
            continue
        mods = _imports(path)
        assert not any(m.startswith("workbench.ui") for m in mods), rel
    figs = _imports(root / "ui" / "figures.py") | _imports(root / "ui" / "report.py")
    assert not any(m.startswith("ipywidgets") for m in figs)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out
