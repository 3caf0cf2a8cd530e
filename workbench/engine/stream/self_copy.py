"""Snapshots of the streamed blocks' host masters: the host half of the asynchronous checkpoint
(the device half is ``engine/snapshots.py``).

A copy thread copies each streamed block's host master into its kept snapshot buffer, block by
block in the order the next step offloads them, once the block's last offload has landed,
while training goes on. The scheduler waits (``before_offload``) only before it overwrites a
block whose copy is not done yet. One thread: blocks are copied in offload order (each
``copy_`` is already multi-threaded). Pageable buffers: only this thread and the checkpoint
writer touch them.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import torch

from workbench.engine.events import OpEvent
from workbench.engine.storage import Group
from workbench.engine.device.pinned import SnapshotBuffers
from workbench.engine.timing import OpTimer


class BlockCopies:
    """Args:
        groups: every group in canonical order (streamed ones hold their host storage in
            ``flat``).
        streamed: the streamed groups' canonical indices -> their ids for the transfer and
            events (a block index, EMBED or HEAD).
        transfer: their transfer (``read_master``, ``wait_host``, ``master_dtype``).
        timer: publishes a ``self-copy`` span per block.
        buffers: the kept snapshot buffers (shared with the device half).
        landed: canonical index -> the event of its last offload (None: nothing pending).
    """

    def __init__(self, groups: list[Group], streamed: dict[int, int], transfer, timer: OpTimer,
                 buffers: SnapshotBuffers, landed: Callable[[int], object]):
        self.groups, self.streamed, self.transfer, self.timer = groups, streamed, transfer, timer
        self.buffers, self.landed = buffers, landed
        self._copier = ThreadPoolExecutor(max_workers=1, thread_name_prefix="self-copy")
        self._gates: dict[int, Future] = {}  # group -> its copy, awaited before its offload

    def _buffer(self, k: int) -> torch.Tensor:
        return self.buffers.get(("host", k), self.groups[k].layout.numel,
                                self.transfer.master_dtype, pinned=False)

    def prepare(self) -> None:
        """Allocate every buffer now and fault its pages in (setup, for a run that will
        checkpoint)."""
        for k in self.streamed:
            self._buffer(k).zero_()

    def start(self, next_step: int) -> Callable[[list], None]:
        """Start copying every streamed block (the copies overlap ``next_step``); returns the
        writer's half: ``fill(out)`` puts group k's copy at ``out[k]`` once it is done."""
        out: dict[int, torch.Tensor] = {}
        futures = []
        for k in self.streamed:
            self._gates[k] = self._copier.submit(self._copy, k, out, next_step)
            futures.append(self._gates[k])

        def fill(flats: list) -> None:
            for future in futures:
                future.result()
            for k, copy in out.items():
                flats[k] = copy

        return fill

    def before_offload(self, k: int) -> None:
        """The training thread: group k's copy (if one is running) is done before its offload
        overwrites the master."""
        gate = self._gates.pop(k, None)
        if gate is not None:
            gate.result()  # the checkpoint's self-copy of this block's half is done

    def _copy(self, k: int, out: dict, next_step: int) -> None:
        """Copy thread: group k's master into its buffer once its last offload has landed; the
        copy is published as a ``self-copy`` event of ``next_step``, the step it overlaps."""
        landed = self.landed(k)
        if landed is not None:
            landed.synchronize()  # copy thread only: the step's offload wrote the master
        self.transfer.wait_host(self.streamed[k])
        start = self.timer.now()
        buf = self._buffer(k)
        out[k] = self.transfer.read_master(self.groups[k].flat, buf)
        self.timer.bus.publish(OpEvent("self-copy", "cpu", next_step, self.streamed[k],
                                       buf.numel() * buf.element_size(), start, self.timer.now()))

    def close(self) -> None:
        """Wait for every copy; stop the thread."""
        for gate in self._gates.values():
            gate.result()
        self._copier.shutdown(wait=True)
