"""``gpu_mem_limit_gb`` as a hard cap at run time. (The refusal before anything is allocated is
``plan.fit.check_fits``, via ``calibrate.machine.check_fits_here``; an overrun is told in one
line by ``outcome.out_of_memory_line``.)"""
from __future__ import annotations

import torch

from workbench.config import RunConfig
from workbench.plan.planner import CONTEXT_BYTES


def cap_gpu_memory(cfg: RunConfig, device: torch.device) -> None:
    """Cap torch's allocator at the limit less the CUDA context, which the planner counts inside
    the limit: going over raises torch.OutOfMemoryError instead of taking more of the GPU."""
    if device.type != "cuda" or cfg.gpu_mem_limit_gb <= 0:
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    fraction = (cfg.gpu_mem_limit_gb * 1e9 - CONTEXT_BYTES) / total  # the knob is in GB = 10^9 B
    torch.cuda.set_per_process_memory_fraction(min(max(fraction, 1e-6), 1.0), index)
