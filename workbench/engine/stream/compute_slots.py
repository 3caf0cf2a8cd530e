"""Compute-dtype block slots (``slot_dtype=compute``): a streamed block's master crosses PCIe and
sits in its GPU slot as the host keeps it (bf16 / fp16 under master=compressed or
compressed-sr), and the block computes from one shared buffer in the forward's own form.

The fp32-slot path (``transfers.SRTransfer``) decodes each block into an fp32 slot, perturbs,
restores and updates it there in place, and encodes it back down; under autocast every matmul
then casts the fp32 weight to the compute dtype again, in every pass. Here the slot keeps the
2-byte master; the step's operations are recorded (``zo/chain.py``), and just before each
forward pass of the block (a forward pre-hook the scheduler registers) the chain kernel writes
the block as that pass sees it into the work buffer, matrices already in the compute dtype
(``codecs/frozen_form.py``: what autocast's cast would give, bit for bit) and the rest in fp32.
Right after the block's last pass (``settle``, on the compute stream) the same chain, run to
its end, rounds the result into the slot with the SR encoder's own draw, and the slot goes down
as it is. Every value equals the fp32-slot run's.

Per block in flight: 2 B per parameter instead of 4 (+ two 2 B wires shared by all slots), and
one work buffer in all; no decode or encode pass, no autocast cast of a weight.

A streamed head (``stream_embeddings``) is a block to this transfer: its matrix in the compute
dtype, its norm fp32. A streamed embedding's form is the fp32 rows the batch looks up
(``embed_rows.py``), filled by the token embedding's own pre-hook (``ready_rows``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from workbench.engine.codecs.frozen_form import FrozenForm
from workbench.engine.codecs.wire import HALF, Codec
from workbench.engine.events import HEAD
from workbench.engine.groups import GroupLayout
from workbench.engine.stream.embed_rows import EmbedRows
from workbench.engine.stream.transfers import SRTransfer
from workbench.engine.zo.chain import Chain, ChainRunner
from workbench.engine.zo.perturb import ZOOps
from workbench.engine.stream.transfer import HostCopy, Extra, Stream
from workbench.engine.timing import OpTimer
from workbench.engine.device.shared_host import NodeShare
from workbench.plan.memory import SPARE_SLOTS


@dataclass
class Visit:
    """A block on the device: its master in the slot, its layout, the chain recorded so far
    (None: a pass that changes nothing) and the chain length the work buffer holds (-1: none)."""

    master: torch.Tensor
    layout: GroupLayout
    chain: Chain | None = None
    filled: int = -1


class ComputeSlotTransfer(SRTransfer):
    """Args: as ``SRTransfer``, and ``compute``: the autocast dtype the matrices are held in;
    ``layouts``: the streamed units' layouts (the work buffer fits the largest form);
    ``rows``: a streamed embedding's row form (None: the embedding stays on the device)."""

    #: the block computing and the one whose offload still reads its slot (it goes down as is)
    spare_slots = SPARE_SLOTS["compute"]
    #: the scheduler calls ``ready(block)`` right before each forward pass of a block
    lazy = True

    def __init__(self, device: torch.device, timer: OpTimer, ops: ZOOps, codec: Codec,
                 compute: torch.dtype, layouts: list[GroupLayout], share: NodeShare | None = None,
                 sr: bool = True, rows: EmbedRows | None = None):
        super().__init__(device, timer, ops, codec, share, sr)
        self.compute, self.half, self.rows = compute, HALF[codec.name], rows
        self.runner = ChainRunner(ops, codec.name, sr, compute)
        self._forms: dict[tuple, FrozenForm] = {}
        size = max([self.form(lay).nbytes for lay in layouts if not self._is_rows(lay)]
                   + [rows.nbytes if rows is not None else 0])
        self.work = torch.empty(size, dtype=torch.uint8, device=device)
        self._visits: dict[int, Visit] = {}

    def _is_rows(self, layout: GroupLayout) -> bool:
        return self.rows is not None and layout is self.rows.layout

    def form(self, layout: GroupLayout) -> FrozenForm:
        """The forward's form of a block of ``layout`` (one per block shape)."""
        key = layout.signature()
        if key not in self._forms:
            self._forms[key] = FrozenForm(layout, self.compute)
        return self._forms[key]

    def slot_buffers(self, n: int, shared: bool = False) -> tuple[torch.Tensor, dict]:
        return torch.empty(self.codec.nbytes(n), dtype=torch.uint8, device=self.device), {}

    def slot_view(self, slot: torch.Tensor, numel: int) -> torch.Tensor:
        return slot[:self.codec.nbytes(numel)]

    def make_params(self, layout: GroupLayout, slot: torch.Tensor) -> list:
        """Views of the work buffer: every unit computes from it, whatever its slot."""
        if self._is_rows(layout):
            return self.rows.make_params(self.work)
        return self.form(layout).make_params(self.work)

    def upload(self, host: HostCopy, slot: torch.Tensor, extra: Extra, step: int, block: int,
               stream: Stream, slot_ready: Callable[[], None] | None = None) -> int:
        if slot_ready is not None:
            slot_ready()  # the copy overwrites the slot, which its last block's offload reads
        with self.timer.span("upload", "upload", stream, step, block, host.numel()):
            slot.copy_(host, non_blocking=True)
        return host.numel()

    def before_compute(self, host: HostCopy, slot: torch.Tensor, extra: Extra, step: int,
                       block: int, stream: Stream, released: Callable[[], None],
                       layout: GroupLayout | None = None) -> None:
        """Start the block's visit (an earlier block's is over: its offload, if any, has been
        enqueued, and it computes no more)."""
        self._visits = {block: Visit(slot.view(self.half), layout)}

    def updater(self, extra: dict[str, torch.Tensor], block: int) -> Chain:
        """The visit's chain: ``step.py`` records the step's operations through it."""
        visit = self._visits[block]
        visit.chain = Chain(self.ops)
        return visit.chain

    def ready(self, block: int) -> None:
        """On the compute stream, right before a forward pass of ``block``: the work buffer
        <- the block as the operations recorded so far leave it (once per change)."""
        visit = self._visits.get(block)
        if visit is None and block == HEAD:  # its views would read another unit's form
            raise RuntimeError("stream_embeddings: the LM head ran outside its visit")
        if visit is None:  # block 0 called outside a visit: the embedding's capture of its
            return  # inputs (``models/adapter.py``), which stops before the block computes
        ops = visit.chain.ops_list if visit.chain is not None else []
        if visit.filled == len(ops):
            return
        self.runner.fill_form(visit.master, visit.layout, ops, self.form(visit.layout),
                              self.work)
        visit.filled = len(ops)

    def ready_rows(self, block: int, args: tuple) -> tuple | None:
        """The token embedding's forward pre-hook, on the compute stream: the rows the pass
        looks up (``args[0]``: the ids) filled from the master as the operations recorded so
        far leave them; returns the args with the ids mapped to those rows (None: the whole
        table is filled and the ids stay)."""
        visit, rows = self._visits.get(block), self.rows
        if visit is None:
            raise RuntimeError("stream_embeddings: the token embedding ran outside its visit")
        ops = visit.chain.ops_list if visit.chain is not None else []
        ids = args[0]
        rows.check(ids)
        if not (rows.whole and visit.filled == len(ops)):  # rows: the ids may be new
            self.runner.fill_spans(visit.master, visit.layout, ops, rows.spans(ids, self.work))
            visit.filled = len(ops)
        return None if rows.whole else (rows.compact(ids), *args[1:])

    def settle(self, step: int, block: int, layout: GroupLayout) -> None:
        """On the compute stream, right after the block's last pass: the chain run to its end
        and rounded into the slot (the compute stream has room where PCIe sets the pace)."""
        visit = self._visits[block]
        ops = visit.chain.ops_list if visit.chain is not None else []
        seed = self.round_seed(step, block, layout)
        stream = torch.cuda.current_stream(self.device) if self.cuda else None
        with self.timer.span("codec", "compute", stream, step, block, 2 * layout.numel,
                             "chain-sr" if self.sr else "chain"):
            self.runner.write_master(visit.master, layout, ops, seed)

    def offload(self, host: HostCopy, slot: torch.Tensor, extra: Extra, step: int, block: int,
                layout: GroupLayout, stream: Stream,
                released: Callable[[], None] | None = None) -> int:
        """The slot down as it is (``settle`` has written the step into it)."""
        with self.timer.span("offload", "offload", stream, step, block, host.numel()):
            host.copy_(slot, non_blocking=True)
        return host.numel()

    def close(self) -> None:
        self._visits.clear()
        self.work = self.work[:0]
        super().close()
