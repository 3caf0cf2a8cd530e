"""benchmarks/planner_check.py --rows-from: measured rows (a saved JSON, or the rows a cut-off run
printed) are re-predicted with a saved run's calibration; log lines that are not rows are
skipped."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "planner_check.py"

LOG = """calibration: NVIDIA H100 80GB HBM3, fused kernel works, perturbation 232 G elements/s fused
  host, mezo off: 2.68 ms per step + 0.699 ms per block
opt-125m off 16x128 mezo: 0.0231 s/step, 0.57 GiB
opt-1.3b bf16+sr 1x2048 zo-offload: 0.0922 s/step, 1.35 GiB
opt-2.7b off 16x128 zo-offload: timed out after 300 s
rc 124
"""


def test_rows_from_a_log_carry_their_configs(load_benchmark):
    mod = load_benchmark(SCRIPT)
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        log = Path(d, "run.log")
        log.write_text(LOG)
        rows = mod.rows_from(log)
    assert [r["name"] for r in rows] == ["opt-125m off 16x128 mezo",
                                         "opt-1.3b bf16+sr 1x2048 zo-offload"]
    assert rows[0]["step_seconds"] == 0.0231 and rows[0]["peak_gpu_mem_bytes"] == 0.57 * 2**30
    c = rows[1]["config"]
    assert (c["model"], c["method"], c["batch_size"], c["seq_len"], c["amp"], c["codec"],
            c["master"]) == ("opt-1.3b", "zo-offload", 1, 2048, "bf16", "bf16", "compressed-sr")


def test_rows_from_predicts_with_the_saved_calibration(tmp_path):
    log = tmp_path / "run.log"
    log.write_text(LOG)
    saved = ROOT / "benchmarks" / "results" / \
        "planner_check-2.7b-gputime-NVIDIA-H100-80GB-HBM3-2026-11-23.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--rows-from", str(log), "--calibration",
                        str(saved), "--name", "test-from-log"], capture_output=True, text=True,
                       env={**__import__("os").environ, "OUT": str(tmp_path)}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = next(tmp_path.glob("test-from-log-*.json"))
    data = json.loads(out.read_text())
    for p in (ROOT / "benchmarks" / "results").glob("test-from-log-*.json"):
        p.unlink()  # the script also saves under results/
    assert [r["run"] for r in data["rows"]] == ["opt-125m off 16x128 mezo",
                                                "opt-1.3b bf16+sr 1x2048 zo-offload"]
    assert data["calibration"] == json.loads(saved.read_text())["calibration"]
    assert data["rows"][0]["time_meas_s"] == 0.0231
    assert 0 < data["rows"][0]["time_pred_s"] < 1 and data["within"]["rows"] == 2
    r = subprocess.run([sys.executable, str(SCRIPT), "--rows-from", str(log)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--rows-from needs --calibration" in r.stderr


def test_rows_from_a_saved_json_are_its_measured_rows(tmp_path, load_benchmark):
    mod = load_benchmark(SCRIPT)
    saved = ROOT / "benchmarks" / "results" / \
        "planner_check-2.7b-gputime-NVIDIA-H100-80GB-HBM3-2026-11-23.json"
    rows = mod.rows_from(saved)
    assert rows == json.loads(saved.read_text())["measured"] and len(rows) == 5
