"""Machine rates for the planner: the brief's H200 defaults, a GPU table, and ``calibrate()``.

A *profile* is a flat dict of rates (units in the key names: ``_bps`` bytes/s, ``_per_s``
elements or parameters per second, ``_flops`` FLOP/s, ``_s`` seconds, ``_bytes`` bytes). The
planner starts from a default profile and overlays what ``calibrate()`` measured on this machine.

Defaults (uncalibrated), from the brief's H200 measurements (torch 2.11, 2026-11-22):
    pinned H2D / D2H 55 GB/s each way, 101 GB/s both at once; pageable H2D 21 GB/s.
    Effective FLOP/s from "one OPT-13B block, 16x128 tokens: fp32 27 ms, bf16 2.5 ms" with the
    planner's FLOP count (2 x params x tokens + attention): about 48 TFLOP/s fp32, 520 bf16.
    AdamW: CPU 0.76 G params/s, GPU (fused) 112 G params/s.
    Perturbation: 100 G element-regenerations/s ("normal_ then add_"), for every backend that
    regenerates z on the GPU without allocating; torch.randn into a fresh tensor: 28 G/s, so
    rng=torch gets 25 G/s. The fused Triton kernel is likely faster (it is memory bound):
    calibrate to replace the conservative 100.
    Host memcpy 33 GB/s (16 threads).
Assumptions with no measurement behind them (calibrate replaces all but the last two):
    GPU memory bandwidth 3.5 TB/s (73% of the H200's 4.8 TB/s) for memory-bound ops;
    host time per block pass (Python + kernel launches) 0.3 ms; per step 2 ms (on a GPU,
    calibrate measures the host's cost per step and per block of each ZO method instead:
    ``calibration_shapes.py``, which also measures a block's FLOP/s at every OPT shape);
    CPU fp32 -> bf16 downcast 4 G params/s; the mirror codec's host pass (fp32 += bf16 delta,
    re-encode) 1.5 G params/s; torch-only philox on the GPU 3 G/s;
    reuse_buffers=false multiplies transfer time by 1 / 0.37 (the paper's ablation: 37% of the
    throughput without a reusable block buffer; our caching allocator likely does better).
The CPU profile (device=cpu) is measure-free: 50 GFLOP/s fp32, bf16 autocast half that (no
AMX assumed), 20 GB/s memory, torch philox 0.01 G/s, randn + add 0.2 G/s.

GPU table entries scale the H200 profile (peak-ratio guesses, not measurements): see GPUS.
Importing this module does not import torch.
"""
from __future__ import annotations

import json
import os
import platform
import socket
import time
from pathlib import Path
from typing import Any

from workbench.calibration_shapes import block_rates, host_costs, shape_rates
from workbench.calibration_shapes import timeit as _timeit

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
    from workbench.flops import block_flops
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


def cpu_profile() -> dict[str, Any]:
    return dict(CPU)


# --- the cache ---------------------------------------------------------------------------------
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


# --- measuring -----------------------------------------------------------------------------------
def calibrate(device: str | None = None, quick: bool = False, save: bool = True) -> dict[str, Any]:
    """Measure this machine's rates (keys as in ``H200``) and cache them.

    Args:
        device: "cuda" (default when available) or "cpu". The CPU rates (AdamW, downcast, host
            pass, memcpy) are measured either way.
        quick: smaller sizes and fewer repeats (under a minute on a CPU).
        save: write the result to the cache (``load_calibration`` reads it).
    Returns:
        The profile dict, plus ``device``, ``hostname``, ``time``, ``quick``, ``host_ram_bytes``
        and ``host_mem_available_bytes``.
    """
    import psutil
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("device: cuda was asked for but this machine has no CUDA GPU")
    vm = psutil.virtual_memory()
    out: dict[str, Any] = {"device": device, "hostname": socket.gethostname(),
                           "time": time.time(), "quick": quick, "torch": torch.__version__,
                           "method_version": METHOD_VERSION,
                           "host_ram_bytes": vm.total, "host_mem_available_bytes": vm.available,
                           "cpu_count": os.cpu_count(), "platform": platform.platform()}
    out.update(_cpu_rates(quick))
    if cuda:
        dev = torch.device("cuda")
        props = torch.cuda.get_device_properties(dev)
        out.update(gpu_name=props.name, gpu_mem_total_bytes=props.total_memory)
        out.update(_link_rates(dev, quick))
        out.update(_gpu_rates(dev, quick))
    else:
        out.update(gpu_name=None, fused_kernel=False, reuse_off_factor=1.0,
                   gpu_mem_bps=out["host_memcpy_bps"])
        out.update(_perturb_cpu(quick))
    out.update(block_rates(device, quick))
    if cuda:
        if not quick:  # every OPT preset's block shape: seconds each, up to opt-175b's 7 GB
            out.update(shape_rates(device, torch.cuda.mem_get_info(dev)[0]))
        out.update(host_costs(device, quick))
    if save:
        save_calibration(out)
    return out


def _cpu_rates(quick: bool) -> dict[str, float]:
    import torch

    n = 2 ** 22 if quick else 2 ** 25
    reps = 2 if quick else 4
    x = torch.randn(n)
    half = torch.empty(n, dtype=torch.bfloat16)
    delta = torch.randn(n).to(torch.bfloat16)
    out = {"cpu_downcast_per_s": n / _timeit(lambda: half.copy_(x), "cpu", reps)}
    out["host_update_per_s"] = n / _timeit(lambda: (x.add_(delta), half.copy_(x)), "cpu", reps)
    y = torch.empty(n)
    out["host_memcpy_bps"] = 8 * n / _timeit(lambda: y.copy_(x), "cpu", reps)  # read + write
    p = torch.nn.Parameter(torch.randn(n // 4))
    p.grad = torch.randn_like(p)
    kw = {"fused": True} if _cpu_fused_adamw() else {"foreach": True}
    opt = torch.optim.AdamW([p], lr=1e-4, **kw)
    out["adamw_cpu_per_s"] = p.numel() / _timeit(opt.step, "cpu", reps)
    return out


def _perturb_cpu(quick: bool) -> dict[str, float]:
    """The CPU perturbation paths: torch philox (rng=philox) and randn + add (rng=torch)."""
    import torch

    from workbench.engine.zo import philox

    n = 2 ** 18 if quick else 2 ** 21
    x = torch.zeros(n)
    gen = torch.Generator().manual_seed(0)
    rate = n / _timeit(lambda: x.add_(philox.normals(n, 1, 2)), "cpu", 2)
    return {"perturb_fused_per_s": rate, "perturb_philox_torch_per_s": rate,
            "perturb_torch_per_s": n / _timeit(lambda: x.add_(torch.randn(n, generator=gen)),
                                               "cpu", 3)}


def _cpu_fused_adamw() -> bool:
    import torch

    try:
        p = torch.nn.Parameter(torch.zeros(4))
        p.grad = torch.zeros(4)
        torch.optim.AdamW([p], fused=True).step()
        return True
    except (RuntimeError, TypeError):
        return False


DUPLEX_COPIES = 4  # back-to-back copies each way in one timing of both directions at once


def _link_rates(dev, quick: bool) -> dict[str, float]:
    """Pinned H2D / D2H / both at once, pageable H2D (256 MB copies), device memory bw."""
    import torch

    n = (64 if quick else 256) * 2 ** 20 // 4
    reps = 3 if quick else 8
    host = torch.empty(n, pin_memory=True)
    host2 = torch.empty(n, pin_memory=True)
    pageable = torch.empty(n)
    a, b = torch.empty(n, device=dev), torch.empty(n, device=dev)
    s1, s2 = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
    nbytes = 4 * n

    def both():  # sustained, as a step streams its blocks: one pair of copies at a time read
        # 45.5 GB/s per direction on an H100 where 1 GiB copies back to back and the engine's own
        # fp32 streaming ran at 40-41.5 (2026-11-23; why the lone pair reads more: not profiled).
        # On another H100 host this form read 39.4 where bf16-SR streaming reached 43.6: neither
        # form matched the engine on every host
        for _ in range(DUPLEX_COPIES):
            with torch.cuda.stream(s1):
                a.copy_(host, non_blocking=True)
            with torch.cuda.stream(s2):
                host2.copy_(b, non_blocking=True)

    return {
        "h2d_bps": nbytes / _timeit(lambda: a.copy_(host, non_blocking=True), "cuda", reps),
        "d2h_bps": nbytes / _timeit(lambda: host2.copy_(b, non_blocking=True), "cuda", reps),
        "duplex_bps": 2 * DUPLEX_COPIES * nbytes / _timeit(both, "cuda", reps),
        "h2d_pageable_bps": nbytes / _timeit(lambda: a.copy_(pageable), "cuda", reps),
        "gpu_mem_bps": 2 * nbytes / _timeit(lambda: b.copy_(a), "cuda", reps),
    }


def _gpu_rates(dev, quick: bool) -> dict[str, Any]:
    """Perturbation backends and GPU AdamW."""
    import torch

    n = 2 ** 24 if quick else 2 ** 27
    reps = 3 if quick else 6
    x, z = torch.zeros(n, device=dev), torch.empty(n, device=dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    out: dict[str, Any] = {
        "perturb_normal_add_per_s": n / _timeit(lambda: (z.normal_(), x.add_(z, alpha=1e-3)),
                                                "cuda", reps),
        "perturb_torch_per_s": n / _timeit(
            lambda: x.add_(torch.randn(n, generator=gen, device=dev), alpha=1e-3), "cuda", reps)}
    from workbench.engine.zo import philox

    m = n // 16
    out["perturb_philox_torch_per_s"] = m / _timeit(
        lambda: x[:m].add_(philox.normals(m, 1, 2, dev)), "cuda", 2)
    try:
        from workbench.engine.zo import kernels as zo_kernels

        def fused():
            zo_kernels.launch(x, x, None, n, 1, 0, 2, 1e-3, 0.0, 0.0, do_update=False,
                              do_perturb=True, write_x=False)
        out["perturb_fused_per_s"] = n / _timeit(fused, "cuda", reps)
        out["fused_kernel"] = True
    except Exception as e:  # Triton missing or broken: the engine falls back to the torch path
        out["fused_kernel"] = False
        out["fused_kernel_error"] = repr(e)[:300]
        out["perturb_fused_per_s"] = out["perturb_philox_torch_per_s"]
    p = torch.nn.Parameter(torch.randn(n // 2, device=dev))
    p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW([p], lr=1e-4, fused=True)
    out["adamw_gpu_per_s"] = p.numel() / _timeit(opt.step, "cuda", reps)
    return out
