"""Learning health from the record alone: synthetic curves with known answers, the scatter a ZO
loss has from batch to batch, and the advice each state gives."""
from __future__ import annotations

import math
import random

import pytest

from workbench.telemetry.health import MIN_STEPS, Health, health
from workbench.telemetry.record import RunRecord


def _rec(losses, evals=(), status="done", method="mezo", lr=1e-3, **cfg) -> RunRecord:
    steps = [{"step": i, "loss": (None if v is None or not math.isfinite(v) else v),
              "projected_grad": 0.5, "loss_plus": v, "loss_minus": (v or 0) + 0.01}
             for i, v in enumerate(losses)]
    return RunRecord(config={"method": method, "lr": lr, "eps": 1e-3, **cfg}, steps=steps,
                     evals=list(evals), status=status)


def _noisy(levels, scatter=0.3, seed=0):
    """Each step's loss: its level times a log-normal batch factor (a ZO loss's scatter)."""
    rng = random.Random(seed)
    return [lv * math.exp(rng.gauss(0, scatter)) for lv in levels]


def _evals(d0, d1, acc0=None, acc1=None, n=64, last=40):
    out = []
    for step, loss, acc in ((0, d0, acc0), (last, d1, acc1)):
        metrics = {"loss": loss, **({"accuracy": acc} if acc is not None else {})}
        out.append({"step": step, "loss": loss, "accuracy": acc, "examples": n,
                    "metrics": metrics})
    return out


def test_a_non_finite_loss_or_gradient_is_diverged_with_the_step():
    h = health(_rec([3.0] * 10 + [math.nan]))
    assert h.state == "diverged" and "step 10" in h.text and "lower lr 10x (to lr=1e-4)" in h.advice
    rec = _rec([3.0] * 10)
    rec.steps[4]["projected_grad"] = None  # NaN / inf are stored as null
    assert "projected gradient is not finite at step 4" in health(rec).text
    fo = _rec([3.0] * 10, method="fo")
    fo.steps[4]["projected_grad"] = None  # first-order methods have none: not a fault
    assert health(fo).state != "diverged"
    ended = _rec([3.0] * 3, status="diverged")
    ended.error = "diverged at step 2 (loss = nan)"
    assert health(ended).text == "diverged at step 2 (loss = nan)"  # said once, not twice
    stopped = _rec([3.0] * 5 + [30.0, 3e3, 3e5], status="diverged")  # stop_on: finite losses
    stopped.error = "diverged at step 7 (stop_on=diverged): ..."
    h = health(stopped)  # the numbers behind the stop are in its evidence
    assert h.state == "diverged" and h.evidence["steps"] == 8 and "loss_recent" in h.evidence


def test_too_short_to_tell_without_steps_or_evals():
    h = health(_rec([3.0] * (MIN_STEPS - 1)))
    assert h.state == "too short to tell" and f"at least {MIN_STEPS}" in h.advice
    # but two evals of the same dev set tell, however few the steps
    assert health(_rec([3.0] * 3, _evals(2.0, 1.7, last=3))).state == "learning"


def test_a_falling_noisy_loss_is_learning_and_a_flat_one_is_not():
    falling = _noisy([3.0 * (0.4 + 0.6 * math.exp(-t / 60)) for t in range(200)])
    h = health(_rec(falling))
    assert h.state == "learning", h.text
    assert h.evidence["loss_recent"] < 0.7 * h.evidence["loss_start"]
    flat = health(_rec(_noisy([3.0] * 200), lr=1e-9))
    assert flat.state == "not learning", flat.text
    assert "is within its noise" in flat.text
    assert flat.advice == "raise lr 10x (to lr=1e-8) or run more steps"
    assert 0.2 < flat.evidence["noise"] < 0.4  # the scatter put in (log-normal sigma 0.3)


@pytest.mark.parametrize("seed", range(60))
def test_noise_alone_is_never_called_learning_or_diverging(seed):
    """Pure batch scatter, of every size a ZO loss shows, over runs of 8 to 400 steps."""
    rng = random.Random(seed)
    n, scatter = rng.choice([8, 12, 20, 40, 100, 400]), rng.choice([0.05, 0.3, 0.6])
    h = health(_rec(_noisy([5.0] * n, scatter, seed)))
    assert h.state == "not learning", (n, scatter, h.text)


def test_a_rising_loss_is_diverging_then_diverged():
    # learns for 60 steps, then climbs 1.8x above its best: diverging
    levels = [3.0 - 1.0 * min(t, 60) / 60 for t in range(100)]
    levels = [lv if t < 70 else 2.0 * (1 + 0.8 * (t - 70) / 30) for t, lv in enumerate(levels)]
    h = health(_rec(_noisy(levels, 0.1)))
    assert h.state == "diverging", h.text
    assert "its best level" in h.text and "lower lr 3x (to lr=3.3e-4)" == h.advice
    # 14 -> 437, as the old demo did: diverged, and a 10x lower lr
    blown = [14.0 * 30 ** (t / 39) for t in range(40)]
    h = health(_rec(_noisy(blown, 0.3), lr=2e-3))
    assert h.state == "diverged" and h.advice == "lower lr 10x (to lr=2e-4)", h


def test_the_dev_set_decides_a_short_noisy_run():
    noisy = _noisy([7.0] * 40, 0.35)
    assert health(_rec(noisy)).state == "not learning"
    assert health(_rec(noisy, _evals(8.26, 7.32))).state == "learning"  # -11%
    flat = health(_rec(noisy, _evals(8.264894, 8.264875, 0.5, 0.5)))
    assert flat.state == "not learning" and "dev loss 8.265 -> 8.265" in flat.text
    assert "dev accuracy 0.500 -> 0.500" in flat.text
    up = health(_rec(noisy, _evals(8.26, 61.6)))
    assert up.state == "diverged" and "7.5x" in up.text
    # accuracy up by more than two standard errors of 400 examples: learning
    acc = health(_rec(noisy, _evals(7.0, 7.0, 0.50, 0.62, n=400)))
    assert acc.state == "learning" and "dev accuracy 0.500 -> 0.620" in acc.text
    same = health(_rec(noisy, _evals(7.0, 7.0, 0.50, 0.53, n=100)))  # 3 of 100: noise
    assert same.state == "not learning"


def test_equal_perturbed_losses_point_at_eps():
    rec = _rec(_noisy([3.0] * 40), amp="bf16")
    for s in rec.steps:
        s["loss_minus"] = s["loss_plus"]
    h = health(rec)
    assert h.state == "not learning" and h.advice.startswith("check eps: the two perturbed "
                                                             "losses were equal in 100%")


def test_health_round_trips_through_json():
    h = health(_rec(_noisy([3.0] * 40)))
    assert Health.from_dict(h.to_dict()) == h


def test_a_live_run_waiting_for_its_dev_eval_is_not_told_to_raise_lr():
    """The demo's case: 60 steps, a dev eval at step 0 and one at the end. Mid-run the noisy
    ZO loss has not moved beyond its noise: the verdict waits for the eval that will tell,
    says what it read, and advises no lr change; the same record finished without a second
    eval (nothing to come) may still say raise lr."""
    losses = _noisy([3.0] * 40, scatter=0.3, seed=3)
    first = _evals(0.9, 0.9)[:1]
    live = health(_rec(losses, first, status="running", steps=60, eval_every=0))
    assert live.state == "too short to tell", live.text
    assert "raise lr" not in live.advice and "wait for the dev eval at the end (step 60)" in \
        live.advice
    assert live.evidence["basis"] == ("the training loss of 40 steps; one dev eval so far, at "
                                      "step 0 (64 examples)")
    assert live.text.endswith(f"(based on {live.evidence['basis']})")
    every = health(_rec(losses, first, status="running", steps=60, eval_every=25))
    assert "wait for the dev eval at step 50" in every.advice
    done = health(_rec(losses, first, status="done", steps=60))
    assert done.state == "not learning" and "raise lr" in done.advice
    assert "based on the training loss of 40 steps; one dev eval" in done.text


@pytest.mark.parametrize("n, state", [(4, "not learning"), (80, "learning")])
def test_a_dev_set_of_a_few_examples_cannot_make_learning(n, state):
    """A 40-row file leaves 4 dev rows: their loss falling 7% while the training loss is flat
    and accuracy stays 0.50 is no evidence; the same drop over 80 examples is."""
    losses = _noisy([3.0] * 40, scatter=0.3, seed=5)
    h = health(_rec(losses, _evals(0.70, 0.65, 0.5, 0.5, n=n)))
    assert h.state == state, h.text
    assert f"({n} examples" in h.evidence["basis"]
    if n < 20:
        assert "over only 4 dev examples (at least 20 to count)" in h.text
        assert "too few to weigh" in h.text
    # nor a rise of a few examples diverging
    up = health(_rec(losses, _evals(0.70, 0.95, 0.5, 0.5, n=n)))
    assert up.state == ("not learning" if n < 20 else "diverging"), up.text
