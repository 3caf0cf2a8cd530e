"""benchmarks/fo_offload.py: its phase times and target checks from known inputs, and a CPU
plumbing run through its command line (rows in fresh processes, torchao skipped without CUDA)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.engine.events import OpEvent

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "fo_offload.py"


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark(SCRIPT)


def test_phases_are_busy_unions_sums_and_medians(bench):
    ev = lambda op, s, a, b, nbytes=0: OpEvent(op, "x", s, 0, nbytes, a, b)  # noqa: E731
    events = []
    for s, k in ((1, 1.0), (2, 2.0), (3, 3.0)):  # step s scaled by k: the median is step 2
        events += [ev("backward", s, 0.0, 1.0 * k),
                   ev("grad-d2h", s, 0.5 * k, 1.5 * k, 100), ev("grad-d2h", s, 1.0 * k,
                                                                 2.0 * k, 100),
                   ev("cpu-update", s, 0.8 * k, 1.0 * k), ev("cpu-update", s, 1.2 * k, 1.6 * k),
                   ev("gpu-wait", s, 2.0 * k, 2.1 * k)]
    ph = bench.phases(events, [1, 2, 3])
    assert ph["backward_s"] == pytest.approx(2.0)
    assert ph["optimizer_step_s"] == 0.0
    events.append(ev("optimizer-step", 2, 3.0, 3.5))
    assert bench.phases(events, [2])["optimizer_step_s"] == pytest.approx(0.5)
    # The engine's phases: D2H busy is the union (1.5 k), not the sum (2 k).
    assert bench._busy([e for e in events if e.step == 2], "grad-d2h") == pytest.approx(3.0)
    assert bench._rate([e for e in events if e.step == 2], "grad-d2h") == pytest.approx(200 / 3)
    assert bench._lead([e for e in events if e.step == 2]) == pytest.approx(1.6 - 2.0)


def test_summary_checks_the_targets_against_the_torchao_rows(bench):
    split = {"cpu": 0.5, "gpu": 0.5, "resident": 0.0}
    base = {"fp32_master": True, "split": split, "phases": {}}
    rows = [
        {"row": "torchao-fp32", "iteration_s": 1.5, "peak_gpu_bytes": 40e9, "fp32_master": True},
        {"row": "torchao-bf16", "iteration_s": 1.1, "peak_gpu_bytes": 18e9, "fp32_master": False},
        {"row": "static", "iteration_s": 1.2, "peak_gpu_bytes": 30e9, **base,
         "update_s_predicted": 1.0, "update_s_measured": 1.0, "prediction_error": 0.0},
        {"row": "auto", "iteration_s": 1.0, "peak_gpu_bytes": 19e9, **base,
         "update_s_predicted": 0.9, "update_s_measured": 1.0, "prediction_error": -0.1},
        {"row": "all-cpu", "error": "out of memory"},
    ]
    lines = {x["row"]: x for x in bench.summarise(rows)}
    auto = lines["auto"]
    assert auto["x_fp32"] == pytest.approx(1.5) and auto["x_bf16"] == pytest.approx(1.1)
    assert auto["mem_x_fp32"] == pytest.approx(19 / 40)
    assert auto["targets"] == "met met met met"
    assert lines["static"]["targets"] == "met"  # its prediction only
    assert lines["all-cpu"]["error"] == "out of memory"
    rows[3] = {**rows[3], "iteration_s": 1.15, "prediction_error": 0.2}  # < 1x torchao-bf16
    auto = {x["row"]: x for x in bench.summarise(rows)}["auto"]
    assert auto["targets"] == "met missed met missed"


def test_unknown_rows_are_refused_in_one_line():
    out = subprocess.run([sys.executable, str(SCRIPT), "--rows", "auto,bogus,stride:0"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2
    assert "--rows: bogus, stride:0 not among" in out.stderr


def test_cpu_plumbing_run_prints_the_table_and_skips_torchao():
    out = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--model", "tiny-opt",
                          "--steps", "1", "--subgroup", "20000", "--threads", "1",
                          "--rows", "all-cpu,auto,defaults,torchao-bf16"],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    assert "torchao-bf16 ...\n  needs CUDA" in text
    line = next(x for x in text.splitlines() if x.strip().startswith("all-cpu") and "yes" in x)
    assert float(line.split()[1]) > 0  # the iteration seconds
    # auto: each candidate placement timed for a step before the timed steps, one kept (the
    # candidates' order follows the measured rates, so a loaded machine may list them otherwise)
    tried = re.search(r"auto tried (.*); kept ", text)
    assert tried, text
    assert re.search(r"(^|, )stride -?\d+/[cg]pu/[\d.]+M/res 0: [\d.]+ s", tried.group(1)), text
    assert re.search(r"(^|, )all-cpu/[cg]pu/[\d.]+M/res 0: [\d.]+ s", tried.group(1)), text
    defaults = next(x for x in text.splitlines() if x.strip().startswith("defaults"))
    assert float(defaults.split()[1]) > 0  # the CLI's defaults ran (one size on a CPU)
    assert "saved nothing (a CPU plumbing run)" in text


def test_rows_of_separate_runs_are_summarised_together_without_running_any(tmp_path):
    """--rows '' --with A --with B: nothing runs; the torchao-bf16 row measured alone is set
    beside the earlier file's rows (ratios across files), and the merge is saved."""
    rows_a = [{"row": "torchao-fp32", "iteration_s": 1.5, "peak_gpu_bytes": 40e9,
               "fp32_master": True},
              {"row": "auto", "iteration_s": 1.0, "peak_gpu_bytes": 19e9, "fp32_master": True,
               "split": {"cpu": 0.5, "gpu": 0.5, "resident": 0.0}, "phases": {},
               "update_s_predicted": 0.9, "update_s_measured": 1.0, "prediction_error": -0.1}]
    rows_b = [{"row": "torchao-bf16", "iteration_s": 1.25, "peak_gpu_bytes": 18e9,
               "fp32_master": False}]
    paths = []
    for name, rows in (("a", rows_a), ("b", rows_b)):
        paths += ["--with", str(tmp_path / f"{name}.json")]
        (tmp_path / f"{name}.json").write_text(json.dumps({"model": "tiny-opt", "rows": rows}))
    out = subprocess.run([sys.executable, str(SCRIPT), "--model", "tiny-opt", "--rows", "",
                          *paths, "--name", str(tmp_path / "merged")],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert " ..." not in out.stdout  # no row ran
    auto = next(x for x in out.stdout.splitlines() if x.strip().startswith("auto"))
    assert "1.50" in auto and "1.25" in auto  # x torchao-fp32, x torchao-bf16 (from file b)
    saved = json.loads(next(tmp_path.glob("merged-*.json")).read_text())
    assert [r["from"] for r in saved["rows"]] == ["a.json", "a.json", "b.json"]


def test_the_defaults_row_is_held_to_the_best_other_row(bench):
    """issue 41: the CLI's defaults within 10% of the best row (any other row, torchao's too)."""
    base = {"fp32_master": True, "split": {"cpu": 1.0, "gpu": 0.0, "resident": 0.0},
            "phases": {}}
    rows = [{"row": "auto", "iteration_s": 1.0, "peak_gpu_bytes": 19e9, **base},
            {"row": "torchao-bf16", "iteration_s": 1.2, "peak_gpu_bytes": 18e9},
            {"row": "defaults", "iteration_s": 1.08, "peak_gpu_bytes": 20e9, **base}]
    line = {x["row"]: x for x in bench.summarise(rows)}["defaults"]
    # within 10% of the best; and >= 1.0x torchao-bf16 (1.2 / 1.08)
    assert line["x_best"] == pytest.approx(1.08) and line["targets"] == "met met"
    rows[2]["iteration_s"] = 1.15
    line = {x["row"]: x for x in bench.summarise(rows)}["defaults"]
    assert line["targets"] == "missed met"
    rows[2]["iteration_s"] = 1.25  # slower than torchao-bf16 too
    line = {x["row"]: x for x in bench.summarise(rows)}["defaults"]
    assert line["targets"] == "missed missed"


def test_a_capped_defaults_row_is_held_to_torchao_fp32_at_half_its_memory(bench):
    """issue 41: the defaults under gpu_mem_limit_gb >= 1.3x torchao-fp32 at <= 0.5x its peak
    GPU memory (a capped row said only "met" for its prediction before, whatever its speed)."""
    base = {"fp32_master": True, "split": {"cpu": 1.0, "gpu": 0.0, "resident": 0.0},
            "phases": {}}
    rows = [{"row": "torchao-fp32", "iteration_s": 1.659, "peak_gpu_bytes": 45.1e9},
            {"row": "defaults:22.5", "iteration_s": 1.581, "peak_gpu_bytes": 18.9e9, **base,
             "update_s_predicted": 1.0, "update_s_measured": 1.06,
             "prediction_error": -0.06}]
    line = {x["row"]: x for x in bench.summarise(rows)}["defaults:22.5"]
    assert line["targets"] == "missed met"  # 1.05x at 0.42x; the prediction within 15%
    rows[1]["iteration_s"] = 1.2  # 1.38x
    assert {x["row"]: x for x in bench.summarise(rows)}["defaults:22.5"]["targets"] == "met met"
    rows[1]["peak_gpu_bytes"] = 25e9  # over half torchao-fp32's 45.1 GB
    line = {x["row"]: x for x in bench.summarise(rows)}["defaults:22.5"]
    assert line["targets"] == "missed met"


@pytest.mark.gpu
def test_the_cli_defaults_run_within_10_percent_of_the_best_row(tmp_path):
    """On a GPU: the defaults row (subgroup_size=auto, update_stride=auto, telemetry on) steps
    within 10% of the fastest tuned row of the same benchmark run (opt-6.7b as in issue 41,
    fresh processes; ~112 GB of host memory; at opt-1.3b a step is ~0.08 s and steps of one
    placement vary by 30% on an H100 host, too much to hold to 10%)."""
    out = subprocess.run([sys.executable, str(SCRIPT), "--model", "opt-6.7b", "--steps", "5",
                          "--rows", "defaults,auto,static",
                          "--name", str(tmp_path / "defaults")],
                         capture_output=True, text=True, cwd=ROOT, timeout=1800)
    assert out.returncode == 0, out.stderr[-2000:]
    saved = json.loads(next(tmp_path.glob("defaults-*.json")).read_text())
    line = {x["row"]: x for x in saved["summary"]}["defaults"]
    assert not line.get("error"), line
    assert line["x_best"] <= 1.10, out.stdout[-4000:]
