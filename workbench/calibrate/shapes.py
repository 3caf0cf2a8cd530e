"""Calibration at model shapes: what a block's forward and a step's host work cost here.

The planner's step time is max(GPU work, host work). Three measurements feed it:

* ``block_rates``: one OPT decoder layer's forward, fp32 and bf16 autocast, at a reference shape
  (the planner's generic ``flops_fp32`` / ``flops_bf16``). On a GPU the GPU's time, not the wall
  clock's (``gpu_seconds``): timed on the wall clock, the bf16 rate at opt-350m's shape came out
  57.8 TFLOP/s against 40.1 in fp32 (H100), which we read as the layer waiting on
  the host's launches; the planner counts the host's time apart;
* ``shape_rates`` (a full calibration on a GPU): the same at every OPT preset's own block shape
  (``Preset.block_key``). One rate for every shape put opt-2.7b fp32 at 0.80x its measured step
  on an H100 while opt-1.3b and opt-6.7b were within 3%; a GEMM's and attention's
  efficiency depend on the widths and the head size (2560 and 80 there), and which of them
  slowed opt-2.7b was not profiled, so the whole layer is timed at each shape;
* ``host_costs``: the host's seconds to enqueue a whole ZO step (the batch to the device, the
  engine's step, the losses' copy back: the recipe's per-step work without its telemetry), with
  the GPU idle, at two depths of the tiny preset, fitted as per step + per block for each method
  and precision. Steps of small models are paced by it: with the constants it replaces (2 ms per
  step, a tiny block's forward per pass) opt-125m / opt-350m were predicted at 0.37-0.89x of
  their measured steps.

Every function returns profile keys (``plan/rates.py``'s cache stores them as measured).
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

from workbench.plan.rates import HOST_METHODS, host_key

HOST_DEPTHS = (4, 16)  # blocks of the tiny preset the host cost is fitted over
HOST_BATCH = (1, 8)  # rows x tokens: the GPU's work is negligible beside the host's


def timeit(fn: Callable[[], Any], device: str, reps: int) -> float:
    """Median seconds of ``fn()`` (after one warm-up), synchronised on CUDA."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def gpu_seconds(fn: Callable[[], Any], reps: int, tries: int = 4) -> float:
    """Seconds of the GPU's work in one ``fn()`` (CUDA): ``reps`` calls run back to back while
    a sleep kernel holds the stream, so the host's launches are all queued before the first
    starts and cannot pace them (a wall-clock median of a lone call times the host where its
    launches take longer than its kernels). Raises if the host could not get ahead ``tries``
    times running, each try with a sleep twice as long (also when the launch queue fills)."""
    import torch

    fn()  # warm-up: kernels chosen and loaded, allocator grown
    torch.cuda.synchronize()  # drained: the host's timing below starts from an idle GPU
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()  # the calls have run: host below is at most their enqueue time
    host = time.perf_counter() - t  # an upper bound on the host's time to enqueue reps calls
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    probe = torch.cuda.Event(enable_timing=True)
    probe.record()
    torch.cuda._sleep(1 << 20)  # torch's private spin kernel, here to learn its cycles per s
    start.record()
    torch.cuda.synchronize()  # both events have fired: their interval can be read
    cycles_per_s = (1 << 20) / (probe.elapsed_time(start) / 1e3)
    sleep = int(2 * host * cycles_per_s) + 1
    for _ in range(tries):
        torch.cuda._sleep(sleep)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        ahead = not start.query()  # the GPU had not reached the first call when the last queued
        torch.cuda.synchronize()  # the calls have run: end's time can be read
        if ahead:
            return start.elapsed_time(end) / 1e3 / reps
        sleep *= 2
    raise RuntimeError(f"gpu_seconds: the host did not get {reps} calls ahead of the GPU in "
                       f"{tries} tries (last sleep {sleep / cycles_per_s:.3f} s)")


def _layer_seconds(preset, rows: int, t: int, device: str, reps: int,
                   gpu_only: bool = True) -> dict[str, float]:
    """Seconds of one decoder layer's forward of ``preset`` over rows x t tokens, per amp: the
    GPU's time on CUDA (``gpu_seconds``) unless not ``gpu_only``, else the wall clock's."""
    import torch
    from transformers.models.opt.modeling_opt import OPTDecoderLayer

    from workbench.models.build import hf_config

    config = hf_config(preset)
    config._attn_implementation = "sdpa"
    with torch.device(device):  # initialise where it runs (fast on a GPU)
        layer = OPTDecoderLayer(config, layer_idx=0).eval()
    h = torch.randn(rows, t, preset.hidden, device=device)
    out = {}
    for amp in ("off", "bf16"):
        def fwd():
            with torch.no_grad(), torch.autocast(device, torch.bfloat16, enabled=amp != "off"):
                layer(h, attention_mask=None)
        out[amp] = gpu_seconds(fwd, reps) if device == "cuda" and gpu_only else \
            timeit(fwd, device, reps)
    del layer, h
    return out


def block_rates(device: str, quick: bool) -> dict[str, float]:
    """Effective FLOP/s of one OPT block forward at the reference shape (fp32, bf16 autocast),
    and ``launch_s``: a tiny block's forward (the host's time for one, where no cost is
    calibrated)."""
    from workbench.plan.flops import block_flops
    from workbench.presets import PRESETS

    cuda = device == "cuda"
    name = ("opt-1.3b" if quick else "opt-6.7b") if cuda else ("opt-125m" if quick else "opt-350m")
    rows, t = (16, 128) if cuda or not quick else (4, 128)
    reps = 3 if quick else 6
    secs = _layer_seconds(PRESETS[name], rows, t, device, reps)
    flops = block_flops(PRESETS[name], rows, t, causal=True)
    tiny = _layer_seconds(PRESETS["tiny-opt"], 1, 8, device, reps, gpu_only=False)  # the host's
    return {"flops_fp32": flops / secs["off"], "flops_bf16": flops / secs["bf16"],
            "launch_s": min(tiny.values())}


def shape_rates(device: str, free_bytes: int, reps: int = 4) -> dict[str, Any]:
    """``block_flops_by_shape``: {``Preset.block_key``: {"off": FLOP/s, "bf16": FLOP/s}} for
    every random-init OPT preset's block at 16 x 128 tokens, skipping a shape whose fp32 layer
    would take more than a third of ``free_bytes``."""
    from workbench.plan.flops import block_flops
    from workbench.presets import PRESETS

    out: dict[str, dict[str, float]] = {}
    for preset in sorted(PRESETS.values(), key=lambda p: p.hidden):
        key = preset.block_key()
        if (preset.family != "opt" or preset.pretrained is not None or key in out
                or 3 * 4 * preset.block_params() > free_bytes):
            continue
        secs = _layer_seconds(preset, 16, 128, device, reps)
        flops = block_flops(preset, 16, 128, causal=True)
        out[key] = {amp: flops / s for amp, s in secs.items()}
    return {"block_flops_by_shape": out}


def fit_host(seconds: dict[int, float]) -> tuple[float, float]:
    """(per step, per block) seconds of a least-squares line through {blocks: seconds}, neither
    below zero (a noisy pair cannot make a cost negative)."""
    xs, ys = list(seconds), list(seconds.values())
    if len(xs) < 2:
        raise ValueError("fit_host: needs host times at two depths or more")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    per_block = max(sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx, 0.0)
    per_step = max(my - per_block * mx, 0.0)
    return per_step, per_block


def host_step_seconds(model: str, method: str, amp: str, device: str, steps: int, *,
                      num_layers: int | None = None, telemetry: bool = False) -> float:
    """Median host seconds to enqueue one step of ``model`` (with ``num_layers`` blocks, for a
    random-init preset) at ``HOST_BATCH``, the device drained before each step, so only the
    host's work is timed (``benchmarks/block_overhead.py`` compares methods with it)."""
    import torch

    from workbench.config import RunConfig
    from workbench.data.batches import SyntheticData
    from workbench.engine import build_engine
    from workbench.engine.events import EventBus
    from workbench.engine.timing import Deferred
    from workbench.engine.warmup import warm_kernels
    from workbench.models.build import build_skeleton

    rows, t = HOST_BATCH
    cfg = RunConfig(model=model, method=method, amp=amp, device=device, batch_size=rows,
                    seq_len=t, telemetry=telemetry)
    skeleton, source = build_skeleton(model, num_layers=num_layers)
    dev = torch.device(device)
    engine = build_engine(skeleton, source, cfg, dev, EventBus())
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    data = SyntheticData(skeleton.config.vocab_size, t)
    times = []
    try:
        warm_kernels(engine)
        for k in range(steps + 3):  # 3 warm-up steps: allocator, handles, first launches
            batch = data.batch_for_step(k, rows, 0)
            sync()  # between steps only: the host's work is what is timed
            start = time.perf_counter()
            out = engine.step(batch.to(dev), k, 1e-7, 0.0)
            Deferred(out.loss, *(x for x in (out.projected_grad,) if x is not None))
            if k >= 3:
                times.append(time.perf_counter() - start)
        sync()
    finally:
        engine.close()
    return statistics.median(times)


def host_costs(device: str, quick: bool,
               methods: tuple[tuple[str, str], ...] = HOST_METHODS) -> dict[str, Any]:
    """``host_costs_s``: {``host_key``: [per step s, per block s]} fitted over
    ``HOST_DEPTHS``, and ``host_costs_raw_s`` (the median at each depth)."""
    steps = 5 if quick else 15
    costs, raw = {}, {}
    for method, amp in methods:
        secs = {n: host_step_seconds("tiny-opt", method, amp, device, steps, num_layers=n)
                for n in HOST_DEPTHS}
        key = host_key(method, amp != "off")
        costs[key] = list(fit_host(secs))
        raw[key] = {str(n): s for n, s in secs.items()}
    return {"host_costs_s": costs, "host_costs_raw_s": raw}
