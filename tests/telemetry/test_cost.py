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
