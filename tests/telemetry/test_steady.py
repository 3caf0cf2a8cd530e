"""Steady-state throughput: the warm-up rule, and what a real run's summary, the CLI and the
report make of it."""
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.telemetry.steady import SETTLE, throughput, warmup_count

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("seconds, warm", [
    ([], 0),
    ([3.0], 0),  # a single step is all there is
    ([3.0, 1.0], 1),
    ([1.0, 1.0, 1.0], 1),  # the first step always, even when it is not slow
    ([4.6, 0.26, 0.27, 0.26, 0.25], 1),  # the run once the kernels are warm
    ([0.5, 4.6, 0.26, 0.27, 0.26, 0.25], 2),  # a compile in step 2: left out too
    ([0.5, 4.6, 2.0, 0.26, 0.27, 0.26, 0.25], 3),
    ([0.5, 0.26, 0.27, 4.0, 0.26], 1),  # a slow step once settled stays in (checkpoint, eval)
])
def test_warmup_rule(seconds, warm):
    assert warmup_count(seconds) == warm


def test_settle_threshold_is_relative_to_the_median_of_steps_after_the_first():
    median = statistics.median([1.0, 1.0, 1.0, 1.0])
    assert warmup_count([9.0, SETTLE * median + 1e-9, 1.0, 1.0, 1.0]) == 2
    assert warmup_count([9.0, SETTLE * median, 1.0, 1.0, 1.0]) == 1


def test_throughput_figures():
    secs = [5.0, 2.0, 0.5, 0.4, 0.6, 0.5]
    toks = [100, 100, 100, 100, 120, 100]
    steps = [{"step": i, "seconds": s, "tokens": t} for i, (s, t) in enumerate(zip(secs, toks))]
    out = throughput(steps)
    assert out["warmup_steps"] == 2 and out["steady_steps"] == 4
    assert out["tokens_per_s"] == pytest.approx(420 / 2.0)
    assert out["step_seconds"] == pytest.approx(0.5)  # median of 0.5, 0.4, 0.6, 0.5
    assert out["wall_tokens_per_s"] == pytest.approx(620 / 9.0)
    empty = throughput([])
    assert math.isnan(empty["tokens_per_s"]) and empty["warmup_steps"] == 0


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


def test_cli_run_summary_compare_and_report_use_the_steady_steps(tmp_path):
    out = tmp_path / "run"
    r = _cli("run", "--set", "model=tiny-opt", "--set", "method=zo-offload", "--set",
             "data=synthetic", "--set", "steps=6", "--set", "batch_size=2", "--set",
             "seq_len=16", "--set", "sample_hz=0", "--out", str(out), "--quiet")
    assert r.returncode == 0, r.stderr
    run = json.loads((out / "run.json").read_text())
    steps, summary = run["steps"], run["summary"]
    secs = [s["seconds"] for s in steps]
    warm = summary["warmup_steps"]
    assert warm == warmup_count(secs) >= 1
    assert summary["tokens_per_s"] == pytest.approx(
        sum(s["tokens"] for s in steps[warm:]) / sum(secs[warm:]))
    assert summary["step_seconds"] == pytest.approx(statistics.median(secs[warm:]))
    assert summary["wall_tokens_per_s"] == pytest.approx(
        sum(s["tokens"] for s in steps) / sum(secs))
    assert run["info"]["warmup_seconds"] >= 0 and summary["warmup_seconds"] >= 0
    compared = _cli("compare", str(out), str(out)).stdout
    for text in (r.stdout, compared):
        assert "tokens/s (steady)" in text and "warm-up steps left out" in text
        assert f"{summary['tokens_per_s']:,.0f}" in text and "MB = 10^6 bytes" in text
    assert f"{summary['tokens_per_s']:,.0f} (1.00x, within noise" in compared  # same run twice
    assert f"{summary['bytes_h2d'] / 1e6:,.2f}" in compared  # MB = 10^6, as the note says
    page = tmp_path / "r.html"
    assert _cli("report", str(out), "-o", str(page)).returncode == 0
    html = page.read_text(encoding="utf-8")
    assert "tokens/s (steady)" in html and "are warm-up" in html
    assert f"{summary['bytes_h2d'] / 1e6:,.2f}" in html and "MB = 10<sup>6</sup>" in html


@pytest.mark.gpu
@pytest.mark.timing
# Models whose steps the GPU and the link pace (0.13-0.24 s on an H100). Below that the step is
# bound by the host's kernel launches and jitters with host scheduling, which says nothing about
# warm-up: H100, 2026-11-23, four identical opt-1.3b bf16 + SR runs had steps of 0.063-0.176 s
# and mean/median gaps of 3-10% (benchmarks/results/logs/h100-2026-11-23-steady13.log), and an
# opt-350m fp32 run had steps 2-3 at 1.44x its median.
@pytest.mark.parametrize("model, codec, master", [("opt-1.3b", "fp32", "fp32"),
                                                  ("opt-2.7b", "bf16", "compressed-sr")])
def test_fresh_process_reports_its_own_median_step(tmp_path, model, codec, master):
    """A fresh process (no kernel compiled yet in it): step 2 (the first fused update) is no
    slower than the steady steps allow (its compile happened in setup), so only step 1 is
    left out, and the summary's step time and tokens/s are those of steps 2..n. (Not how far
    the mean step sits from the median: bf16-SR steps jitter by 10% and more between steps of
    one process on an H100, which says nothing about warm-up; H100, 2026-11-27, this test
    failed once for each of its two rows on that bound alone, the other row passing.)"""
    out = tmp_path / "run"
    r = _cli("run", "--set", f"model={model}", "--set", "method=zo-offload", "--set",
             "device=cuda", "--set", "data=synthetic", "--set", "batch_size=16", "--set",
             "seq_len=128", "--set", "steps=20", "--set", f"codec={codec}", "--set",
             f"master={master}", "--set", "amp=bf16" if codec != "fp32" else "amp=off",
             "--out", str(out), "--quiet")
    assert r.returncode == 0, r.stderr
    run = json.loads((out / "run.json").read_text())
    steps, summary = run["steps"], run["summary"]
    secs = [s["seconds"] for s in steps]
    assert summary["warmup_steps"] == 1, secs[:4]  # step 2 within SETTLE x the median
    assert summary["step_seconds"] == pytest.approx(statistics.median(secs[1:]), rel=1e-9)
    tokens = sum(s["tokens"] for s in steps[1:])
    assert summary["tokens_per_s"] == pytest.approx(tokens / sum(secs[1:]), rel=1e-9)
