"""benchmarks/data_parallel.py on the CPU (gloo, torchrun): a 1-rank and a 2-rank row of a tiny
model, each a real ``torchrun -m workbench run``, with both speedups and equal rank digests."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_two_gloo_ranks_give_a_row_with_both_speedups(tmp_path):
    r = subprocess.run(
        [sys.executable, "benchmarks/data_parallel.py", "--device", "cpu", "--model", "tiny-opt",
         "--gpus", "1,2", "--modes", "weak", "--steps", "4", "--per-gpu-batch", "2",
         "--seq-len", "16", "--digest-check-every", "2", "--name", str(tmp_path / "dp-test")],
        cwd=ROOT, capture_output=True, text=True, timeout=600)  # saved in tmp_path, not results/
    assert r.returncode == 0, r.stderr[-2000:]
    saved = json.loads(next(tmp_path.glob("dp-test-*.json")).read_text())
    one, two = saved["rows"]
    assert "error" not in one and "error" not in two, (one.get("error"), two.get("error"))
    assert one["speedup"] == one["median_speedup"] == 1.0
    # tokens per step over the median step, against the 1-rank row's
    assert abs(two["median_speedup"] - 2 * one["step_seconds"] / two["step_seconds"]) < 1e-9
    assert two["rank_digests_equal"] is True and two["ranks"] == 2
    assert saved["args"]["digest_check_every"] == 2
    assert "x 1 GPU, median" in r.stdout
