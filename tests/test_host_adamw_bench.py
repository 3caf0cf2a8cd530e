"""benchmarks/host_adamw.py and benchmarks/fo_sites.py on the CPU: every variant and placement
runs and is tabled, and the one-pass kernel's bits are checked against torch's before timing."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--device", "cpu",
                           *args], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_host_adamw_tables_every_variant_with_its_bits():
    lines = _run("host_adamw.py", "--sizes", "100003", "--reps", "2").splitlines()
    rows = [line.strip().rsplit(None, 6) for line in lines[1:]]  # the variant has spaces
    variants = ["torch", "torch+down", "adamw16", "adamw16 no out"]
    assert [(r[0], r[2]) for r in rows] == [(v, load) for load in ("False", "True")
                                            for v in variants]
    assert all(r[-1] == "True" for r in rows)  # the kernel's bits equal torch's


def test_fo_sites_steps_each_placement():
    out = _run("fo_sites.py", "--model", "tiny-opt", "--subgroup", "20000")
    rows = [line.split() for line in out.splitlines()[1:]]
    assert [(r[1], r[2]) for r in rows] == [("3", "True"), ("3", "False"), ("all-cpu", "True"),
                                            ("all-cpu", "False")]
    assert {r[0] for r in rows} == {"one-pass"}
