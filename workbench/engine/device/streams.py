"""The engine's three CUDA streams (upload, compute, offload), or one, or none on the CPU.

On the CPU every helper is a no-op, so the schedule code runs unchanged and is tested in CI.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import ContextManager

import torch


class Streams:
    """Args:
        device: the compute device.
        overlap: three streams when True; everything on the compute stream when False.
    """

    def __init__(self, device: torch.device, overlap: bool):
        self.cuda = device.type == "cuda"
        if self.cuda:
            # Compute runs on the current stream so loss, eval and user code order with it.
            self.compute = torch.cuda.current_stream(device)
            self.upload = torch.cuda.Stream(device) if overlap else self.compute
            self.offload = torch.cuda.Stream(device) if overlap else self.compute
        else:
            self.compute = self.upload = self.offload = None

    def on(self, stream) -> ContextManager:
        """Enqueue work on ``stream`` inside the ``with`` block."""
        return torch.cuda.stream(stream) if self.cuda else nullcontext()

    def record(self, stream) -> torch.cuda.Event | None:
        """A marker others can wait on (no host involvement)."""
        if not self.cuda:
            return None
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def wait(self, stream, event: torch.cuda.Event | None) -> None:
        """Make ``stream`` wait for ``event`` on the GPU; the host does not block."""
        if self.cuda and event is not None:
            stream.wait_event(event)
