"""When a run reached an accuracy level, and which runs are seeds of one configuration.

A dev curve is a list of evals in step order, each with its ``accuracy`` (a fraction) and the
cost spent before it (``step``, ``forward_passes``, ``train_seconds``: ``telemetry/cost.py``).

"Reached" (``reached``): the first eval at or above the level that the NEXT eval confirms (it is
at or above the level too). One eval above a level is weak evidence on a noisy dev metric (872
SST-2 examples: a standard error of ~1.4 points near 80 %), and a rule that spikes and collapses
(the one-sided rule went 77.2 % at step 500, then 66-68 %) should not count as having got
there. A level crossed only at the run's last eval has nothing to confirm it and is not
reached. ``first_at`` keeps the plain first crossing (what earlier measurements reported).
"The best" is the highest accuracy of the run, reached at its first eval with that accuracy.

Over seeds (``over_seeds``): mean and std (the sample std, n - 1) of each cost over the seeds
that reached, with how many did; a level no seed reached has no cost.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Sequence

#: Settings that do not make runs different configurations: the seed, and where and how a
#: run is recorded, stopped or placed (several seeds run side by side on different GPUs).
NOT_CONFIGURATION = ("seed", "device", "steps", "data_dir", "checkpoint_dir", "report_to",
                     "telemetry", "sample_hz", "keep_steps", "checkpoint_every", "keep_last",
                     "save_final", "digest_check_every", "stop_on", "data_changed_ok",
                     "gpu_mem_limit_gb")
#: The costs of an eval, as a curve's points carry them.
COSTS = ("step", "forward_passes", "train_seconds")


def first_at(curve: Sequence[dict[str, Any]], level: float) -> dict[str, Any] | None:
    """The first eval with ``accuracy >= level``; None if none."""
    return next((e for e in curve if e["accuracy"] >= level), None)


def reached(curve: Sequence[dict[str, Any]], level: float) -> dict[str, Any] | None:
    """The first eval with ``accuracy >= level`` whose next eval is also ``>= level`` (see the
    module docstring); None if the run never got there by that rule."""
    for here, after in zip(curve, curve[1:]):
        if here["accuracy"] >= level and after["accuracy"] >= level:
            return here
    return None


def best(curve: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The first eval with the run's highest accuracy; None for an empty curve."""
    return max(curve, key=lambda e: e["accuracy"]) if curve else None  # max keeps the first


def level_costs(curve: Sequence[dict[str, Any]], levels: Sequence[float]
                ) -> dict[str, dict[str, Any] | None]:
    """Per level (keyed ``"75.0%"``) the costs at which it was reached (``reached``), then
    ``"best"``: the best accuracy and the costs at its eval. None where not reached."""
    out: dict[str, dict[str, Any] | None] = {}
    for level in levels:
        hit = reached(curve, level)
        out[f"{level:.1%}"] = None if hit is None else {k: hit[k] for k in COSTS}
    top = best(curve)
    out["best"] = None if top is None else {"accuracy": top["accuracy"],
                                            **{k: top[k] for k in COSTS}}
    return out


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """(mean, sample std) of ``values``; std 0 for one value, both NaN for none."""
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def over_seeds(per_seed: Sequence[dict[str, dict[str, Any] | None]]) -> dict[str, Any]:
    """``level_costs`` of each seed -> per key: ``{"reached": k, "seeds": n, cost: (mean,
    std), ...}`` over the k seeds that reached it (best: its accuracy too)."""
    out: dict[str, Any] = {}
    keys = list(dict.fromkeys(k for s in per_seed for k in s))
    for key in keys:
        hits = [s[key] for s in per_seed if s.get(key) is not None]
        line: dict[str, Any] = {"reached": len(hits), "seeds": len(per_seed)}
        for cost in (*COSTS, "accuracy") if key == "best" else COSTS:
            line[cost] = mean_std([float(h[cost]) for h in hits])
        out[key] = line
    return out


def configuration(config: dict[str, Any]) -> tuple:
    """What makes runs one configuration: their settings but ``NOT_CONFIGURATION``."""
    return tuple(sorted((k, repr(v)) for k, v in config.items() if k not in NOT_CONFIGURATION))


def seed_groups(configs: Sequence[dict[str, Any]]) -> list[list[int]]:
    """Indices of ``configs`` grouped into configurations (in order of first appearance); a
    run joins a group only with a seed no member has (a repeated seed is a repeat, drawn on its
    own). Empty configs (unknown settings) stay alone."""
    groups: list[list[int]] = []
    keys: list[tuple] = []
    for i, c in enumerate(configs):
        key = configuration(c) if c else None
        home = next((g for g, k in zip(groups, keys) if key is not None and k == key
                     and all(configs[j].get("seed", 0) != c.get("seed", 0) for j in g)), None)
        if home is None:
            groups.append([i])
            keys.append(key)
        else:
            home.append(i)
    return groups
