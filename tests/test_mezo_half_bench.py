"""benchmarks/mezo_half.py: its rows are valid configs, a row that cannot fit reports the
planner's refusal instead of starting, and the CPU plumbing run prints every row."""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "mezo_half.py"


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark(SCRIPT)


def test_rows_are_the_four_modes_of_each_model(bench):
    from workbench.config import RunConfig

    args = argparse.Namespace(models="opt-13b,opt-30b", modes=",".join(bench.MODES),
                              shape="8x128", steps=5, device="cuda")
    specs = bench.specs(args)
    assert [s["mode"] for s in specs[:4]] == list(bench.MODES) and len(specs) == 8
    cfgs = [RunConfig(**s["config"]) for s in specs]  # every row is a valid config
    assert {(c.method, c.master) for c in cfgs} == {("mezo", "fp32"), ("mezo", "compressed"),
                                                    ("mezo", "compressed-sr"),
                                                    ("zo-offload", "compressed-sr")}


def test_a_row_that_cannot_fit_reports_the_planners_refusal(bench):
    base = {"model": "opt-30b", "data": "synthetic", "device": "cuda", "batch_size": 8,
            "seq_len": 128}
    refused = bench.refusal({**base, **bench.MODES["mezo fp32 weights"]}, gpu="h100")
    assert refused.startswith("gpu memory: mezo on opt-30b needs")
    assert bench.refusal({**base, **bench.MODES["mezo bf16 nearest"]}, gpu="h100") is None
    half = bench.planned({**base, **bench.MODES["mezo bf16 SR"]})
    full = bench.planned({**base, **bench.MODES["mezo fp32 weights"]})
    assert half["planned_param_gib"] * 2 == pytest.approx(full["planned_param_gib"])


def test_cpu_plumbing_run_prints_every_row(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--models", "tiny-opt",
                        "--steps", "2", "--shape", "2x16", "--modes",
                        "mezo bf16 nearest,mezo bf16 SR"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "tiny-opt 2x16 mezo bf16 nearest: peak" in r.stdout
    assert "tiny-opt 2x16 mezo bf16 SR: peak" in r.stdout
