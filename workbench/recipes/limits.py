"""GPU memory limits at run time: ``gpu_mem_limit_gb`` as a hard cap, and one line saying what
ran out. (The refusal before anything is allocated is ``planner.check_fits``.)"""
from __future__ import annotations

import torch

from workbench.config import RunConfig
from workbench.planner import CONTEXT_BYTES, GiB


def cap_gpu_memory(cfg: RunConfig, device: torch.device) -> None:
    """``gpu_mem_limit_gb`` as a hard cap on torch's allocator, leaving the CUDA context (which
    the planner counts inside the limit) outside it."""
    if device.type != "cuda" or cfg.gpu_mem_limit_gb <= 0:
        return
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = (cfg.gpu_mem_limit_gb * GiB - CONTEXT_BYTES) / total
    torch.cuda.set_per_process_memory_fraction(min(max(fraction, 1e-6), 1.0), device)


def out_of_memory_line(cfg: RunConfig, error: BaseException) -> str:
    """One line for a torch.OutOfMemoryError, naming the knob that set the limit."""
    first = (str(error).splitlines() or ["out of memory"])[0].strip()
    if len(first) > 160:
        first = first[:157] + "..."
    if cfg.gpu_mem_limit_gb > 0:
        return (f"gpu_mem_limit_gb: the run needed more GPU memory than its "
                f"{cfg.gpu_mem_limit_gb:g} GB cap ({first}); raise gpu_mem_limit_gb (0 = the "
                "whole GPU) or see what fits with python -m workbench plan")
    return (f"out of GPU memory ({first}); python -m workbench plan shows what fits (a smaller "
            "batch_size, method=zo-offload, fewer resident_blocks)")
