"""benchmarks/fresh.py --processes: a configuration's median fresh process stands for it, with
every process's step and the spread kept; failed processes are left out; bad counts refused."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "fresh.py"


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark(SCRIPT)


def test_the_median_process_stands_for_the_row(bench):
    runs = [{"step_seconds": s, "tokens_per_s": 100 / s, "id": i}
            for i, s in enumerate([0.366, 0.287, 0.307, 0.2984])]
    row = bench.median_process(runs)
    assert row["id"] == 3 and row["step_seconds"] == 0.2984  # lower middle of four
    assert row["process_steps"] == [0.366, 0.287, 0.307, 0.2984] and row["processes"] == 4
    assert row["spread"] == pytest.approx((0.366 - 0.287) / 0.2984)
    odd = bench.median_process(runs[:3])
    assert odd["id"] == 2
    # the table's spread column: per process count, '-' where one process ran
    assert bench._spread(row) == "26%" and bench._spread(bench.median_process(runs[:1])) == "-"


def test_failed_processes_are_left_out(bench):
    runs = [{"error": "timed out"}, {"step_seconds": 0.3, "id": 1}, {"error": "oom"}]
    row = bench.median_process(runs)
    assert row["id"] == 1 and row["processes"] == 3 and row["process_steps"] == [0.3]
    assert bench.median_process([{"error": "a"}, {"error": "b"}]) == {"error": "a"}


def test_a_process_count_below_one_is_refused():
    r = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--processes", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--processes: 0 is below 1" in r.stderr
