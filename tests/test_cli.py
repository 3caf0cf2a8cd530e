"""``python -m workbench demo``: the main job, as a user runs it."""
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.plan.placement import NO_GPU

REPO = Path(__file__).resolve().parents[1]


def _demo(out: Path, *sets: str, timeout: float = 600) -> tuple[subprocess.CompletedProcess, float]:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "workbench", "demo", "--out", str(out), "--quiet",
                        *(a for s in sets for a in ("--set", s))], cwd=REPO, capture_output=True,
                       text=True, timeout=timeout)
    return r, time.perf_counter() - t


def _runs(out: Path) -> tuple[dict, dict]:
    return tuple(json.loads((out / m / "run.json").read_text()) for m in ("mezo", "zo-offload"))


def test_demo_on_the_cpu_trains_tiny_opt_and_reports(tmp_path):
    r, _ = _demo(tmp_path, "steps=4")
    assert r.returncode == 0, r.stderr
    mezo, off = _runs(tmp_path)
    assert mezo["config"]["model"] == off["config"]["model"] == "tiny-opt"
    assert mezo["config"]["device"] == "cpu" and mezo["config"]["data"] == "embedded"
    assert "param_digest identical across the two engines" in r.stdout
    assert "tokens/s (steady)" in r.stdout and (tmp_path / "report.html").is_file()


@pytest.mark.gpu
def test_demo_on_a_gpu_compares_a_size_where_offloading_means_something(tmp_path):
    """opt-1.3b (opt-350m under 16 GiB): both runs, builds included, under a minute, and
    zo-offload's steady tokens/s close to MeZO's (compute-bound, as real runs are)."""
    r, wall = _demo(tmp_path)
    assert r.returncode == 0, r.stderr
    mezo, off = _runs(tmp_path)
    assert mezo["config"]["model"] in ("opt-1.3b", "opt-350m")
    assert mezo["config"]["device"] == "cuda" and mezo["config"]["data"] == "synthetic"
    ratio = off["summary"]["tokens_per_s"] / mezo["summary"]["tokens_per_s"]
    print(f"demo: {wall:.0f} s, zo-offload / MeZO steady tokens/s {ratio:.3f}")
    assert ratio >= 0.9, r.stdout
    assert wall < 60, f"{wall:.0f} s"


def test_fo_offload_auto_tries_its_candidate_schedules_and_records_the_choice(tmp_path):
    """update_stride=auto (the default) from the command line: run.json records each candidate
    schedule's trial step and the one kept, and the schedule published last is the kept one."""
    out = tmp_path / "fo"
    r = subprocess.run([sys.executable, "-m", "workbench", "run", "--out", str(out), "--quiet",
                        *(a for kv in ("method=fo-offload", "amp=bf16", "steps=8",
                                       "subgroup_size=5000", "batch_size=4", "seq_len=32",
                                       "eval_samples=8", "lr=1e-3")
                          for a in ("--set", kv))],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "done" and run["config"]["update_stride"] == "auto"
    trial = run["info"]["fo_trial"]
    cands = trial["candidates"]
    assert len(cands) >= 2 and all(c["step_s"] > 0 for c in cands)
    assert {c["downcast"] for c in cands} <= {"cpu", "gpu"}
    assert cands[trial["chosen"]]["stride"] == run["info"]["fo_stride"]
    kept = cands[trial["chosen"]]
    where = ("all on the CPU" if kept["stride"] == NO_GPU else f"stride {kept['stride']}")
    assert (f"fo-offload update schedule  {where}, downcast on {kept['downcast']}, best of "
            f"{len(cands)} tried") in r.stdout
