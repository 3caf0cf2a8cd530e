"""Planner: predict a run's memory, PCIe traffic and step time from the preset, and refuse what
cannot fit (``fit.py``). Arithmetic on the model's shape (``models/shape.py``), so it plans
opt-175b on a laptop and never imports torch; a layout the formulas do not know
(``tiny:<model_type>``, a folder of any other type) is counted on its model by ``models/``, and
its callers pass that shape in. Rates: ``rates.py`` (the brief's H200 figures, a GPU table, or
this machine's calibration). Each method family has its arithmetic in a module of its own
(``zo.py``, ``fo.py``, adapters ``lora.py``); this module runs the one the config names and adds
what every run holds.

Memory:
  ``peak_gpu_mem_bytes``: the torch allocator peak (what the run summary reports), with 32 MiB of
    cuBLAS workspace; ``nvml_gpu_mem_bytes`` adds ``CONTEXT_BYTES`` (800 MiB: context and
    libraries); no fragmentation (measured: 0.04-0.5 GB of reserved-but-free blocks).
    gpu_mem_limit_gb caps the NVML-level figure (GB = 10^9 bytes; figures here are in GiB).
  Host: the buffers that live there; pinned ones of 64 MiB and more at their exact size
    (``memory.pinned_bytes``), smaller ones rounded up to a power of two as torch's pinned
    allocator does. The save's digest and norm, and a resume, hold one group in fp32 at a
    time (plus 4 MiB of fp64 buffers). checkpoint_every > 0: a snapshot holds an fp32 copy of
    every group until it is written (pinned for GPU groups, pageable clones of streamed
    blocks). The fit check adds 3 GiB for the process (1 GiB on the CPU, without CUDA's
    libraries and context), and counts what the process already holds as available to it.
Time: a block pass takes max(FLOPs / effective FLOP/s, weight bytes / memory bandwidth), FLOPs =
  2 x params x tokens + QK^T and AV (half when causal, ``flops.py``). A step on a GPU is
  max(device time, host time); on a CPU their sum.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from workbench.config import RunConfig
from workbench.plan.flops import block_flops
from workbench.plan.fo import plan_fo
from workbench.plan.lora import frozen_stream, matrix_bytes
from workbench.plan.memory import (CONTEXT_BYTES, FINGERPRINT_SCRATCH_BYTES, WORKSPACE_BYTES,
                                   moments, pinned_bytes)
from workbench.plan.rates import profile
from workbench.plan.zo import plan_zo, weight_bytes
from workbench.models.shape import known_shape
from workbench.presets import Preset

GiB, MiB = 2 ** 30, 2 ** 20
HOST_PROCESS_BYTES = 3 * GiB  # Python, torch, CUDA libraries, transformers
HOST_PROCESS_CPU_BYTES = 1 * GiB  # without CUDA (a tiny CPU run peaks near 0.5 GiB)
SAVE_KEY = "save / resume: one group as fp32"


@dataclass(frozen=True)
class Plan:
    """Predictions for one run (bytes, seconds); ``*_breakdown``: name -> bytes."""

    method: str
    model: str
    device: str
    gpu: str | None
    params: int
    peak_gpu_mem_bytes: int
    nvml_gpu_mem_bytes: int
    gpu_param_bytes: int
    host_mem_bytes: int
    pinned_host_bytes: int
    h2d_bytes_per_step: int
    d2h_bytes_per_step: int
    pcie_bytes_per_step: int
    tokens_per_step: int
    step_seconds: float
    compute_seconds: float
    transfer_seconds: float
    tokens_per_s: float
    gpu_mem_available_bytes: int | None
    host_mem_available_bytes: int | None
    fits_gpu: bool
    fits_host: bool
    gpu_breakdown: dict
    host_breakdown: dict
    notes: tuple

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "notes": list(self.notes)}


def preset_of(model: str) -> Preset:
    """The shape of ``model`` as the cost model reads it without building anything
    (``models.shape.known_shape``: a preset, or a folder of an OPT / Llama layout)."""
    return known_shape(model)


def plan(cfg: RunConfig, gpu: str | None = None, calibration: dict | None = None, *,
         gpu_avail: int | None = None, host_avail: int | None = None,
         shape: Preset | None = None) -> Plan:
    """Predict memory, PCIe bytes and step time of ``cfg``.

    Args:
        cfg: the run (any method, preset or local folder, any knob).
        gpu: a GPU table name (``rates.GPUS``: h200, h100, a100-40gb, a100-80gb, rtx-4090,
            24gb); None: the calibration's GPU, else the H200.
        calibration: a ``calibrate/machine.py::calibrate`` result (rates, GPU and host memory).
        gpu_avail, host_avail: bytes available to the run (None: the GPU's, and the
            calibration's or this machine's available host memory).
        shape: ``cfg.model``'s shape (``models.shape.shape_of``); None: ``preset_of``, which
            knows the presets and the OPT / Llama layouts (a layout counted on its built model
            must be given: the cost model builds nothing).
    Raises:
        ConfigError: an unknown ``gpu`` (the message lists the known ones).
    """
    calib = calibration
    p, cuda, amp = shape or preset_of(cfg.model), cfg.device == "cuda", cfg.amp != "off"
    prof, notes = profile(cfg, gpu, calib)
    rows, t, masked = cfg.batch_size, cfg.seq_len, cfg.data != "synthetic"
    held = matrix_bytes(cfg)  # a frozen base held in the compute dtype is read, never cast
    held = 2 if weight_bytes(cfg) == 2 else held  # and so are mezo's half weights
    cast, wb = amp and held is None, 2 if amp and held else 10 if amp else 4
    rate, bw, proj = prof["flops_bf16" if amp else "flops_fp32"], prof["gpu_mem_bps"], \
        p.hf.get("word_embed_proj_dim", p.hidden)
    # a block runs at its own shape's measured rate where the calibration has it
    blk_rate = prof.get("block_flops_by_shape", {}).get(p.block_key(), {}).get(
        "bf16" if amp else "off", rate)
    e: dict[str, Any] = dict(
        dev={}, host={}, pinned=0, h2d=0, d2h=0, transfer=0.0, elastic=0, gpu_param_bytes=0,
        amp=amp, masked=masked, hb=4 * rows * t * p.hidden, cast=cast,
        m=moments(p, rows, t, amp, masked, cast),
        blk_flops=block_flops(p, rows, t, not masked) / blk_rate,
        blk=max(block_flops(p, rows, t, not masked) / blk_rate,
                p.block_params() * wb / bw),  # fp32 read (+ bf16 cast)
        eh=max(2 * rows * p.vocab * proj / rate, p.vocab * proj * (10 if amp else 4) / bw)
        + 12 * rows * t * p.hidden / bw)  # head on B rows (reads its weight) + embedding gather
    (plan_fo if cfg.method in ("fo", "fo-offload") else plan_zo)(cfg, p, prof, e, notes)
    if cfg.peft == "lora":
        frozen_stream(cfg, p, prof, e, notes)
    step = max(e["step"], e["host_t"]) if cuda else e["step"] + e["host_t"]
    dev, host = e["dev"], e["host"]
    if cuda:
        dev["cuBLAS workspace"] = WORKSPACE_BYTES
    else:  # everything lives in host memory
        host.update({f"{k} (device=cpu)": v for k, v in dev.items()})
        dev = {}
    if cfg.checkpoint_every > 0:  # a snapshot holds a master copy of every group until written
        nb, ne, nh, n = p.block_params(), p.embed_params(), p.head_params(), p.num_layers
        r = min(cfg.resident_blocks, n) if cfg.method in ("zo-offload", "forward-grad") else n
        pin = lambda nbytes: pinned_bytes(nbytes, cuda)  # noqa: E731
        ends = cfg.method == "zo-offload" and cfg.stream_embeddings  # with the blocks' masters
        on_gpu = (0 if ends else pin(4 * ne) + pin(4 * nh)) + r * pin(4 * nb)  # pinned
        streamed = 2 if cfg.master != "fp32" and cfg.method == "zo-offload" else 4
        host["checkpoint snapshot (master copy)"] = on_gpu + streamed * (
            (n - r) * nb + (ne + nh) * ends)
    # End of run (digest + norm) and resume: one group at a time as fp32 on the host, plus the
    # threads' fp64 buffers (``engine.groups.fingerprint``; a streamed engine decodes a block only
    # when it is reached). It was the whole model once: opt-30b was OOM-killed in its save.
    host[SAVE_KEY] = (4 * max(p.embed_params(), p.block_params(), p.head_params())
                      + FINGERPRINT_SCRATCH_BYTES)
    peak, host_bytes = sum(dev.values()), sum(host.values())
    nvml = peak + CONTEXT_BYTES if cuda else 0
    if cuda:
        gpu_avail = int(prof["gpu_mem_total_bytes"] if gpu_avail is None else gpu_avail)
        if cfg.gpu_mem_limit_gb > 0:
            gpu_avail = min(gpu_avail, int(cfg.gpu_mem_limit_gb * 1e9))
            notes.append(f"gpu_mem_limit_gb={cfg.gpu_mem_limit_gb:g} caps GPU memory at "
                         f"{cfg.gpu_mem_limit_gb * 1e9 / GiB:.2f} GiB (GB = 10^9 B)")
    if host_avail is None:
        host_avail = prof.get("host_mem_available_bytes")
    if host_avail is None:
        import psutil

        host_avail = psutil.virtual_memory().available
    if masked:
        notes.append("prompt data: planned at T = seq_len; real prompts are shorter, so the run "
                     "will use less memory and time")
    tokens = rows * t
    return Plan(cfg.method, cfg.model, cfg.device, (gpu or prof.get("gpu_name")) if cuda else None,
                p.total_params(), peak, nvml, e["gpu_param_bytes"], host_bytes, e["pinned"] * cuda,
                int(e["h2d"]), int(e["d2h"]), int(e["h2d"] + e["d2h"]), tokens, step,
                e["compute"], e["transfer"], tokens / step, gpu_avail if cuda else None, host_avail,
                not cuda or nvml - e["elastic"] <= gpu_avail,
                host_bytes + process_bytes(cfg) <= host_avail, dev, host, tuple(notes))


def process_bytes(cfg: RunConfig) -> int:
    """Host memory of the process itself, beside the plan's buffers."""
    return HOST_PROCESS_BYTES if cfg.device == "cuda" else HOST_PROCESS_CPU_BYTES
