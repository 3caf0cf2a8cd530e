"""Measure this machine's rates (``calibrate``) and cache them as the planner's profile
(``plan/rates.py`` holds the defaults, the GPU table and the cache; ``shapes.py`` the
measurements at model shapes). Runs torch and the engines: above the engine in the layers."""
from __future__ import annotations

import os
import platform
import socket
import time
from typing import Any

from workbench.calibrate.shapes import block_rates, host_costs, shape_rates
from workbench.calibrate.shapes import timeit as _timeit
from workbench.config import RunConfig
from workbench.plan.fit import check_fits
from workbench.plan.planner import Plan
from workbench.plan.rates import METHOD_VERSION, save_calibration


def free_gpu_bytes() -> int | None:
    """Bytes free on this process's CUDA device now (``torch.cuda.mem_get_info``), or None
    without CUDA."""
    import torch

    return torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else None


def check_fits_here(cfg: RunConfig, calibration: dict | None = None,
                    gpu: str | None = None) -> Plan:
    """``plan.fit.check_fits`` against what this machine has free now: for device=cuda without
    a ``gpu`` table, the GPU memory free at this moment.

    Raises:
        PlanError: the run would not fit (each problem with the knobs that help).
    """
    from workbench.models.shape import shape_of

    free = free_gpu_bytes() if cfg.device == "cuda" and gpu is None else None
    return check_fits(cfg, calibration, gpu, gpu_free=free, shape=shape_of(cfg.model))


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
        from workbench.config import ConfigError

        raise ConfigError(["--device: cuda was asked for but this machine has no CUDA GPU; "
                           "calibrate with --device cpu"])
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
        out.update(_cpu_under_dma(dev, quick, out))
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


def _cpu_under_dma(dev, quick: bool, rates: dict) -> dict[str, float]:
    """CPU AdamW as ``_cpu_rates`` times it, while pinned copies keep the link busy both ways
    (``calibrate/fo.py``'s ``PinnedTraffic``, as fo-offload's GPU side does in a step):
    ``adamw_cpu_dma_per_s``, and ``adamw_cpu_dma_bps`` the bytes/s the copies moved meanwhile
    (``plan/dma.py`` slows the planner's CPU update by them; ``adamw_cpu_per_s`` is alone)."""
    import torch

    from workbench.calibrate.fo import PinnedTraffic, Probe, Stopwatch, under_load

    n = (2 ** 22 if quick else 2 ** 25) // 4
    p = torch.nn.Parameter(torch.randn(n))
    p.grad = torch.randn_like(p)
    kw = {"fused": True} if _cpu_fused_adamw() else {"foreach": True}
    opt = torch.optim.AdamW([p], lr=1e-4, **kw)
    load = PinnedTraffic(dev, rates["h2d_bps"])
    est = n / rates["adamw_cpu_per_s"]
    got = under_load(Probe(n, opt.step, load=lambda: load(est)), load, Stopwatch(),
                     2 if quick else 4)
    return {"adamw_cpu_dma_per_s": got["Ucd"].per_s, "adamw_cpu_dma_bps": got["Xd"].per_s}


def _perturb_cpu(quick: bool) -> dict[str, float]:
    """The CPU perturbation paths: torch philox (rng=philox) and randn + add (rng=torch)."""
    import torch

    from workbench.engine.rng import philox

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
        # fp32 streaming ran at 40-41.5 (why the lone pair reads more: not profiled).
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
    from workbench.engine.rng import philox

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
