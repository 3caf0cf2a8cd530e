"""Checkpoint snapshots taken without stalling the step: the one helper every ZO engine uses.

A snapshot is the paper's asynchronous checkpoint: the groups on the device (every group of
MeZO, an adapter run's adapters, a streamed run's embedding, head and resident blocks) and a
pending update's g are copied into page-locked host buffers on a side stream that the compute
stream waits for only before it next changes them (``device_copies``); the step never waits.
The buffers are kept from one snapshot to the next (``SnapshotBuffers``: a fresh page-locked
buffer costs a ``cudaHostAlloc`` and page faults in the training thread), so a snapshot is
taken only once the checkpoint writer is done with the last one. What lives in host memory (a
streamed run's blocks) the caller copies itself (``take``'s ``host``).
"""
from __future__ import annotations

from typing import Callable

import torch

from workbench.engine.checkpoint import Snapshot
from workbench.engine.groups import GroupLayout
from workbench.engine.device.pinned import SnapshotBuffers
from workbench.engine.zo.perturb import PendingUpdate, pending_dict


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


class DeviceSnapshots:
    """Args:
        device: where the groups live.
        config: the run's config, as every snapshot records it.

    Attributes: ``buffers`` (the kept host buffers; a streamed run's host copies share them).
    """

    def __init__(self, device: torch.device, config: dict):
        self.device, self.config = device, config
        self.buffers = SnapshotBuffers(device.type == "cuda")

    def _bufs(self, tensors: list[torch.Tensor], keys: list) -> list[torch.Tensor]:
        return [self.buffers.get(("device", k), t.numel(), t.dtype, pinned=True)
                for k, t in zip(keys, tensors)]

    def prepare(self, flats: dict[int, torch.Tensor], pending: int,
                state: dict[int, torch.Tensor] | None = None) -> None:
        """Allocate the buffers of ``flats`` (group index -> its device tensor), of their
        optimizer ``state`` and of a pending update's ``pending`` coefficients (0: the engine
        keeps none; else the run's queries), now (setup of a run that will checkpoint), so the
        first snapshot's step pays no allocation."""
        state = state or {}
        g = [torch.empty(pending, dtype=torch.float32)] if pending else []
        self._bufs([*flats.values(), *state.values(), *g], [*flats, *(("s", k) for k in state),
                                                            "g"])

    def take(self, next_step: int, flats: dict[int, torch.Tensor], layouts: list[GroupLayout],
             pending: PendingUpdate | None,
             host: Callable[[list], None] | None = None,
             state: dict[int, torch.Tensor] | None = None,
             host_state: list[torch.Tensor] | None = None) -> Callable[[], Snapshot]:
        """Start the copies of ``flats`` (group index in ``layouts`` -> its device tensor) and of
        ``pending``'s g; returns the function the checkpoint writer calls for the
        ``Snapshot`` (every group of ``layouts``; ``host(out)`` fills the ones not in
        ``flats``, waiting for its own copies). ``state`` (momentum / adam: the optimizer state
        of the groups on the device, copied the same way) and ``host_state`` (host copies of
        the others' state, already made; None where the group's state is in ``state``) make
        the snapshot's ``opt_state``."""
        state = state or {}
        keys = list(flats)
        skeys = [("s", k) for k in state]
        tensors = ([flats[k] for k in keys] + list(state.values())
                   + ([pending.g.reshape(-1)] if pending else []))
        bufs = self._bufs(tensors, [*keys, *skeys, "g"])
        done = device_copies(tensors, bufs, self.device)

        def make() -> Snapshot:
            if done is not None:
                done.synchronize()  # writer thread: the side-stream copies have landed
            out: list[torch.Tensor | None] = [None] * len(layouts)
            for k, buf in zip(keys, bufs):
                out[k] = buf
            if host is not None:
                host(out)
            host_g = bufs[-1] if pending is not None else None
            opt_state = None
            if state or host_state:
                opt_state = list(host_state or [None] * len(layouts))
                for k, buf in zip(state, bufs[len(keys):]):
                    opt_state[k] = buf
            return Snapshot(next_step, out, [lay.name for lay in layouts],
                            pending_dict(pending, host_g), self.config,
                            [lay.n_decay for lay in layouts], opt_state=opt_state)

        return make

    def release(self) -> None:
        self.buffers.release()
