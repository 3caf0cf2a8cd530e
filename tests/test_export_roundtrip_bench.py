"""benchmarks/export_roundtrip.py on a CPU: export figures, and transformers' dev metrics of the
exported folder equal to the run's final eval."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from workbench.config import RunConfig
from workbench.recipes.train import run

ROOT = Path(__file__).resolve().parent.parent


def test_round_trip_script_reports_equal_metrics(tmp_path, one_thread):
    cfg = RunConfig(model="tiny-opt", method="mezo", data="embedded", eval_samples=12, steps=2,
                    batch_size=4, seq_len=96, lr=5e-3, sample_hz=0.0,
                    label_words=" a, b")  # one byte token each after the shared space
    run(cfg, tmp_path / "run", progress=False)
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "export_roundtrip.py"),
                        str(tmp_path / "run"), "--out", str(tmp_path / "model")],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OUT": str(tmp_path), "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    (saved,) = tmp_path.glob("export_roundtrip-*.json")
    got = json.loads(saved.read_text())
    assert got["digest_matches_run"] is True and got["accuracy_equal"] is True
    assert got["loss_rel_diff"] < 1e-6 and got["transformers_eval"]["examples"] == 12
    assert 0 < got["peak_rss_growth_bytes"] < got["model_fp32_bytes"] + 64 * 2 ** 20
    assert "dev accuracy: run" in r.stdout
    for p in (ROOT / "benchmarks" / "results").glob(saved.name):  # the CPU copy it also saved
        p.unlink()
