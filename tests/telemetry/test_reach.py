"""Passes, seconds and steps to an accuracy level on synthetic dev curves: a level is reached at
the first eval at or above it that the next eval confirms; the best is the first eval of the
highest accuracy; seeds average over those that reached; seeds of one configuration group."""
from __future__ import annotations

import math

import pytest

from workbench.telemetry.reach import (best, first_at, level_costs, mean_std, over_seeds,
                                       reached, seed_groups)


def curve(accuracies, every=100, passes_per_step=2, step_s=0.05):
    """Evals every ``every`` steps from step 0 with these accuracies."""
    return [{"step": k * every, "accuracy": a, "forward_passes": k * every * passes_per_step,
             "train_seconds": k * every * step_s} for k, a in enumerate(accuracies)]


def test_a_steady_climb_reaches_each_level_at_its_first_eval_above():
    c = curve([0.50, 0.70, 0.76, 0.78, 0.80, 0.81, 0.80])
    assert reached(c, 0.75)["step"] == 200
    assert reached(c, 0.797)["step"] == 400
    got = level_costs(c, (0.75, 0.797))
    assert got["75.0%"] == {"step": 200, "forward_passes": 400, "train_seconds": pytest.approx(10.0)}
    assert got["79.7%"]["forward_passes"] == 800
    assert got["best"] == {"accuracy": 0.81, "step": 500, "forward_passes": 1000,
                           "train_seconds": pytest.approx(25.0)}


def test_a_run_that_never_gets_there_has_no_cost():
    c = curve([0.5, 0.6, 0.7, 0.74, 0.749])
    assert reached(c, 0.75) is None and first_at(c, 0.75) is None
    assert level_costs(c, (0.75,))["75.0%"] is None
    assert level_costs(c, (0.75,))["best"]["step"] == 400
    assert level_costs([], (0.75,)) == {"75.0%": None, "best": None}


def test_a_noisy_curve_that_crosses_and_falls_back_is_reached_only_when_it_holds():
    # the one-sided rule's shape: 77 % once, then 66-68 %; later it climbs and stays
    c = curve([0.50, 0.772, 0.66, 0.68, 0.76, 0.74, 0.77, 0.79])
    assert first_at(c, 0.75)["step"] == 100  # the plain first crossing
    assert reached(c, 0.75)["step"] == 600  # 0.76 at 400 fell back at 500: not yet
    # a level crossed only at the last eval has nothing to confirm it
    assert reached(c, 0.785) is None and first_at(c, 0.785)["step"] == 700
    # exactly at the level counts (>=)
    assert reached(curve([0.5, 0.75, 0.75]), 0.75)["step"] == 100


def test_the_best_is_the_first_eval_of_the_highest_accuracy():
    c = curve([0.5, 0.8, 0.7, 0.8])
    assert best(c)["step"] == 100 and best([]) is None


def test_over_seeds_averages_the_seeds_that_reached_and_counts_them():
    seeds = [level_costs(curve(a), (0.75,)) for a in (
        [0.5, 0.76, 0.77, 0.8],   # reached at 100 (200 passes), best 0.8 at 300
        [0.5, 0.6, 0.76, 0.78],   # reached at 200 (400 passes), best 0.78 at 300
        [0.5, 0.6, 0.7, 0.72])]   # never
    got = over_seeds(seeds)
    assert got["75.0%"]["reached"] == 2 and got["75.0%"]["seeds"] == 3
    mean, std = got["75.0%"]["forward_passes"]
    assert mean == 300 and std == pytest.approx(math.sqrt(2 * 100 ** 2))  # sample std, n - 1
    assert got["best"]["reached"] == 3
    assert got["best"]["accuracy"][0] == pytest.approx((0.8 + 0.78 + 0.72) / 3)
    nobody = over_seeds([level_costs(curve([0.5, 0.6]), (0.75,))] * 2)["75.0%"]
    assert nobody["reached"] == 0 and all(math.isnan(v) for v in nobody["step"])
    assert mean_std([3.0]) == (3.0, 0.0)


def test_seeds_of_one_configuration_group_and_nothing_else_does():
    base = {"method": "mezo", "lr": 1e-5, "queries": 1, "device": "cuda"}
    configs = [{**base, "seed": 0}, {**base, "seed": 1, "device": "cuda:1"},
               {**base, "seed": 0, "lr": 2e-5}, {**base, "seed": 2},
               {**base, "seed": 1},  # a repeat of seed 1: a run of its own
               {}, {}]  # unknown settings are never alike
    assert seed_groups(configs) == [[0, 1, 3], [2], [4], [5], [6]]
