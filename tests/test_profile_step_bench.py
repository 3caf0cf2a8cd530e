"""benchmarks/profile_step.py: its trace sums from a known trace, and a CPU plumbing run through
its command line (engine and recipe rows in fresh processes)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "profile_step.py"


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark(SCRIPT)


def _k(name, stream, ts, dur, cat="kernel", **args):
    return {"cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"stream": stream, **args}}


def test_kernels_are_sorted_into_kinds(bench):
    assert bench.kind("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32") == "gemm"
    assert bench.kind("zo_kernel") == "zo kernel"
    assert bench.kind("fmha_cutlassF_f32_aligned_64x64_rf_sm80") == "attention"  # not a GEMM
    assert bench.kind("void at::native::vectorized_layer_norm_kernel<float>") == "layer norm"
    assert bench.kind("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy") == "copy htod"
    assert bench.kind("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy") == "copy dtoh pageable"
    assert bench.kind("Memset (Device)", "gpu_memset") == "memset"
    assert bench.kind("some_custom_kernel") == "other"


def test_two_steps_sum_per_stream_with_idle_time_and_gaps(bench):
    events = []
    for step in range(2):  # each step: 1000 us apart, the same kernels
        o = 1000 * step
        events += [_k("ampere_sgemm_128x64_tn", 7, o + 0, 100),
                   _k("zo_kernel", 7, o + 110, 20),  # a 10 us gap before it
                   _k("fmha_cutlassF_f32", 7, o + 200, 50),  # a 70 us gap before it
                   _k("Memcpy HtoD (Pinned -> Device)", 21, o + 0, 150, "gpu_memcpy",
                      bytes=4000),
                   {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": o, "dur": 5},
                   {"cat": "cuda_runtime", "name": "cudaStreamWaitEvent", "ts": o + 6, "dur": 2},
                   {"cat": "cpu_op", "name": "aten::mm", "ts": o, "dur": 30}]
    out = bench.summarize(events, steps=2)
    assert out["compute_stream"] == "7"  # 170 us busy per step against the copy's 150
    comp, copy = out["streams"]["7"], out["streams"]["21"]
    assert comp["busy_s"] == pytest.approx(170e-6)
    assert comp["span_s"] == pytest.approx((1250 - 0) / 2 * 1e-6)  # first start to last end
    assert comp["by_kind_s"] == pytest.approx({"gemm": 100e-6, "attention": 50e-6,
                                               "zo kernel": 20e-6})
    assert comp["kernels"] == 3
    # gaps: 750 us between the steps, then 70 and 10 us inside each step
    assert [g for g, *_ in comp["gaps"]] == [750.0, 70.0, 70.0, 10.0, 10.0]
    assert comp["gaps"][1][1:] == ("zo_kernel", "fmha_cutlassF_f32")
    assert comp["gaps_over_us"] == pytest.approx((750 + 140 + 20) / 2 * 1e-6)
    assert copy["bytes"] == {"copy htod": 4000}
    assert out["gpu_span_s"] == pytest.approx(1250 / 2 * 1e-6)
    assert out["runtime"]["cudaLaunchKernel"] == (pytest.approx(5e-6), 1.0)
    assert list(out["runtime"]) == ["cudaLaunchKernel", "cudaStreamWaitEvent"]


def test_the_compute_stream_is_the_one_with_most_kernel_time_not_the_busiest(bench):
    # opt-350m bf16 zo-offload on an H100: the upload stream's copies out-ran the compute's kernels
    events = [_k("nvjet_sm90_tst_128x128", 7, 0, 100), _k("zo_kernel", 7, 120, 20),
              _k("Memcpy HtoD (Pinned -> Device)", 13, 0, 400, "gpu_memcpy", bytes=8000),
              _k("Memcpy DtoH (Device -> Pinned)", 17, 0, 300, "gpu_memcpy", bytes=6000)]
    out = bench.summarize(events, steps=1)
    assert out["streams"]["13"]["busy_s"] > out["streams"]["7"]["busy_s"]
    assert out["compute_stream"] == "7"


def test_a_trace_without_gpu_events_has_no_compute_stream(bench):
    out = bench.summarize([{"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 3}], steps=1)
    assert out["compute_stream"] is None and out["streams"] == {} and out["gpu_span_s"] == 0


def test_cpu_plumbing_run_prints_engine_and_recipe_rows():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--model", "tiny-opt", "--shape",
         "2x16", "--rows", "mezo,zo-offload", "--warmup", "1", "--steps", "1", "--recipe",
         "--timeout", "240"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    for name in ("tiny-opt-mezo-off-2x16 engine", "tiny-opt-zo-offload-off-2x16 engine",
                 "tiny-opt-mezo-off-2x16 recipe", "tiny-opt-zo-offload-off-2x16 recipe"):
        row = [ln for ln in lines if ln.startswith(name) or f"| {name} " in ln]
        assert row, f"no table row for {name}:\n{proc.stdout}"
        assert not re.search(r"error|exit \d", row[-1]), row[-1]
    assert "saved nothing (a CPU plumbing run)" in proc.stdout
