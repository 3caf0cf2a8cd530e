"""workbench/calibrate/shapes.py: the host-cost fit, the per-shape block rates and their use by
the planner (CPU, against hand-computed figures), and the measurements' plumbing on the CPU; on
a GPU, a full calibration has every key the planner reads."""
from __future__ import annotations

import pytest

from workbench.calibrate import shapes
from workbench.config import RunConfig
from workbench.plan.flops import block_flops
from workbench.models.build import build_skeleton
from workbench.plan.planner import plan
from workbench.presets import PRESETS

GiB = 2 ** 30
#: an H100's measured rates (planner_check-small, 2026-11-23), as a CUDA calibration
H100 = {"device": "cuda", "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_mem_total_bytes": 80 * GiB,
        "host_mem_available_bytes": 125 * GiB, "flops_fp32": 49.5e12, "flops_bf16": 445e12,
        "gpu_mem_bps": 2.78e12, "perturb_fused_per_s": 225e9, "fused_kernel": True,
        "h2d_bps": 51e9, "d2h_bps": 55e9, "duplex_bps": 91e9, "launch_s": 3.5e-4}


def test_fit_host_recovers_a_line_and_never_goes_negative():
    per_step, per_block = shapes.fit_host({4: 0.010, 16: 0.022})
    assert per_step == pytest.approx(0.006) and per_block == pytest.approx(0.001)
    per_step, per_block = shapes.fit_host({2: 0.003, 4: 0.005, 8: 0.009})  # least squares
    assert per_step == pytest.approx(0.001) and per_block == pytest.approx(0.001)
    assert shapes.fit_host({4: 0.012, 16: 0.010}) == (pytest.approx(0.011), 0.0)  # noise
    assert shapes.fit_host({4: 0.010, 16: 0.100})[0] == 0.0  # all per block, none below zero
    with pytest.raises(ValueError, match="two depths"):
        shapes.fit_host({4: 0.01})


def test_block_keys_tell_shapes_apart():
    keys = {name: p.block_key() for name, p in PRESETS.items()}
    assert keys["opt-2.7b"] == "opt 2560/10240/32"
    assert len({keys[n] for n in ("opt-125m", "opt-350m", "opt-1.3b", "opt-2.7b", "opt-6.7b",
                                  "opt-13b")}) == 6
    llama = [p for p in PRESETS.values() if p.family == "llama"
             and p.hf.get("num_key_value_heads", p.heads) != p.heads]
    for p in llama:  # grouped-query attention is part of the shape
        assert p.block_key().endswith(f"/{p.hf['num_key_value_heads']}")
    assert shapes.host_key("zo-offload", True) == "zo-offload amp"
    assert shapes.host_key("mezo", False) == "mezo off"


def _cfg(**kw) -> RunConfig:
    return RunConfig(**{"device": "cuda", "data": "synthetic", "batch_size": 16,
                        "seq_len": 128, **kw})


def test_a_block_runs_at_its_own_shapes_rate_where_calibrated():
    p = PRESETS["opt-2.7b"]
    cfg = _cfg(model="opt-2.7b", method="mezo")
    generic = plan(cfg, calibration=H100)
    slow = 0.8 * H100["flops_fp32"]
    own = plan(cfg, calibration={**H100, "block_flops_by_shape": {
        p.block_key(): {"off": slow, "bf16": H100["flops_bf16"]}}})
    # two forward passes of every block, each FLOP-bound, at the slower rate; nothing else moves
    flops = block_flops(p, 16, 128, causal=True)
    assert own.compute_seconds - generic.compute_seconds == pytest.approx(
        2 * p.num_layers * (flops / slow - flops / H100["flops_fp32"]), rel=1e-9)
    other = plan(cfg, calibration={**H100, "block_flops_by_shape": {
        PRESETS["opt-1.3b"].block_key(): {"off": slow, "bf16": slow}}})
    assert other.compute_seconds == generic.compute_seconds  # another shape's rate: unused
    amp = plan(cfg.replace(amp="bf16"), calibration={**H100, "block_flops_by_shape": {
        p.block_key(): {"off": slow, "bf16": H100["flops_bf16"]}}})
    assert amp.compute_seconds == plan(cfg.replace(amp="bf16"), calibration=H100).compute_seconds


@pytest.mark.parametrize("method", ["mezo", "zo-offload", "forward-grad"])
def test_measured_host_costs_pace_a_small_model(method):
    """opt-125m at 16 x 128 in bf16 is host-paced: the step is the measured per step + 12
    blocks x per block, the amp key's and not the fp32 one's; without them, the old constants."""
    costs = {shapes.host_key(method, True): [0.010, 0.002],
             shapes.host_key(method, False): [0.001, 0.0001]}
    cfg = _cfg(model="opt-125m", method=method, amp="bf16")
    pl = plan(cfg, calibration={**H100, "host_costs_s": costs})
    assert pl.compute_seconds < 0.034
    assert pl.step_seconds == pytest.approx(0.010 + 12 * 0.002)
    old = plan(cfg, calibration=H100)
    assert old.step_seconds != pytest.approx(pl.step_seconds)
    cpu = plan(cfg.replace(device="cpu"), calibration={**H100, "device": "cpu",
                                                       "host_costs_s": costs})
    assert cpu.step_seconds == plan(cfg.replace(device="cpu"),
                                    calibration={**H100, "device": "cpu"}).step_seconds


def test_a_tiny_preset_builds_at_any_depth_and_nothing_else_does():
    skeleton, _ = build_skeleton("tiny-opt", num_layers=9)
    assert len(skeleton.model.decoder.layers) == 9
    assert len(build_skeleton("tiny-opt")[0].model.decoder.layers) == PRESETS["tiny-opt"].num_layers
    with pytest.raises(ValueError, match="num_layers"):
        build_skeleton("smollm2-135m", num_layers=3)


def test_host_costs_and_shape_rates_measure_on_the_cpu(one_thread):
    """Plumbing only (on a CPU the host's time includes the compute): every key, positive."""
    out = shapes.host_costs("cpu", quick=True, methods=(("mezo", "off"), ("zo-offload", "off")))
    assert set(out["host_costs_s"]) == {"mezo off", "zo-offload off"}
    for key, (per_step, per_block) in out["host_costs_s"].items():
        assert per_step >= 0 and per_block >= 0 and per_step + per_block > 0, key
        raw = out["host_costs_raw_s"][key]
        assert set(raw) == {str(n) for n in shapes.HOST_DEPTHS} and min(raw.values()) > 0
    small = PRESETS["opt-125m"]
    rates = shapes.shape_rates("cpu", free_bytes=3 * 4 * small.block_params(), reps=1)
    by_shape = rates["block_flops_by_shape"]
    assert set(by_shape) == {PRESETS["tiny-opt"].block_key(), small.block_key()}
    assert all(r > 0 for rate in by_shape.values() for r in rate.values())


@pytest.mark.gpu
def test_a_full_calibration_on_the_gpu_has_what_the_planner_reads(tmp_path, monkeypatch):
    from workbench.calibrate.machine import calibrate

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    cal = calibrate("cuda", quick=False, save=False)
    assert PRESETS["opt-2.7b"].block_key() in cal["block_flops_by_shape"]
    for method, amp in shapes.HOST_METHODS:
        per_step, per_block = cal["host_costs_s"][shapes.host_key(method, amp != "off")]
        assert 0 < per_block < 0.01 and per_step < 0.1, (method, amp)
    per_step, per_block = cal["host_costs_s"]["mezo amp"]
    pl = plan(_cfg(model="opt-125m", method="mezo", amp="bf16"), calibration=cal)
    assert pl.step_seconds >= per_step + 12 * per_block  # never faster than its host
    # the GPU's time, not the host's: a bf16 layer of opt-1.3b runs well above its fp32 rate
    rate = cal["block_flops_by_shape"][PRESETS["opt-1.3b"].block_key()]
    assert rate["bf16"] > 2 * rate["off"], rate
    assert not any("older method" in n for n in pl.notes)


@pytest.mark.gpu
@pytest.mark.timing
def test_gpu_seconds_times_the_gpu_not_the_host():
    import time

    import torch

    x = torch.ones(1024, device="cuda")

    def host_heavy():  # 3 ms on the host per call, microseconds on the GPU
        time.sleep(0.003)
        x.add_(1)

    assert shapes.gpu_seconds(host_heavy, reps=5) < 0.001
    assert shapes.timeit(host_heavy, "cuda", 5) > 0.003
    a = torch.randn(4096, 4096, device="cuda")
    gpu_heavy = lambda: a @ a  # noqa: E731  milliseconds on the GPU, microseconds on the host
    assert shapes.gpu_seconds(gpu_heavy, reps=5) == pytest.approx(
        shapes.timeit(gpu_heavy, "cuda", 5), rel=0.15)


def test_a_plan_flags_a_calibration_measured_by_an_older_method():
    from workbench.plan.rates import METHOD_VERSION

    cfg = _cfg(model="opt-1.3b", method="mezo")
    old = plan(cfg, calibration=H100)  # no method_version: an older cache
    assert any("older method" in n and "calibrate" in n for n in old.notes)
    new = plan(cfg, calibration={**H100, "method_version": METHOD_VERSION})
    assert not any("older method" in n for n in new.notes)


def test_plan_on_the_command_line_reads_the_measured_costs_from_the_cache(tmp_path, monkeypatch):
    """As a user gets it: ``calibrate`` cached this machine's costs; ``plan`` for a GPU run
    predicts the host-paced opt-125m step from them, and opt-2.7b at its own shape's rate."""
    import json
    import os
    import subprocess
    import sys

    from workbench.plan import rates as calibration

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    p = PRESETS["opt-2.7b"]
    calibration.save_calibration({**H100, "time": 1.0, "host_costs_s": {"mezo amp": [0.010, 0.002]},
                                  "block_flops_by_shape": {p.block_key(): {"off": 1e12,
                                                                           "bf16": 1e12}}})

    def plan_cli(*sets):
        args = [a for s in sets for a in ("--set", s)]
        r = subprocess.run([sys.executable, "-m", "workbench", "plan", "--set", "device=cuda",
                            "--set", "method=mezo", "--set", "data=synthetic", "--set",
                            "batch_size=16", "--set", "seq_len=128", *args, "--json"],
                           capture_output=True,
                           text=True, env={**os.environ, "WORKBENCH_CACHE": str(tmp_path)})
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    assert plan_cli("model=opt-125m", "amp=bf16")["step_seconds"] == pytest.approx(0.034)
    slow = plan_cli("model=opt-2.7b")  # 1 TFLOP/s: the blocks' forwards dominate the step
    flops = block_flops(p, 16, 128, causal=True)
    assert slow["compute_seconds"] > 2 * p.num_layers * flops / 1e12
