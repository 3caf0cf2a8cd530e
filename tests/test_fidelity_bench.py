"""benchmarks/fidelity.py --report: long runs from several files (a grid run as invocations
side by side), each method's best over all of them, and the issue's targets."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "fidelity.py"


def long_run(method: str, lr: float, accs: list[float], every: int = 100) -> dict:
    steps = [every * i for i in range(len(accs))]
    return {"name": f"{method} lr={lr:g}", "method": method.split("+")[0], "lr": lr,
            "eval_accuracy_start": accs[0], "eval_accuracy": accs[-1], "best_accuracy": max(accs),
            "steps": steps[-1], "train_seconds": 1.0, "final_loss": 0.5,
            "curve": {"step": steps, "seconds": [0.1 * s for s in steps], "accuracy": accs}}


def test_report_takes_each_methods_best_over_every_file(tmp_path):
    files = {"fo-a": {"fo": {"grid": [], "fo": long_run("fo", 1e-5, [0.5, 0.80, 0.84])}},
             "fo-b": {"fo": {"grid": [], "fo": long_run("fo", 3e-5, [0.5, 0.86, 0.85])}},
             "zo-a": {"zo": {"grid": [], "mezo": long_run("mezo", 2e-5, [0.5, 0.70, 0.79, 0.78])}},
             "zo-b": {"zo": {"grid": [], "mezo": long_run("mezo", 3e-5, [0.5, 0.74, 0.70])}}}
    paths = []
    for name, payload in files.items():
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(payload))
    r = subprocess.run([sys.executable, str(SCRIPT), "--report", *map(str, paths)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "fo: 0.860 (lr 3e-05, step 100)" in out  # not the last file's, not the end value
    assert "mezo: 0.790 (lr 2e-05, step 200)" in out
    assert "gap 7.0 points (target <= 5: missed)" in out
    assert "29.0 points above zero-shot (target >= 25: met)" in out
    assert sum(" lr=" in line and "step /" not in line for line in out.splitlines()) == 4
