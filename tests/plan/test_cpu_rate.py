"""The planner's measure-free CPU compute rate is a measured one: an fp32 matmul's per core,
not a flat guess a third of it."""
from __future__ import annotations

import time

import torch

from workbench.plan.rates import cpu_cores, cpu_profile


def _matmul_flops_per_core() -> float:
    """fp32 FLOP/s of one thread at SmolLM2's block shape, by process CPU time (so a busy host
    does not lower it)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(256, 576), torch.randn(576, 1536)
        for _ in range(3):
            a @ b
        reps, t = 30, time.process_time()
        for _ in range(reps):
            a @ b
        return 2 * 256 * 576 * 1536 * reps / (time.process_time() - t)
    finally:
        torch.set_num_threads(before)


def test_the_cpu_profile_is_near_this_machines_matmul_rate():
    per_core = cpu_profile()["flops_fp32"] / cpu_cores()
    measured = _matmul_flops_per_core()
    assert 0.4 <= per_core / measured <= 2.5, (per_core / 1e9, measured / 1e9)
    assert cpu_profile()["flops_bf16"] == cpu_profile()["flops_fp32"] / 2  # no AMX assumed
