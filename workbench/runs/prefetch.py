"""The next step's batch, on the device before the step begins.

The training loop copied each batch to the GPU on the compute stream as its step began. In the
zo-offload demo run on an H100 (opt-1.3b fp32, 16 x 128; read from its stream events,
whose run folder was not kept) the compute stream stood idle 6.5 ms at every step
boundary, from the head of step t until the upload of block 2 of step t + 1 had landed, while
within a step its spans ran back to back: 2.8% of the step, about zo-offload's whole gap to
MeZO. The only work queued on the compute stream there that needs the copy engines is that
batch's copy up and the losses' copy down (``engine/timing.py::Deferred``); each waits behind a
block transfer on the engine of its direction. Here step t + 1's batch is copied on a stream of
its own while step t runs, so at the boundary the compute stream only checks an event that has
long fired. (The cause is read from that timeline; the change's A/B is in docs/measurements.md.)
"""
from __future__ import annotations

from typing import Callable

import torch

#: ``load(t)`` -> (step t's batch on the host, its token count)
Load = Callable[[int], tuple[object, int]]


class BatchPrefetch:
    """Args:
        device: where the steps run (on the CPU batches are moved when asked for).
        load: step t's host batch (already this rank's shard) and its token count.

    ``get(t, ahead)`` returns step t's batch on the device and its tokens, and with ``ahead``
    starts copying step t + 1's.
    """

    def __init__(self, device: torch.device, load: Load):
        self.device, self.load = device, load
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self._next: tuple[int, object, int, torch.cuda.Event | None] | None = None

    def _copy(self, t: int) -> tuple[int, object, int, torch.cuda.Event | None]:
        host, tokens = self.load(t)
        if not self.cuda:
            return t, host.to(self.device), tokens, None
        # the copy runs on the side stream; the step's stream waits for it (``get``)
        batch = host.to(self.device, stream=self.stream)
        done = torch.cuda.Event()
        done.record(self.stream)
        return t, batch, tokens, done

    def get(self, t: int, ahead: bool) -> tuple[object, int]:
        nxt = self._next if self._next is not None and self._next[0] == t else self._copy(t)
        _, batch, tokens, done = nxt
        if done is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(done)  # the step reads the batch only once its copy has landed
            for tensor in batch.tensors():
                tensor.record_stream(current)  # made on the side stream, read on this one
        self._next = self._copy(t + 1) if ahead else None
        return batch, tokens
