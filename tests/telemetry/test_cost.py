"""Training cost at each eval: steps, training seconds (evals not counted), forward passes."""
from __future__ import annotations

import math

import pytest

from workbench.telemetry.cost import (Cost, costs_after, elapsed_seconds, eval_costs,
                                      forward_passes_per_step)
from workbench.telemetry.record import RunRecord

#: Step t takes 0.1 * (t + 1) s: steps 0..2 take 0.6 s, steps 0..4 take 1.5 s.
SECONDS = [0.1 * (t + 1) for t in range(6)]


def _record(config: dict, evals_at=(0, 3, 5, 6), seconds=SECONDS, info=None) -> RunRecord:
    end, steps = 0.0, []
    for t, s in enumerate(seconds):
        end += s + (2.0 if t + 1 in evals_at else 0.0)  # an eval's time is in ``end`` only
        steps.append({"step": t, "loss": 1.0, "seconds": s, "tokens": 64, "end": end})
    evals = [{"step": k, "accuracy": 0.5, "loss": 0.7, "examples": 8} for k in evals_at]
    return RunRecord(config=config, steps=steps, evals=evals, info=info or {}, status="done")


@pytest.mark.parametrize("config, per_step", [
    ({"method": "mezo"}, 2),  # queries and estimator missing: 1 query, central
    ({"method": "mezo", "queries": 1, "estimator": "central"}, 2),
    ({"method": "mezo", "queries": 4}, 8),
    ({"method": "zo-offload", "queries": 4, "estimator": "central"}, 8),
    ({"method": "mezo", "queries": 4, "estimator": "one-sided"}, 5),
    ({"method": "zo-offload", "queries": 2, "estimator": "one-sided"}, 3),
    ({"method": "forward-grad"}, 1),
    ({"method": "fo"}, 1),
    ({"method": "fo-offload"}, 1),
])
def test_forward_passes_per_step(config, per_step):
    assert forward_passes_per_step(config) == per_step


def test_an_unknown_method_has_no_forward_count():
    assert math.isnan(forward_passes_per_step({}))
    assert math.isnan(forward_passes_per_step({"method": "sgd"}))


def test_each_eval_gets_its_steps_seconds_and_forward_passes():
    rec = _record({"method": "mezo", "queries": 4})
    got = eval_costs(rec)
    assert [c.step for c in got] == [0, 3, 5, 6]
    # the sum of the steps before the eval, not the ``end`` stamp (which counts the evals)
    assert [c.seconds for c in got] == pytest.approx([0.0, 0.6, 1.5, 2.1])
    assert rec.steps[2]["end"] == pytest.approx(2.6)  # 0.6 s of steps and one 2 s eval
    assert [c.forward_passes for c in got] == [0, 24, 40, 48]


def test_one_sided_forward_grad_and_fo_runs():
    assert [c.forward_passes for c in eval_costs(
        _record({"method": "zo-offload", "queries": 4, "estimator": "one-sided"}))] == \
        [0, 15, 25, 30]
    for method in ("forward-grad", "fo", "fo-offload"):
        assert [c.forward_passes for c in eval_costs(_record({"method": method}))] == \
            [0, 3, 5, 6]


def test_data_parallel_ranks_share_the_passes_of_one_batch():
    """Two ranks each pass over half the global batch: one process's passes over all of it."""
    one = eval_costs(_record({"method": "mezo"}))
    two = eval_costs(_record({"method": "mezo"}, info={"world_size": 2}))
    assert [c.forward_passes for c in two] == [c.forward_passes for c in one] == [0, 6, 10, 12]
    assert [c.seconds for c in two] == [c.seconds for c in one]


def test_a_missing_step_time_is_unknown_from_there_on():
    rec = _record({"method": "mezo"})
    rec.steps[3]["seconds"] = None  # JSON's null for a non-finite number
    assert [c.seconds for c in eval_costs(rec)][:2] == pytest.approx([0.0, 0.6])
    assert all(math.isnan(c.seconds) for c in eval_costs(rec)[2:])
    del rec.steps[3]  # no row at all: the same
    assert math.isnan(eval_costs(rec)[2].seconds)
    # an eval past the recorded steps (a live run whose row has not arrived): unknown too
    assert math.isnan(costs_after(_record({"method": "mezo"}), [9])[0].seconds)


def test_elapsed_seconds_and_costs_after():
    assert elapsed_seconds([{"step": 1, "seconds": 2.0}, {"step": 0, "seconds": 1.0}]) == [
        0.0, 1.0, 3.0]
    assert elapsed_seconds([]) == [0.0]
    assert costs_after(RunRecord(config={"method": "fo"}), [0]) == [Cost(0, 0.0, 0.0)]


def test_the_passes_each_step_recorded_place_the_evals():
    """A rule whose passes change from step to step (counted by the rule, recorded per step)
    is placed by its rows, not by the settings' count; rows without a count (older records)
    and steps past the rows use the settings'."""
    rec = _record({"method": "mezo", "queries": 4})  # the settings say 8 a step
    for row, n in zip(rec.steps, [9, 9, 9, 3, 3, 3]):
        row["forward_passes"] = n
    assert [c.forward_passes for c in eval_costs(rec)] == [0, 27, 33, 36]
    assert costs_after(rec, [8])[0].forward_passes == 36 + 2 * 8  # steps 6, 7: 8 each
    del rec.steps[4]["forward_passes"]  # a row from before rows carried it: the settings' 8
    assert [c.forward_passes for c in eval_costs(rec)] == [0, 27, 38, 41]


SLOW = pytest.mark.slow  # a CLI run each: one stays in the fast suite


@pytest.mark.parametrize("sets, per_step", [
    (("method=mezo", "queries=2"), 4),
    pytest.param(("method=mezo", "queries=3", "estimator=one-sided"), 4, marks=SLOW),
    pytest.param(("method=zo-offload",), 2, marks=SLOW),
    pytest.param(("method=forward-grad",), 1, marks=SLOW),
    pytest.param(("method=fo",), 1, marks=SLOW),
])
def test_a_run_records_each_steps_forward_passes(tmp_path, sets, per_step):
    """Through the CLI: run.json's step rows and history.jsonl carry the passes the rule ran."""
    import json
    import subprocess
    import sys

    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "workbench", "run", "--out", str(out),
                        *(a for s in ("model=tiny-opt", "steps=2", "eval_every=0",
                                      "eval_samples=8", *sets) for a in ("--set", s))],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rec = RunRecord.load(out, telemetry=False)
    assert [s["forward_passes"] for s in rec.steps] == [per_step, per_step]
    assert [c.forward_passes for c in eval_costs(rec)] == [0, 2 * per_step]
    assert json.loads((out / "run.json").read_text())["steps"][0]["forward_passes"] == per_step
