"""A busy host: torch's threads come from the cores other processes leave free, and the user is
told the host is busy (a CPU hog on every core, started here, makes it busy)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workbench.config import RunConfig
from workbench.runs import threads

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("busy, want", [(0.0, None), (0.3, None), (0.8, 1), (1.6, 1),
                                        (7.5, 1)])
def test_a_wide_model_gets_the_free_cores(busy, want, monkeypatch):
    """The load figure injected: on a quiet host torch keeps its default; with one core of two
    (or more than all) taken, one thread: torch's threads wait on each other at every
    operation, so a thread sharing its core holds the others up."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "cores", lambda: 2)
    monkeypatch.setattr(threads, "DEFAULT", 2)
    before = torch.get_num_threads()
    try:
        why = threads.choose_threads(RunConfig(model="opt-125m"), busy=busy)
        got = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert got == (want or 2), why
    assert f"{busy:.1f} of its 2 cores busy" in why
    assert (threads.NOTE != "") == (want is not None)
    if want:
        assert threads.NOTE.startswith(f"note: host busy: other processes use {busy:.1f} of 2 "
                                       "CPU cores; torch computes on 1 thread (not 2)")


def test_the_busy_cores_follow_a_hog():
    """The measured figure: a hog on one core raises it by about one core."""
    quiet = threads.busy_cores(0.5)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = threads.busy_cores(0.5)
    finally:
        hog.kill()
        hog.wait()
    n = os.cpu_count() or 1
    assert 0.0 <= quiet <= n and 0.0 <= busy <= n
    assert busy >= min(quiet + 0.5, n - 0.3), (quiet, busy)


def test_a_run_on_a_busy_host_says_so_and_records_why(tmp_path):
    """Through the CLI, with a hog on every core: one line says the host is busy and what
    torch computes on; the run records the threads and the load behind them."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 1)]
    try:
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
        r = subprocess.run([sys.executable, "-m", "workbench", "run", "--quiet", "--out",
                            str(tmp_path / "run"), "--set", "model=tiny-opt", "--set",
                            "data=synthetic", "--set", "steps=2", "--set", "batch_size=2",
                            "--set", "seq_len=16"], cwd=REPO, capture_output=True,
                           text=True, timeout=300, env=env)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("note: host busy")]
    assert len(lines) == 1 and "torch computes on 1 thread" in lines[0], r.stderr
    env = json.loads((tmp_path / "run" / "run.json").read_text())["environment"]
    assert env["torch threads"] == 1
    assert "cores busy when the run started" in env["torch threads (why)"]


def _run(out: Path, *sets: str) -> None:
    args = [a for s in ("model=tiny-opt", "data=synthetic", "steps=10", "batch_size=2",
                        "seq_len=16", *sets) for a in ("--set", s)]
    r = subprocess.run([sys.executable, "-m", "workbench", "run", "--quiet", "--out", str(out),
                        *args], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


def test_compare_and_the_report_call_a_ratio_timed_under_a_changed_load_within_noise(tmp_path):
    """Two real runs; the load figure each saw is injected into its record (one quiet, one
    beside other processes taking 80% of the CPU): compare and the report say the ratio is
    within noise and why, where they printed it as a fact."""
    a, b = tmp_path / "a", tmp_path / "b"
    _run(a)
    _run(b, "method=zo-offload")
    for d, other in ((a, 5.0), (b, 80.0)):
        path = d / "run.json"
        rec = json.loads(path.read_text())
        rec["summary"]["noise"]["other_cpu_pct"] = other
        path.write_text(json.dumps(rec))
    r = subprocess.run([sys.executable, "-m", "workbench", "compare", str(a), str(b)], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    row = next(x for x in r.stdout.splitlines() if x.startswith("tokens/s (steady)"))
    assert "within noise: the load changed between the runs (other processes 5% / 80% of host " \
           "CPU)" in row, row
    html = tmp_path / "report.html"
    r = subprocess.run([sys.executable, "-m", "workbench", "report", str(a), str(b), "-o",
                        str(html)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert html.read_text().count("within noise: the load changed between the runs") >= 2
