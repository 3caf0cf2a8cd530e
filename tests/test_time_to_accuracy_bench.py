"""benchmarks/time_to_accuracy.py: a two-point mini grid (mezo and fo, 2 seeds, a few steps on
the CPU) runs every configuration in its own process, side by side, and reports each
configuration over its seeds with the forward passes the runs recorded; rules compose where
their knobs do not clash; a rule the workbench cannot run is refused before anything runs."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "time_to_accuracy.py"


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark(SCRIPT)


def test_a_two_point_mini_grid_on_the_cpu(tmp_path, bench):
    out = tmp_path / "tta.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--model", "tiny-opt",
                        "--data", "embedded", "--rules", "mezo,fo", "--lrs", "mezo=1e-3",
                        "--lrs", "fo=1e-3", "--seeds", "2", "--max-steps", "4",
                        "--eval-every", "2", "--procs-per-gpu", "4", "--budget-s", "3600",
                        "--json", str(out)], capture_output=True, text=True, timeout=600,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(out.read_text())
    assert [(row["name"], row["lr"], row["summary"]["seeds"]) for row in got["rows"]] == [
        ("mezo", 1e-3, [0, 1]), ("fo", 1e-3, [0, 1])]
    for run in got["runs"]:
        assert "error" not in run and run["steps"] == 4
        per_step = 2 if run["name"] == "mezo" else 1  # as each step recorded it
        assert [(e["step"], e["forward_passes"]) for e in run["curve"]] == [
            (k, k * per_step) for k in (0, 2, 4)]
    assert {run["config"]["seed"] for run in got["runs"]} == {0, 1}
    # every run is prompted alike: the template the templates benchmark found best
    assert {(run["config"]["template"], run["config"]["label_words"])
            for run in got["runs"]} == {bench.TEMPLATES[bench.BEST]}
    best = got["rows"][0]["summary"]["best"]
    assert best["seeds"] == 2 and best["reached"] == 2
    assert "mezo" in r.stdout and "passes to 79.7%" in r.stdout


def test_rules_compose_where_their_knobs_do_not_clash(bench):
    rules = {"mezo": {}, "queries=4": {"queries": 4}, "momentum": {"zo_optimizer": "momentum"},
             "adam": {"zo_optimizer": "adam"}, "fo": {"method": "fo"},
             "one-sided": {"estimator": "one-sided", "queries": 4}}
    best = {n: 1e-5 for n in rules} | {"queries=4": 4e-5}
    got = {name: (knobs, lrs) for name, knobs, lrs in bench.compositions(rules, best)}
    assert got == {
        "queries=4+momentum": ({"queries": 4, "zo_optimizer": "momentum"}, [1e-5, 4e-5]),
        "queries=4+adam": ({"queries": 4, "zo_optimizer": "adam"}, [1e-5, 4e-5]),
        "momentum+one-sided": ({"zo_optimizer": "momentum", "estimator": "one-sided",
                                "queries": 4}, [1e-5]),
        "adam+one-sided": ({"zo_optimizer": "adam", "estimator": "one-sided", "queries": 4},
                           [1e-5])}
    # mezo adds nothing; momentum and adam clash; fo is no ZO rule; queries=4 + one-sided is
    # one-sided itself


def test_a_new_rule_by_name_and_its_knobs(bench):
    assert bench.parse_knobs("zo_optimizer=adam,queries=4,eps=1e-3,amp=bf16") == {
        "zo_optimizer": "adam", "queries": 4, "eps": 1e-3, "amp": "bf16"}


def test_a_rule_the_workbench_cannot_run_is_refused_before_any_run(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--model", "tiny-opt",
                        "--data", "embedded", "--rule", "odd=zo_optimizer=nesterov",
                        "--rules", "mezo,odd"], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("--rule odd: zo_optimizer")
    assert "grid:" not in r.stdout
    r = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--rules", "nope"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and "--rules: 'nope' is not a rule" in r.stderr
