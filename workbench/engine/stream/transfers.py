"""How a streamed block's weights live on the host and cross PCIe: one class per (master, codec).

PlainTransfer     master fp32, codec fp32: 4 B/param each way; bit-equal to MeZO.
SRTransfer        master compressed-sr: the host stores bf16/fp16 (2 B/param, half the host
                  memory); up 2 B, decoded to fp32 on the GPU; the updated fp32 weights are
                  encoded with stochastic rounding on the GPU and sent down (2 B). Unbiased:
                  an update below a bf16 ulp survives in expectation, not always. master
                  compressed: the same, rounded to nearest (an update below half an ulp is lost).
MirrorTransfer    master fp32, compressed codec: the host keeps an fp32 master and a
                  compressed mirror of it. Up: the mirror (2 B, or 1 B + scales for fp8); the
                  GPU applies the pending update on top of the decoded mirror for compute and
                  sends the update itself down (bf16, 2 B); a host thread adds it to the fp32
                  master and refreshes the mirror. Not lossless: the forward passes see the
                  mirror's rounding and each update reaches the master rounded to bf16 (0.4% of
                  its own size), but no update is lost to the master's precision, as it would be
                  in a bf16 master; at the cost of a pass over host memory per step.

All GPU-side encode / decode here runs on the stream of the transfer it belongs to. (An adapter
run's frozen base, up only and decoded on the compute stream, is ``frozen_transfer.py``'s.)
"""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Callable

import torch

from workbench.engine.codecs.wire import HALF, Codec, get_codec
from workbench.engine.events import OpEvent
from workbench.engine.groups import GroupLayout
from workbench.engine.device.pinned import HostMemory
from workbench.engine.zo.perturb import PendingUpdate, ZOOps
from workbench.engine.zo.step import ApplyUpdate, step_seed
from workbench.engine.stream.transfer import HostCopy, Extra, Stream
from workbench.engine.timing import OpTimer
from workbench.engine.device.shared_host import NodeShare
from workbench.plan.memory import SPARE_SLOTS
from workbench.plan.wire import wire_kind


class PlainTransfer:
    """fp32 master, fp32 on the wire."""

    def __init__(self, device: torch.device, timer: OpTimer, ops: ZOOps,
                 share: NodeShare | None = None):
        self.device, self.timer, self.ops = device, timer, ops
        self.cuda = device.type == "cuda"
        self.host = HostMemory(self.cuda, share)  # exact-size page-locked buffers
        self._wires: dict[str, torch.Tensor] = {}  # shared wire buffers (``slot_extra``)

    def host_storage(self, layout: GroupLayout) -> torch.Tensor:
        """Host storage for a streamed block of ``layout`` (not yet filled)."""
        return self.host.empty(layout.numel, torch.float32)

    def host_bytes(self, host: HostCopy) -> int:
        """Bytes of host memory a block's storage takes."""
        parts = host.values() if isinstance(host, dict) else [host]
        return sum(t.numel() * t.element_size() for t in parts)

    def store_fp32(self, host: torch.Tensor, flat: torch.Tensor) -> None:
        host.copy_(flat)

    def to_fp32(self, host: torch.Tensor) -> torch.Tensor:
        return host

    def reader(self, host: torch.Tensor) -> None:
        """A piece-at-a-time reader of the block for digests (``FrozenTransfer`` has one);
        None: ``to_fp32`` gives the whole block."""
        return None

    master_dtype = torch.float32  # what the host keeps, and so what a checkpoint stores

    def read_master(self, host: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The block's master weights copied into ``out`` (a reused host buffer of
        ``master_dtype``, (n,)): one pass, no conversion."""
        return out.copy_(self.to_fp32(host))

    def slot_buffers(self, n: int, shared: bool = False) -> tuple[torch.Tensor, dict]:
        """A slot of n elements (fp32, on the device) and the buffers beside it."""
        return torch.empty(n, device=self.device), self.slot_extra(n, shared)

    def slot_view(self, slot: torch.Tensor, numel: int) -> torch.Tensor:
        """What a block of ``numel`` elements uses of ``slot``."""
        return slot[:numel]

    def make_params(self, layout: GroupLayout, slot: torch.Tensor) -> list:
        """Parameter views of a block of ``layout`` in ``slot`` (the caller caches them)."""
        return layout.make_params(slot)

    def before_compute(self, host: HostCopy, slot: torch.Tensor, extra: Extra, step: int,
                       block: int, stream: Stream, released: Callable[[], None],
                       layout: GroupLayout | None = None) -> None:
        """On the compute stream before the block (of ``layout``) computes: nothing (the
        upload stream has decoded the block into its slot)."""

    def settle(self, step: int, block: int, layout: GroupLayout) -> None:
        """On the compute stream, after a pass that writes back: nothing (the slot holds the
        weights the offload sends; compute-dtype slots compute them here)."""

    def slot_extra(self, n: int, shared: bool = False) -> dict[str, torch.Tensor]:
        """Device buffers beside a slot of n elements. ``shared`` (slots allocated once): the
        wire buffers are one for all uploads and one for all offloads, since each stream runs
        its transfers in order (the next block's copy into a wire queues behind the decode or
        the copy out of it), rather than one per slot."""
        return {}

    def _wire(self, key: str, n: int, shared: bool) -> torch.Tensor:
        """A wire buffer for n elements: kept under ``key`` when ``shared``, else fresh."""
        if not shared:
            return self.codec.empty(n, self.device)
        wire = self._wires.get(key)
        if wire is None or wire.numel() < self.codec.nbytes(n):
            wire = self._wires[key] = self.codec.empty(n, self.device)
        return wire

    def updater(self, extra: dict[str, torch.Tensor], block: int) -> ApplyUpdate | None:
        """How a pending update reaches the block's uploaded weights: None, the fused update
        of ``zo/step.py`` (the weights on the device are the master's values)."""
        return None

    #: GPU slots beyond prefetch_depth: the block computing and the one whose offload still
    #: reads its slot (the copy goes straight out of the slot)
    spare_slots = SPARE_SLOTS["plain"]
    #: whether the scheduler must call ``ready(block)`` before each forward pass of a block
    #: (compute-dtype slots write the pass's weights then: ``compute_slots.py``)
    lazy = False

    def upload(self, host: HostCopy, slot: torch.Tensor, extra: Extra, step: int, block: int,
               stream: Stream, slot_ready: Callable[[], None] | None = None) -> int:
        """Host copy -> ``slot`` on ``stream``; returns the bytes moved. ``slot_ready`` makes
        the stream wait until the slot's last block is done with it (called before the first
        write to the slot)."""
        if slot_ready is not None:
            slot_ready()
        with self.timer.span("upload", "upload", stream, step, block, 4 * slot.numel()):
            slot.copy_(host, non_blocking=True)
        return 4 * slot.numel()

    def offload(self, host: HostCopy, slot: torch.Tensor, extra: Extra, step: int, block: int,
                layout: GroupLayout, stream: Stream,
                released: Callable[[], None] | None = None) -> int:
        """``slot`` -> host copy on ``stream``; returns the bytes sent. A transfer done with the
        slot before the copy is (``SRTransfer``) calls ``released`` at that point."""
        with self.timer.span("offload", "offload", stream, step, block, 4 * slot.numel()):
            host.copy_(slot, non_blocking=True)
        return 4 * slot.numel()

    def wait_host(self, block: int) -> None:
        """Host-side work on the block's storage must be done before its next upload."""

    def close(self) -> None:
        self._wires.clear()
        self.host.release()


class HalfReader:
    """A bf16 / fp16 host block's values widened to fp32 a range at a time (exact)."""

    def __init__(self, values: torch.Tensor):
        self.values, self.numel = values, values.numel()

    def read(self, lo: int, hi: int, out: torch.Tensor) -> None:
        out.copy_(self.values[lo:hi])

    def sample(self, stride: int) -> torch.Tensor:
        return self.values[::stride].float()  # only the sampled elements are widened


class SRTransfer(PlainTransfer):
    """Compressed host storage (bf16 / fp16) with stochastic rounding (``sr=False``:
    ``master=compressed``, each offload rounded to nearest instead)."""

    def __init__(self, device: torch.device, timer: OpTimer, ops: ZOOps, codec: Codec,
                 share: NodeShare | None = None, sr: bool = True):
        super().__init__(device, timer, ops, share)
        self.codec, self.sr = codec, sr
        self._offloads: tuple[int, dict[int, int]] = (-1, {})  # (step, block -> offloads so far)
        self._outside = 0  # offloads outside any step so far

    def host_storage(self, layout: GroupLayout) -> torch.Tensor:
        return self.host.empty(self.codec.nbytes(layout.numel), torch.uint8)

    def store_fp32(self, host: HostCopy, flat: torch.Tensor) -> None:
        # round to nearest (loading, not training), on flat's device: on the GPU the fp32
        # block never crosses PCIe, only its encoded bytes
        wire = host if flat.device == host.device else self.codec.empty(flat.numel(), flat.device)
        self.codec.encode(flat, wire)
        if wire is not host:
            host.copy_(wire)

    def to_fp32(self, host: HostCopy) -> torch.Tensor:
        out = torch.empty(host.numel() // 2, dtype=torch.float32)
        self.codec.decode(host, out)
        return out

    def reader(self, host: HostCopy) -> "HalfReader":
        """The block's fp32 values by range (digests never hold a decoded 66B-model block)."""
        return HalfReader(host.view(HALF[self.codec.name]))

    @property
    def master_dtype(self) -> torch.dtype:
        return HALF[self.codec.name]

    def read_master(self, host: HostCopy, out: torch.Tensor) -> torch.Tensor:
        return out.copy_(host.view(self.master_dtype))  # the bf16 / fp16 bits as they are

    def slot_extra(self, n: int, shared: bool = False) -> dict[str, torch.Tensor]:
        return {"up": self._wire("up", n, shared), "down": self._wire("down", n, shared)}

    #: the slot is free once the encode has read it (the copy goes out of the wire)
    spare_slots = SPARE_SLOTS["sr"]

    def upload(self, host: HostCopy, slot: torch.Tensor, extra: Extra, step: int, block: int,
               stream: Stream, slot_ready: Callable[[], None] | None = None) -> int:
        wire = extra["up"][:host.numel()]
        with self.timer.span("upload", "upload", stream, step, block, wire.numel()):
            wire.copy_(host, non_blocking=True)
        if slot_ready is not None:
            slot_ready()  # the copy into the wire did not need the slot; the decode does
        with self.timer.span("codec", "upload", stream, step, block, wire.numel(), "decode"):
            self.codec.decode(wire, slot)
        return wire.numel()

    def round_seed(self, step: int, block: int, layout: GroupLayout) -> int:
        """The rounding draw of this offload of ``block``: a fresh one for every offload, a
        function of (step, block, offload within the step) alone, so a resumed run rounds
        exactly as a straight one. Passes outside a step (step < 0: an eval's flush of the
        pending update) count on from their own base."""
        if step < 0:
            self._outside += 1
            step = -self._outside
        if self._offloads[0] != step:
            self._offloads = (step, {})
        k = self._offloads[1].get(block, 0)
        self._offloads[1][block] = k + 1
        return step_seed(layout.gid, 4 * step + k)

    def offload(self, host: HostCopy, slot: torch.Tensor, extra: Extra, step: int, block: int,
                layout: GroupLayout, stream: Stream,
                released: Callable[[], None] | None = None) -> int:
        wire = extra["down"][:host.numel()]
        seed = self.round_seed(step, block, layout)
        with self.timer.span("codec", "offload", stream, step, block, wire.numel(),
                             "encode-sr" if self.sr else "encode"):
            self.codec.encode(slot, wire, sr_seed=seed if self.sr else None)
        if released is not None:
            released()  # the slot has been read: the next block may decode into it
        with self.timer.span("offload", "offload", stream, step, block, wire.numel()):
            host.copy_(wire, non_blocking=True)
        return wire.numel()


class MirrorTransfer(PlainTransfer):
    """fp32 master on the host, a compressed mirror travels up, the update travels down."""

    def __init__(self, device: torch.device, timer: OpTimer, ops: ZOOps, codec: Codec):
        super().__init__(device, timer, ops)
        self.codec = codec
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="host-update")
        self._pending: dict[int, Future] = {}
        self._has_delta: set[int] = set()
        self._lock = threading.Lock()  # the training and checkpoint threads both wait here

    def host_storage(self, layout: GroupLayout) -> dict[str, torch.Tensor]:
        n = layout.numel
        return {"master": torch.empty(n, dtype=torch.float32),
                "mirror": self.host.empty(self.codec.nbytes(n), torch.uint8),
                "delta": self.host.empty(n, torch.bfloat16)}

    def store_fp32(self, host: HostCopy, flat: torch.Tensor) -> None:
        host["master"].copy_(flat)
        self.codec.encode(host["master"], host["mirror"])

    def to_fp32(self, host: HostCopy) -> torch.Tensor:
        return host["master"]

    def slot_extra(self, n: int, shared: bool = False) -> dict[str, torch.Tensor]:
        # the delta stays per slot: compute writes the next block's while this one's goes down
        return {"wire": self._wire("up", n, shared),
                "delta": torch.empty(n, dtype=torch.bfloat16, device=self.device)}

    def upload(self, host: HostCopy, slot: torch.Tensor, extra: Extra, step: int, block: int,
               stream: Stream, slot_ready: Callable[[], None] | None = None) -> int:
        mirror = host["mirror"]
        wire = extra["wire"][:mirror.numel()]
        with self.timer.span("upload", "upload", stream, step, block, wire.numel()):
            wire.copy_(mirror, non_blocking=True)
        if slot_ready is not None:
            slot_ready()  # the slot (and its delta) are needed from the decode on
        with self.timer.span("codec", "upload", stream, step, block, wire.numel(), "decode"):
            self.codec.decode(wire, slot)
        return wire.numel()

    def updater(self, extra: dict[str, torch.Tensor], block: int) -> ApplyUpdate:
        """The mirror's own update: the delta is kept to send down to the master."""
        return partial(self.apply_update, extra=extra, block=block)

    def apply_update(self, slot: torch.Tensor, layout: GroupLayout, upd: PendingUpdate,
                     extra: Extra, block: int) -> None:
        """On the compute stream: slot += delta, delta kept (bf16) to send down."""
        delta = self.ops.delta(slot, layout, upd)
        slot.add_(delta)
        extra["delta"][:slot.numel()].copy_(delta)
        self._has_delta.add(block)

    def offload(self, host: HostCopy, slot: torch.Tensor, extra: Extra, step: int, block: int,
                layout: GroupLayout, stream: Stream,
                released: Callable[[], None] | None = None) -> int:
        if block not in self._has_delta:
            return 0  # weights unchanged on the host: nothing to send
        self._has_delta.discard(block)
        n = slot.numel()
        with self.timer.span("offload", "offload", stream, step, block, 2 * n, "delta"):
            host["delta"].copy_(extra["delta"][:n], non_blocking=True)
        landed = torch.cuda.Event() if self.cuda else None
        if landed is not None:
            landed.record(stream)  # the host pass starts once the delta is in host memory
        with self._lock:
            self._pending[block] = self.pool.submit(self._host_pass, host, landed, step, block, n)
        return 2 * n

    def _host_pass(self, host: HostCopy, landed: torch.Tensor, step: int, block: int,
                   n: int) -> None:
        if landed is not None:
            landed.synchronize()  # worker thread only: the training thread never waits here
        start = self.timer.now()
        host["master"].add_(host["delta"])
        self.codec.encode(host["master"], host["mirror"])
        self.timer.bus.publish(OpEvent("host-update", "cpu", step, block, 4 * n, start,
                                       self.timer.now()))

    def wait_host(self, block: int) -> None:
        with self._lock:
            future = self._pending.get(block)
        if future is not None:
            future.result()  # the mirror must be refreshed before it is uploaded again

    def close(self) -> None:
        for block in list(self._pending):
            self.wait_host(block)
        self.pool.shutdown(wait=True)
        self._wires.clear()
        self.host.release()


def make_transfer(master: str, codec: str, device: torch.device, timer, ops: ZOOps,
                  share=None):
    """``share``: host storage shared by the ranks of a node (plain and SR transfers; the
    mirror's host thread updates a master of its own, ``distributed.from_env`` refuses it)."""
    c, kind = get_codec(codec), wire_kind(codec, master)  # the kind the cost model plans
    if kind == "plain":
        return PlainTransfer(device, timer, ops, share)
    if kind == "sr":
        return SRTransfer(device, timer, ops, c, share, sr=master == "compressed-sr")
    if share is not None:
        raise ValueError("host_share: master=fp32 with a compressed codec keeps a host master "
                         "per rank; use master=compressed-sr or host_share=false")
    return MirrorTransfer(device, timer, ops, c)
