"""benchmarks/scale.py: a row from a saved run.json, including a run whose process ended
during its end-of-run save (no summary yet), and --from-run through the command line."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "scale.py"


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark(SCRIPT)


def record(seconds: list[float], summary: dict | None = None, status: str = "stopped") -> dict:
    steps = [{"step": i, "seconds": s, "tokens": 1024, "mem_peak": 5e9 + i,
              "bytes_h2d": 20e9, "bytes_d2h": 0} for i, s in enumerate(seconds)]
    return {"steps": steps, "summary": summary or {}, "status": status,
            "info": {"build_seconds": 12.5}}


def test_a_stopped_record_is_summarised_over_its_steps_after_the_first(bench):
    row = bench.from_record(record([9.0, 2.0, 4.0, 3.0]))
    assert row["warmup_steps"] == 1 and row["steady_steps"] == 3
    assert row["step_seconds"] == 3.0 and row["tokens_per_s"] == pytest.approx(1024 / 3.0)
    assert row["torch_peak_gb"] == pytest.approx(5.000000003) and row["h2d_gb_step"] == 20.0
    assert row["status"] == "stopped" and row["build_seconds"] == 12.5


def test_a_finished_record_keeps_its_own_summary(bench):
    summary = {"warmup_steps": 2, "step_seconds": 2.5, "tokens_per_s": 400.0,
               "peak_gpu_mem_bytes": 7e9}
    row = bench.from_record(record([9.0, 5.0, 2.0, 3.0], summary, "done"))
    assert (row["warmup_steps"], row["steady_steps"], row["step_seconds"]) == (2, 2, 2.5)
    assert row["tokens_per_s"] == 400.0 and row["torch_peak_gb"] == 7.0


def test_from_run_prints_the_row_beside_the_plan_and_its_bound(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(record([9.0, 2.0, 2.0, 2.0])))
    r = subprocess.run([sys.executable, str(SCRIPT), "--rows", "tiny", "--device", "cpu",
                        "--from-run", str(path), "--h2d-gbps", "10", "--name",
                        str(tmp_path / "scale")], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("tiny"))
    assert "stopped" in line and "2.000" in line  # median step after the first
    assert "1.00" in line  # 2 s over 20 GB / 10 GB/s


def test_the_watcher_reads_nvml_before_the_run_and_its_peak(bench, monkeypatch):
    """NVML's used memory is read once before the child can start CUDA (the driver's reserve,
    other processes) and then every 0.5 s: the row reports the run's own as peak - base."""
    import types

    readings = iter([500, 800, 900, 850] + [850] * 100)
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=next(readings)))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.8)"])
    peak: dict = {"rss": 0, "pss": 0, "nvml": 0}
    bench.watch_tree(proc, peak, gpu_index=0)
    assert peak["nvml_base"] == 500 and peak["nvml"] == 900
    assert peak["rss"] > 0
