"""Learning health on real curves, through the CLI as a user meets it: the old demo's settings
(tiny-opt at lr 2e-3: the loss blows up), a sane lr that learns, a tiny lr that does nothing;
a sweep over them ranked by the dev loss; ``compare`` naming the runs by what differs; and
``stop_on=diverged`` ending the blow-up early."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: The demo as it was (issue 35): tiny-opt on the embedded set, every dev example evaluated.
DEMO = dict(model="tiny-opt", method="mezo", data="embedded", steps=40, batch_size=16,
            seq_len=64, eps=1e-3, eval_samples=0)
SETS = [a for k, v in DEMO.items() for a in ("--set", f"{k}={v}")]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # the same curves on any machine
LRS = {"2e-3": ("diverging", "diverged"), "1e-4": ("learning",), "1e-9": ("not learning",)}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench", *args], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def lr_sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("health") / "lr"
    proc = _cli("sweep", *SETS, "--sweep", "lr=2e-3,1e-4,1e-9", "--rank-by", "dev.loss",
                "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, out


def test_real_curves_say_diverged_learning_and_not_learning(lr_sweep):
    _, out = lr_sweep
    for lr, states in LRS.items():
        run = json.loads((out / f"lr-{lr}" / "run.json").read_text())
        h = run["summary"]["health"]
        assert run["status"] == "done" and h["state"] in states, (lr, h)
        ev = h["evidence"]
        assert ev["steps"] == 40 and ev["dev_loss_start"] > 0 and ev["noise"] > 0
        if lr == "2e-3":  # the blow-up: the loss far above its best, and what to do
            assert ev["loss_recent"] > 3 * ev["loss_best"], ev
            assert h["advice"].startswith("lower lr ") and "(to lr=" in h["advice"]
        elif lr == "1e-4":  # the dev loss fell (the training loss is too noisy to say)
            assert ev["dev_loss_end"] < 0.95 * ev["dev_loss_start"]
        else:  # nothing moved: the dev loss to 1e-5, the dev accuracy not at all
            assert abs(ev["dev_loss_end"] / ev["dev_loss_start"] - 1) < 1e-4
            assert ev["dev_metric_end"] == ev["dev_metric_start"]
            assert h["advice"] == "raise lr 10x (to lr=1e-8) or run more steps"


def test_the_sweep_ranks_by_the_dev_loss_with_loss_health_and_speed(lr_sweep):
    proc, out = lr_sweep
    lines = proc.stdout.splitlines()
    assert any(ln.startswith("ranked by dev loss (lower first)") for ln in lines)
    head = next(ln for ln in lines if ln.startswith("point "))
    for column in ("tokens/s", "final loss", "dev accuracy", "dev loss", "health", "vs first"):
        assert column in head
    rows = [ln for ln in lines if re.match(r"lr=\S+ ", ln)]
    assert [r.split()[0] for r in rows] == ["lr=1e-4", "lr=1e-9", "lr=2e-3"]  # as named anywhere
    manifest = json.loads((out / "sweep.json").read_text())
    for row in rows:  # the ranked number is in the table, in its own column
        point = next(p for p in manifest["points"] if p["name"] == row.split()[0])
        assert f"{point['measured']['dev']['loss']:.4f}" in row.split(), row
    assert rows[0].rstrip().endswith("best") and "learning" in rows[0]
    assert not rows[2].rstrip().endswith("within noise")  # a 7x dev loss is no tie
    assert manifest["rank_by"] == "dev.loss"
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "ranked by <b>dev loss</b>" in page and "what happened" in page
    assert "<th>dev loss</th>" in page


def test_compare_names_the_runs_by_their_folder_and_what_differs(lr_sweep, tmp_path):
    _, out = lr_sweep
    a, b = tmp_path / "a-sane-lr", tmp_path / "b-high-lr"  # folders named by the user
    shutil.copytree(out / "lr-1e-4", a)
    shutil.copytree(out / "lr-2e-3", b)
    proc = _cli("compare", str(a), str(b))
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert "a-sane-lr: mezo lr=1e-4" in first and "b-high-lr: mezo lr=2e-3" in first
    assert "settings that differ: lr 1e-4 / 2e-3" in proc.stdout
    health = proc.stdout[proc.stdout.index("health:\n"):]
    assert "a-sane-lr: mezo lr=1e-4: learning: dev loss" in health
    assert re.search(r"b-high-lr: mezo lr=2e-3: diverg(ed|ing): loss ", health)
    # a sweep's own folders repeat the settings: the label says them once
    proc = _cli("compare", str(out / "lr-1e-9"), str(a))
    assert proc.stdout.splitlines()[0].split()[1:4] == ["mezo", "lr=1e-9", "a-sane-lr:"]


def test_stop_on_diverged_ends_the_blow_up_early(tmp_path):
    out = tmp_path / "run"
    proc = _cli("run", *SETS, "--set", "lr=2e-3", "--set", "steps=80", "--set",
                "stop_on=diverged", "--out", str(out), "--quiet")
    assert proc.returncode == 1
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    assert re.match(r"error: diverged at step \d+ \(stop_on=diverged\): loss .* its best level",
                    errors[0]) and "lower lr" in errors[0]
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "diverged" and len(run["steps"]) < 80
    assert run["summary"]["health"]["state"] == "diverged"
    assert run["error"] == errors[0][len("error: "):]
    assert all(s["loss"] is not None for s in run["steps"])  # finite: stopped by health


def test_stop_on_is_a_checked_knob_with_one_name_everywhere():
    from workbench.config import ConfigError, RunConfig, knob_info, load_config
    from workbench.ui.panel import make_control

    info = knob_info("stop_on")
    assert info["choices"] == ("never", "diverged") and info["default"] == "never"
    assert "health" in info["help"]
    assert load_config(None, {"stop_on": "diverged"}).stop_on == "diverged"
    with pytest.raises(ConfigError, match="stop_on: 'nan' is not one of never, diverged"):
        RunConfig(stop_on="nan")
    control = make_control("stop_on", "never")  # the knob panel's, built from the metadata
    assert control.description == "stop_on" and list(control.options) == ["never", "diverged"]
