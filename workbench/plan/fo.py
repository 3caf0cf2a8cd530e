"""The plan of the first-order methods: fo (AdamW with everything on the device) and fo-offload
(optimizer states on the host, subgroups updated on either side: ``placement.py``).

Memory. fo: fp32 params, grads, AdamW m and v, and under autocast a bf16 copy of every weight
(its cast cache keeps them for backward). fo-offload: compute weights + grads in the compute
dtype (2 B under amp, else 4), up to ``N_SLOTS`` slots of min(subgroup_size, ``SLOT_PIECE``)
elements (fp32 p, m, v, and g under amp), the gpu_resident_ratio share of p, m, v; the fp32
masters, m, v and gradients of the rest on the host, pinned. adam_state_dtype=bf16 stores m and v
in 2 B each (``STATE_BYTES``: 8 B of p, m, v a parameter instead of 12), on both sides.
Activations: what each block saves for backward (``memory.saved_activations``) and the largest
moment of a pass.
Time. fo: forward, backward (2x; 1x for adapters, whose backward is the input gradients alone),
AdamW. fo-offload: + the gradient flush (during backward; bf16 for the one-pass CPU AdamW, else
fp32: ``grad_bytes``) and the update phase as the
engine places it: ``placement.place`` from the profile's rates (B the pinned H2D rate, Ug / Uc
GPU / CPU AdamW, Dc the CPU downcast), the model's own pick for update_stride=auto (the engine
then times its candidates for a step each), the CPU side slowed by the step's DMA
(``plan/dma.py``) from the profile's ``adamw_cpu_dma_per_s`` (CPU AdamW under pinned copies
both ways) and ``adamw_cpu_dma_bps`` (their bytes/s); a profile without them (calibrated
before they were measured, or the defaults) predicts with the rate alone and a note says the
prediction ignores DMA contention. These are structural estimates.
Host memory traffic of a CPU-updated parameter (``host_traffic_per_param``): the step is bound
by it on the machines measured, so the planner says it in a note.
"""
from __future__ import annotations

import math
import os
import shutil

from workbench.config import RunConfig
from workbench.plan import dma, overlap
from workbench.plan.auto import subgroup_sizes
from workbench.plan.lora import adapter_params
from workbench.plan.fo_memory import device_parts, fitting, leaner_strides
from workbench.plan.overlap import Backward
from workbench.plan.memory import CONTEXT_BYTES, WORKSPACE_BYTES, saved_activations
from workbench.plan.placement import (NO_GPU, SITE, STATE_BYTES, PerfInputs, Placement,
                                      Subgroups, sites, state_words)
from workbench.presets import Preset


def c_compiler() -> str | None:
    """The C compiler the one-pass CPU AdamW is built with (``$CC``, else ``cc``), or None."""
    return shutil.which(os.environ.get("CC", "cc"))


def one_pass_applies(amp: str, adam_state_dtype: str) -> bool:
    """Whether the one-pass CPU AdamW can serve a run: bf16 compute weights, fp32 moments."""
    return amp == "bf16" and adam_state_dtype == "fp32"


def grad_bytes(cfg: RunConfig) -> int:
    """Bytes of a CPU-updated parameter's gradient on the link and in host memory: 2 where
    fo-offload's CPU AdamW is the one-pass kernel (``engine/fo/adamw16.py``: cpu_adamw=one-pass,
    or auto with amp=bf16, fp32 moments and a C compiler), else 4 (fp32)."""
    if cfg.cpu_adamw == "torch" or not one_pass_applies(cfg.amp, cfg.adam_state_dtype):
        return 4
    return 2 if cfg.cpu_adamw == "one-pass" or c_compiler() is not None else 4


def perf_inputs(prof: dict, word_bytes: int, adam_state_dtype: str = "fp32",
                grad: int = 4) -> PerfInputs:
    """The placement model's inputs from a machine profile (params/s): B is the pinned H2D
    rate of fp32, as the engine measures it; no downcast for fp32 compute weights; ``grad``:
    a flushed gradient's bytes."""
    return PerfInputs(prof["h2d_bps"] / 4, prof["adamw_gpu_per_s"], prof["adamw_cpu_per_s"],
                      prof["cpu_downcast_per_s"] if word_bytes < 4 else math.inf, word_bytes,
                      state_words(adam_state_dtype), grad)


def contention(prof: dict) -> dma.Contention | None:
    """The CPU update under DMA load from a profile (``plan/dma.py``), or None when it has no
    ``adamw_cpu_dma_per_s`` (then predictions take the CPU rate alone: ``dma.NOTE``). The
    load's bytes/s: ``adamw_cpu_dma_bps``, else the both-way link rate it was measured at."""
    if not prof.get("adamw_cpu_dma_per_s"):
        return None
    return dma.Contention(prof["adamw_cpu_per_s"], prof["adamw_cpu_dma_per_s"],
                          prof.get("adamw_cpu_dma_bps") or prof["duplex_bps"])


def host_traffic_per_param(adam_state_dtype: str, cpu_downcast: bool, grad: int = 4) -> int:
    """Bytes of host memory one CPU-updated parameter moves in a step: its gradient written
    by the D2H and read by AdamW (``grad`` each: 4 as fp32, 2 as bf16 for the one-pass
    kernel), AdamW reading p, m, v and writing them (8 + 4 x a moment's bytes), and the new
    weight read for the upload (4 as fp32; 16-bit when downcast on the CPU: written, then
    read by the DMA, 4, plus the fp32 re-read of a separate downcast pass, 4, which the
    one-pass kernel does not make). 36 B with fp32 moments (32 with the one-pass kernel
    uploading 16-bit weights), 28 B with bf16."""
    moment = STATE_BYTES[adam_state_dtype] // 2 - 2
    upload = (4 if grad == 2 else 8) if cpu_downcast else 4
    return 2 * grad + 8 + 4 * moment + upload


def subgroup_size(cfg: RunConfig, n_params: int) -> int:
    """The subgroup size a run starts with (auto: the first of ``plan/auto.py``'s sizes)."""
    if cfg.subgroup_size == "auto":
        return subgroup_sizes(n_params, cfg.device == "cuda")[0]
    return cfg.subgroup_size


def backward(prof: dict, seconds: float) -> Backward:
    """The backward pass (``seconds`` of compute) with the profile's link rates."""
    return Backward(seconds, prof["d2h_bps"], prof.get("duplex_bps"))


def fo_placement(cfg: RunConfig, n_params: int, prof: dict, word_bytes: int,
                 bwd: Backward | None = None) -> Placement:
    """Where fo-offload would update each subgroup of ``n_params`` with the profile's rates
    (predicted under the step's DMA where the profile says how: ``contention``; after the
    backward pass ``bwd``, given: ``plan/overlap.py``)."""
    groups = Subgroups.of(n_params, subgroup_size(cfg, n_params))
    return dma.place(perf_inputs(prof, word_bytes, cfg.adam_state_dtype, grad_bytes(cfg)), groups,
                     cfg.update_stride, cfg.gpu_resident_ratio, None, contention(prof), bwd)


def offload_parts(cfg: RunConfig, n_params: int, word: int, placed: Placement) -> dict[str, int]:
    """fo-offload's GPU bytes by part for ``placed`` (``fo_memory.device_parts``)."""
    return device_parts(n_params, word, STATE_BYTES[cfg.adam_state_dtype], placed.split,
                        subgroup_size(cfg, n_params), word == 2 and not placed.cpu_downcast,
                        grad_bytes(cfg))


def capped_placement(cfg: RunConfig, n_params: int, prof: dict, word: int, other: int,
                     model: Placement, notes: list[str], bwd: Backward | None = None) -> Placement:
    """Under ``gpu_mem_limit_gb`` (update_stride=auto): the fastest predicted of the model's
    stride and every leaner one, at each downcast site, whose parts fit the cap beside
    ``other`` bytes (activations, workspaces) and the CUDA context; the leanest if none does
    (the fit check then refuses it with that estimate)."""
    groups = Subgroups.of(n_params, subgroup_size(cfg, n_params))
    perf, c = perf_inputs(prof, word, cfg.adam_state_dtype, grad_bytes(cfg)), contention(prof)
    options = sorted((dma.place(perf, groups, k, cfg.gpu_resident_ratio, down, c, bwd)
                      for down in sites(word == 2)
                      for k in leaner_strides(model.schedule.stride, groups.count)),
                     key=lambda placed: placed.predicted_s)
    budget = int(cfg.gpu_mem_limit_gb * 1e9) - CONTEXT_BYTES - other
    parts = lambda placed: offload_parts(cfg, n_params, word, placed)  # noqa: E731
    fit = fitting(options, parts, budget)
    if fit is None:
        return min(options, key=lambda placed: sum(parts(placed).values()))
    if fit.schedule.stride != model.schedule.stride:
        notes.append(f"fo-offload: gpu_mem_limit_gb={cfg.gpu_mem_limit_gb:g} leaves room for "
                     f"{fit.split.gpu + fit.split.resident:.0%} of the parameters updated on "
                     f"the GPU (the fastest placement that fits; the model's own pick needs "
                     f"{sum(parts(model).values()) / 2**30:.1f} GiB of parameter-side buffers)")
    return fit


def plan_fo(cfg: RunConfig, p: Preset, prof: dict, e: dict, notes: list[str]) -> None:
    """First-order methods: fill e (memory parts, PCIe bytes, times)."""
    cuda, amp = cfg.device == "cuda", e["amp"]
    # Trained parameters P: with peft=lora the adapters (the frozen base: ``frozen_stream``),
    # whose backward is the input gradients alone (rank-r weight gradients are negligible).
    lora = cfg.peft == "lora"
    P, bwd = (adapter_params(cfg, p), 1) if lora else (p.total_params(), 2)
    cw = 2 if amp else 4  # compute-dtype bytes
    rr = cfg.gpu_resident_ratio if cfg.method == "fo-offload" else 1.0
    sb = STATE_BYTES[cfg.adam_state_dtype]  # p, m, v of one parameter
    act = (p.num_layers * saved_activations(p, cfg.batch_size, cfg.seq_len, amp) + e["hb"]
           + 8 * cfg.batch_size * p.vocab + 2 * e["m"]["block"])
    fwd = p.num_layers * e["blk"] + e["eh"]
    if cfg.method == "fo" or not cuda:
        e["dev"].update({"params + grads (fp32)": 8 * P, "AdamW m, v": 8 * P})
        e["dev"]["autocast weight copies"] = 2 * P * amp
        e["gpu_param_bytes"] = 4 * P * cuda
    else:
        bwd_pass = backward(prof, bwd * fwd)
        placed = fo_placement(cfg, P, prof, cw, bwd_pass)
        if cfg.gpu_mem_limit_gb > 0 and cfg.update_stride == "auto":
            placed = capped_placement(cfg, P, prof, cw, act + WORKSPACE_BYTES, placed, notes,
                                      bwd_pass)
        e["dev"].update(offload_parts(cfg, P, cw, placed))
        gb = grad_bytes(cfg)
        grads = "bf16 grads" if gb == 2 else "grads" if sb == 12 else "fp32 grads"
        key = (f"fp32 master, m, v, {grads}" if sb == 12 else
               f"fp32 master, {cfg.adam_state_dtype} m, v, {grads}")
        e["host"][key] = e["pinned"] = int((sb + gb) * (1 - rr) * P)
    e["dev"]["activations (saved + transient)"] = act
    e["compute"] = (1 + bwd) * fwd
    e["step"] = (1 + bwd) * fwd + P / prof["adamw_gpu_per_s" if cuda else "adamw_cpu_per_s"]
    if cfg.method == "fo-offload" and cuda:
        s, up = placed.split, placed.inputs.word_bytes  # bytes of a weight going up
        # interleaved: p, m, v up and down; CPU-updated: grads down, weights up
        e["h2d"], e["d2h"] = P * (sb * s.gpu + up * s.cpu), P * (sb * s.gpu + gb * s.cpu)
        e["transfer"] = max(e["h2d"], e["d2h"]) / (prof["duplex_bps"] / 2)
        # the update phase follows backward's end (it waits for the gradient flush)
        e["step"] = fwd + overlap.backward_end(placed, P, bwd_pass) + placed.predicted_s
        k = placed.schedule.stride
        where = (f"16-bit weights downcast on the {SITE[placed.cpu_downcast]}" if cw < 4
                 else "fp32 weights")
        notes.append(f"fo-offload: {s.gpu + s.resident:.0%} of the parameters updated on the "
                     f"GPU ({'all others on the CPU' if k == NO_GPU else f'stride {k}'}; "
                     f"{where}); host memory traffic "
                     f"{host_traffic_per_param(cfg.adam_state_dtype, placed.cpu_downcast, gb)} "
                     f"B per CPU-updated parameter ({cfg.adam_state_dtype} moments"
                     f"{', one-pass CPU AdamW' if gb == 2 else ''})")
        c = contention(prof)
        notes.append(f"fo-offload: {dma.NOTE}; the profile has no adamw_cpu_dma_per_s (rerun "
                     f"python -m workbench calibrate on a GPU)" if c is None else
                     f"fo-offload: the CPU update {c.slowdown:.0%} slower under the link's "
                     f"copies (calibrated), counted for the DMA each placement causes")
    e["host_t"] = prof["step_overhead_s"] + 3 * (p.num_layers + 2) * prof["launch_s"]
