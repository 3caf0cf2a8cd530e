"""Machine rates for the planner: the brief's H200 defaults, a GPU table, and this machine's
calibration (measured by ``calibrate/machine.py``, cached here).

A *profile* is a flat dict of rates (units in the key names: ``_bps`` bytes/s, ``_per_s``
elements or parameters per second, ``_flops`` FLOP/s, ``_s`` seconds, ``_bytes`` bytes). The
planner starts from a default profile and overlays what ``calibrate/`` measured on this machine.

Defaults (uncalibrated), from the brief's H200 measurements (torch 2.11):
    pinned H2D / D2H 55 GB/s each way, 101 GB/s both at once; pageable H2D 21 GB/s.
    Effective FLOP/s from "one OPT-13B block, 16x128 tokens: fp32 27 ms, bf16 2.5 ms" with the
    planner's FLOP count (2 x params x tokens + attention): about 48 TFLOP/s fp32, 520 bf16.
    AdamW: CPU 0.76 G params/s, GPU (fused) 112 G params/s. No CPU AdamW rate under DMA load
    (``adamw_cpu_dma_per_s``, with ``adamw_cpu_dma_bps`` the bytes/s of the pinned copies both
    ways it ran beside: only a CUDA calibration measures it; without it an fo-offload plan
    predicts the CPU update at the rate alone and says so, ``plan/dma.py``).
    Perturbation: 100 G element-regenerations/s ("normal_ then add_"), for every backend that
    regenerates z on the GPU without allocating; torch.randn into a fresh tensor: 28 G/s, so
    rng=torch gets 25 G/s. The fused Triton kernel is likely faster (it is memory bound):
    calibrate to replace the conservative 100.
    Host memcpy 33 GB/s (16 threads).
Assumptions with no measurement behind them (calibrate replaces all but the last two):
    GPU memory bandwidth 3.5 TB/s (73% of the H200's 4.8 TB/s) for memory-bound ops;
    host time per block pass (Python + kernel launches) 0.3 ms; per step 2 ms (on a GPU,
    calibrate measures the host's cost per step and per block of each ZO method instead:
    ``calibrate/shapes.py``, which also measures a block's FLOP/s at every OPT shape);
    CPU fp32 -> bf16 downcast 4 G params/s; the mirror codec's host pass (fp32 += bf16 delta,
    re-encode) 1.5 G params/s; torch-only philox on the GPU 3 G/s;
    reuse_buffers=false multiplies transfer time by 1 / 0.37 (the paper's ablation: 37% of the
    throughput without a reusable block buffer; our caching allocator likely does better).
The CPU profile (device=cpu) is measure-free: ``CPU_FLOPS_PER_CORE`` fp32 per core the process
may use (an fp32 matmul's rate, measured: see there), bf16 autocast half that (no AMX assumed),
20 GB/s memory, torch philox 0.01 G/s, randn + add 0.2 G/s.

GPU table entries scale the H200 profile (peak-ratio guesses, not measurements): see GPUS.
Pure data and arithmetic: no torch.
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from workbench.config import ConfigError, RunConfig

GiB = 2 ** 30

#: how the GPU rates are measured; a cached calibration of an older method is flagged in plans
#: (2: block rates are the GPU's time, both-way PCIe is sustained copies)
METHOD_VERSION = 2


# The brief's OPT-13B block figure, from which the default FLOP/s follow (see _derived()).
_REF_BLOCK = ("opt-13b", 16, 128, 0.027, 0.0025)  # preset, rows, tokens per row, fp32 s, bf16 s


H200: dict[str, Any] = {
    "gpu_name": "h200", "gpu_mem_total_bytes": 139 * GiB,
    "h2d_bps": 55e9, "d2h_bps": 55e9, "duplex_bps": 101e9, "h2d_pageable_bps": 21e9,
    "gpu_mem_bps": 3.5e12, "launch_s": 3e-4, "step_overhead_s": 2e-3,
    "perturb_fused_per_s": 100e9, "perturb_torch_per_s": 25e9, "perturb_philox_torch_per_s": 3e9,
    "fused_kernel": True, "adamw_gpu_per_s": 112e9, "adamw_cpu_per_s": 0.76e9,
    "cpu_downcast_per_s": 4e9, "host_update_per_s": 1.5e9, "host_memcpy_bps": 33e9,
    "reuse_off_factor": 1 / 0.37,
}


CPU: dict[str, Any] = {
    "flops_fp32": 50e9, "flops_bf16": 25e9, "gpu_mem_bps": 20e9, "launch_s": 5e-5,
    "step_overhead_s": 1e-3, "perturb_fused_per_s": 0.01e9, "perturb_torch_per_s": 0.2e9,
    "perturb_philox_torch_per_s": 0.01e9, "fused_kernel": False, "adamw_cpu_per_s": 0.76e9,
    "adamw_gpu_per_s": 0.76e9, "cpu_downcast_per_s": 4e9, "host_update_per_s": 1.5e9,
    "host_memcpy_bps": 14e9, "reuse_off_factor": 1.0,
}


#: name -> (GPU memory, compute scale fp32, compute scale bf16, PCIe GB/s each way, memory-bw
#: scale), all relative to the H200 profile; peak-ratio guesses from public spec sheets.
GPUS: dict[str, tuple[int, float, float, float, float]] = {
    "h200": (139 * GiB, 1.0, 1.0, 55.0, 1.0),
    "h100": (80 * GiB, 1.0, 1.0, 55.0, 0.7),  # same SMs, HBM3 3.35 TB/s
    "a100-80gb": (80 * GiB, 0.29, 0.32, 25.0, 0.42),  # 19.5 / 312 TFLOP/s, PCIe 4.0
    "a100-40gb": (40 * GiB, 0.29, 0.32, 25.0, 0.32),
    "rtx-4090": (24 * GiB, 0.8, 0.17, 25.0, 0.21),  # bf16 with fp32 accumulate: 165 TFLOP/s
    # A generic 24 GiB card (RTX 3090 / A10 class): a quarter of the H200's compute, PCIe 4.0.
    "24gb": (24 * GiB, 0.25, 0.25, 25.0, 0.2),
}


def _derived() -> dict[str, float]:
    from workbench.plan.flops import block_flops
    from workbench.presets import PRESETS

    name, rows, t, s32, s16 = _REF_BLOCK
    flops = block_flops(PRESETS[name], rows, t, causal=True)
    return {"flops_fp32": flops / s32, "flops_bf16": flops / s16}


def gpu_profile(name: str) -> dict[str, Any]:
    """The H200 profile scaled to a table GPU.

    Raises:
        ValueError: for an unknown name (the message lists the known ones).
    """
    key = name.strip().lower()
    if key not in GPUS:
        raise ValueError(f"gpu: {name!r} is not known (known: {', '.join(GPUS)})")
    mem, s32, s16, pcie, bw = GPUS[key]
    prof = {**H200, **_derived()}
    prof.update(gpu_name=key, gpu_mem_total_bytes=mem, flops_fp32=prof["flops_fp32"] * s32,
                flops_bf16=prof["flops_bf16"] * s16, h2d_bps=pcie * 1e9, d2h_bps=pcie * 1e9,
                duplex_bps=pcie * 1e9 * 101 / 55, h2d_pageable_bps=pcie * 1e9 * 21 / 55,
                gpu_mem_bps=H200["gpu_mem_bps"] * bw)
    return prof


#: fp32 FLOP/s of one CPU core in the matrix products a block runs. Measured (2026-11-28, AMD
#: EPYC, torch 2.13 CPU, one thread, by process CPU time so a busy host does not lower it):
#: 89-95 GFLOP/s at the shapes of SmolLM2's and tiny-opt's blocks (256 x 576 @ 576 x 1536,
#: 1024 x 64 @ 64 x 256) and at 1024^3; taken a little under, as runs add elementwise ops.
#: The flat 50 GFLOP/s this replaced predicted the demo's CPU tokens/s at a third of the
#: measured (1,214 vs 3,455). ``calibrate --device cpu`` measures a machine's own.
CPU_FLOPS_PER_CORE = 80e9


def cpu_cores() -> int:
    """CPU cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def cpu_profile() -> dict[str, Any]:
    """``CPU`` with its compute rates for this machine's cores (``CPU_FLOPS_PER_CORE`` each)."""
    flops = CPU_FLOPS_PER_CORE * cpu_cores()
    return {**CPU, "flops_fp32": flops, "flops_bf16": flops / 2}


# --- the cache: this machine's calibration ------------------------------------------------------
def cache_path() -> Path:
    """``$WORKBENCH_CACHE/calibration.json`` (default ``~/.cache/zo-workbench``)."""
    return Path(os.environ.get("WORKBENCH_CACHE", "~/.cache/zo-workbench")).expanduser() / \
        "calibration.json"


def _machine_key(gpu_name: str) -> str:
    return f"{socket.gethostname()}|{gpu_name}"


def _read_cache() -> dict[str, Any]:
    try:
        return json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}


def load_calibration(device: str | None = None) -> dict[str, Any] | None:
    """This machine's cached calibration (the CUDA one first unless ``device`` says), or None."""
    host = socket.gethostname() + "|"
    entries = [v for k, v in _read_cache().get("machines", {}).items() if k.startswith(host)]
    if device is not None:
        entries = [e for e in entries if e.get("device") == device]
    entries.sort(key=lambda e: (e.get("device") != "cuda", -e.get("time", 0)))
    return entries[0] if entries else None


def save_calibration(result: dict[str, Any]) -> Path:
    data = _read_cache()
    data.setdefault("machines", {})[_machine_key(result.get("gpu_name") or "cpu")] = result
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(path)
    return path


# --- a plan's profile -------------------------------------------------------------------------
#: Host rates a calibration on this machine gives every profile (the GPU ones come with its GPU)
HOST_KEYS = ("adamw_cpu_per_s", "cpu_downcast_per_s", "host_update_per_s", "host_memcpy_bps",
             "host_ram_bytes", "host_mem_available_bytes", "adamw_cpu_dma_per_s",
             "adamw_cpu_dma_bps")


#: The calibrated (method, amp) pairs of ``host_costs_s`` (``calibrate/shapes.py::host_costs``)
HOST_METHODS = (("mezo", "off"), ("mezo", "bf16"), ("zo-offload", "off"), ("zo-offload", "bf16"),
                ("forward-grad", "off"), ("forward-grad", "bf16"))


def host_key(method: str, amp: bool) -> str:
    """``host_costs_s``'s key for a method and whether autocast is on ("mezo off", ...)."""
    return f"{method} {'amp' if amp else 'off'}"


def profile(cfg: RunConfig, gpu: str | None, calib: dict | None) -> tuple[dict, list[str]]:
    """The rates a plan of ``cfg`` uses, and notes on where they come from: a GPU table
    (``gpu``), this machine's calibration (``calib``) or the defaults.

    Raises:
        ConfigError: an unknown ``gpu``.
    """
    notes, calib = [], calib or {}
    host = {k: calib[k] for k in HOST_KEYS if k in calib}
    try:
        table = gpu_profile(gpu) if gpu else None
    except ValueError as e:
        raise ConfigError([str(e)]) from None
    if cfg.device == "cpu":
        if calib.get("device") != "cpu":
            notes.append("CPU rates are measure-free defaults (python -m workbench calibrate "
                         "--device cpu measures them)")
        return {**cpu_profile(), **(calib if calib.get("device") == "cpu" else host)}, notes
    if table:
        return {**table, **host}, notes
    if calib.get("device") == "cuda":
        notes.append(f"rates and GPU memory from this machine's calibration "
                     f"({calib.get('gpu_name')})")
        if calib.get("method_version", 1) < METHOD_VERSION:
            notes.append("the calibration was measured by an older method (bf16 block rates "
                         "paced by the host, both-way PCIe overstated): rerun python -m "
                         "workbench calibrate")
        return {**gpu_profile("h200"), **calib}, notes
    notes.append("uncalibrated: the brief's H200 rates and 139 GiB (pass --gpu NAME or run "
                 "python -m workbench calibrate)")
    return gpu_profile("h200"), notes
