"""benchmarks/lora_stream.py: the table's ratios, bounds and target checks from known inputs,
and ``--report`` over a saved file whose last (model, shape) was cut short by a timeout."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "lora_stream.py"


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark(SCRIPT)


def run(kind: str, tps: float, peak: float, step: float, up: float, down: float = 0.0) -> dict:
    return {"kind": kind, "tokens_per_s": tps, "peak_gpu_mem_bytes": peak,
            "peak_gpu_mem_gb": peak / 1e9, "step_seconds": step, "bytes_h2d": up,
            "bytes_d2h": down}


def test_ratios_bounds_and_targets(bench):
    rows = {"mezo+lora": run("mezo+lora", 1000.0, 10e9, 0.1, 0.0),
            "lora fp8-e4m3": run("lora fp8-e4m3", 950.0, 2e9, 0.11, 5e9),
            "lora int8": run("lora int8", 800.0, 2e9, 0.12, 5e9),
            "lora bf16": run("lora bf16", 500.0, 2.5e9, 0.24, 10e9)}
    out = {line["kind"]: line for line in bench.summarise(rows, h2d=50e9)}
    fp8 = out["lora fp8-e4m3"]
    assert fp8["tps_ratio"] == pytest.approx(0.95) and fp8["mem_ratio"] == pytest.approx(0.2)
    assert fp8["bound_s"] == pytest.approx(0.1) and fp8["vs_bound"] == pytest.approx(1.1)
    assert fp8["targets"] == "met" and out["lora int8"]["targets"] == "missed"  # 0.8x < 0.9x
    assert out["lora bf16"]["vs_bound"] == pytest.approx(1.2)
    assert out["lora bf16"]["targets"] == "missed"  # 1.2x its bound > 1.1x
    assert "tps_ratio" not in out["mezo+lora"]


def test_report_reads_runs_a_timeout_cut_short(tmp_path):
    runs = [dict(run("mezo+lora", 1000.0, 10e9, 0.1, 0.0), model="m", shape="1x8"),
            dict(run("lora bf16", 400.0, 2e9, 0.25, 10e9), model="m", shape="1x8"),
            {"kind": "lora int8", "model": "m", "shape": "1x8", "error": "timed out"}]
    path = tmp_path / "saved.json"
    path.write_text(json.dumps({"pcie": {"h2d": 50e9}, "runs": runs, "rows": []}))
    r = subprocess.run([sys.executable, str(SCRIPT), "--report", str(path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    row = {kind: next(line for line in r.stdout.splitlines() if f" {kind} " in line)
           for kind in ("lora bf16", "lora int8")}
    assert "0.400" in row["lora bf16"] and "1.250" in row["lora bf16"]  # ratio, step/bound
    assert "timed out" in row["lora int8"]


def test_report_compares_a_row_rerun_alone_with_the_first_files_reference(tmp_path):
    """A row measured later with --kinds (its own file) is set against the mezo+lora row of
    the file that holds it, at that file's PCIe rate."""
    first, later = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps({"pcie": {"h2d": 50e9}, "rows": [], "runs": [
        dict(run("mezo+lora", 1000.0, 10e9, 0.1, 0.0), model="m", shape="1x8")]}))
    later.write_text(json.dumps({"pcie": {"h2d": 40e9}, "rows": [], "runs": [
        dict(run("full", 300.0, 4e9, 0.3, 10e9, 10e9), model="m", shape="1x8")]}))
    r = subprocess.run([sys.executable, str(SCRIPT), "--report", str(first), str(later)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    full = next(line for line in r.stdout.splitlines() if " full " in line)
    assert "0.300" in full and "0.400" in full  # x mezo+lora; memory ratio
    assert "1.500" in full  # 0.3 s over 10 GB / 50 GB/s (the first file's rate)
