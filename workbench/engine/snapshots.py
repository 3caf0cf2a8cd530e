"""Checkpoint snapshots taken without stalling the step: host copies of device tensors."""
from __future__ import annotations

import torch


def device_copies(flats: list[torch.Tensor], bufs: list[torch.Tensor], device: torch.device):
    """Copy device tensors into host buffers ``bufs`` (pinned on CUDA, kept by the caller from
    one snapshot to the next) without stalling the step: on CUDA, on a side stream that the
    compute stream then waits for; returns the done event (None on the CPU)."""
    if device.type != "cuda":
        for buf, flat in zip(bufs, flats):
            buf.copy_(flat)
        return None
    compute = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(compute)  # copy the weights as the step left them
    with torch.cuda.stream(side):
        for buf, flat in zip(bufs, flats):
            buf.copy_(flat, non_blocking=True)
        done = side.record_event()
    compute.wait_event(done)  # the next step changes the weights only once they are copied
    return done
