"""The live dashboard's header says the run's learning health from the same record the report
reads, and a diverged run ends its auto-refresh like any finished one."""
from __future__ import annotations

import math
import random

from workbench.telemetry.health import health
from workbench.telemetry.record import RunRecord
from workbench.ui.dashboard import Dashboard


def _record(losses, status="running") -> RunRecord:
    rng = random.Random(0)
    steps = [{"step": i, "loss": v * math.exp(rng.gauss(0, 0.1)), "projected_grad": 1.0,
              "seconds": 0.1, "tokens": 64, "end": 0.1 * (i + 1)} for i, v in enumerate(losses)]
    return RunRecord(config={"method": "mezo", "model": "tiny-opt", "lr": 2e-3, "steps": 60},
                     steps=steps, status=status, path="runs/blowup")


def test_header_says_health_and_a_blow_up_gets_a_line_of_its_own():
    rec = _record([3.0] * 30)
    d = Dashboard(rec, min_interval_s=0.0)
    d.refresh(force=True)
    head = d.status.value
    assert "runs/blowup" not in head and "blowup: mezo tiny-opt" in head  # folder, then the run
    assert ">not learning</b>" in head and "title='not learning: loss" in head  # evidence on hover
    assert d.health == health(rec.snapshot())
    with rec.lock:  # the loss climbs 100x: the same record now says diverged, with what to do
        rec.steps += _record([3.0 * 10 ** (i / 5) for i in range(1, 11)]).steps
    d.refresh(force=True)
    head = d.status.value
    assert ">diverged</b>" in head and "next: lower lr 10x (to lr=2e-4)" in head
    assert head.count("diverged: loss ") == 2  # the hover text and its own line


def test_a_diverged_run_ends_the_auto_refresh():
    rec = _record([3.0] * 10, status="diverged")
    d = Dashboard(rec, min_interval_s=0.0)
    thread = d.start_auto_refresh(interval_s=0.05)
    thread.join(timeout=10)
    assert not thread.is_alive() and d.refreshes >= 1


def test_a_live_header_says_what_its_health_reads_and_waits_for_the_dev_eval():
    """The demo's settings evaluate at step 0 and at the end only. Mid-run, the header names
    its evidence and does not tell the user to raise lr 10x on a noisy ZO loss alone."""
    rec = _record([3.0] * 30)
    rec.evals = [{"step": 0, "loss": 0.9, "accuracy": 0.52, "examples": 80,
                  "metrics": {"loss": 0.9, "accuracy": 0.52}}]
    d = Dashboard(rec, min_interval_s=0.0)
    d.refresh(force=True)
    head = d.status.value
    assert ">too short to tell</b>" in head, head
    assert "(on training loss of 30 steps; one dev eval so far, at step 0 (80 examples))" in head
    assert "raise lr" not in head and "wait for the dev eval at the end (step 60)" in head
