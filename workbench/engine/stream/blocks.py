"""What the streamed blocks are, for the scheduler: trained blocks, whose master lives in host
memory behind a transfer that also brings each update back (``transfers.py``), or an adapter
run's frozen base, which only ever comes up (``frozen_transfer.py``). Each kind gives the
scheduler its transfer, a resident block's group and a streamed block's host storage; nothing
else in the schedule depends on which it is.
"""
from __future__ import annotations

import torch

from workbench.config import ConfigError, RunConfig, compute_slots
from workbench.engine.codecs.frozen_form import matrix_dtype
from workbench.engine.codecs.wire import HALF, get_codec
from workbench.engine.groups import GroupLayout
from workbench.engine.peft import frozen_block
from workbench.engine.storage import Group, materialise
from workbench.engine.stream.compute_slots import ComputeSlotTransfer
from workbench.engine.stream.embed_rows import EmbedRows
from workbench.engine.stream.frozen_transfer import FrozenTransfer
from workbench.engine.device.shared_host import NodeShare
from workbench.engine.stream.transfers import make_transfer
from workbench.engine.timing import OpTimer
from workbench.engine.zo.perturb import ZOOps
from workbench.models.build import RandomInit
from workbench.models.castable import uncast_entries
from workbench.plan.memory import embed_rows


class TrainedBlocks:
    """Blocks that train: their master (fp32, or the codec's under compressed-sr) in host
    memory, a transfer per ``cfg.master`` / ``cfg.codec`` (and ``cfg.slot_dtype``); resident
    blocks in fp32. Their snapshots copy the host masters (``self_copy.py``). ``embed``: (the
    embedding's layout, its token embedding module) when it streams too (compute-dtype slots
    then fill its looked-up rows: ``embed_rows.py``)."""

    trained = True

    def __init__(self, cfg: RunConfig, device: torch.device, timer: OpTimer, ops: ZOOps,
                 streamed: list[GroupLayout], share: NodeShare | None, embed=None):
        self.cfg, self.device = cfg, device
        if compute_slots(cfg) and exact_in_compute(cfg, streamed, embed):  # the slots keep
            # the master's 2 B (``compute_slots.py``)
            rows = None if embed is None else EmbedRows(*embed, embed_rows(cfg))
            self.transfer = ComputeSlotTransfer(device, timer, ops, get_codec(cfg.codec),
                                                HALF[cfg.amp], streamed, share,
                                                sr=cfg.master == "compressed-sr", rows=rows)
        else:
            self.transfer = make_transfer(cfg.master, cfg.codec, device, timer, ops, share)

    def resident(self, lay: GroupLayout, source) -> Group:
        return Group(lay, materialise(lay, source, self.cfg.seed, self.device))

    def host_storage(self, lay: GroupLayout, source):
        return host_storage(self.transfer, lay, source, self.cfg.seed, self.device)


class FrozenBase:
    """An adapter run's base: never updated, so it only comes up, in its ``base_codec``
    (compressed, each slot is a wire of its own, decoded on the compute stream just before its
    block into one shared buffer); resident blocks held in their device form. The adapters are
    the engine's to snapshot."""

    trained = False

    def __init__(self, cfg: RunConfig, device: torch.device, timer: OpTimer,
                 streamed: list[GroupLayout], share: NodeShare | None):
        self.cfg, self.device = cfg, device
        self.transfer = FrozenTransfer(cfg.base_codec, streamed, device, timer,
                                       matrix_dtype(cfg.amp, cfg.base_codec), share)

    def resident(self, lay: GroupLayout, source) -> Group:
        return frozen_block(lay, source, self.cfg, self.device)

    def host_storage(self, lay: GroupLayout, source):
        return host_storage(self.transfer, lay, source, self.cfg.seed, self.device)


def exact_in_compute(cfg: RunConfig, streamed: list[GroupLayout], embed=None) -> bool:
    """Whether compute-dtype slots give the fp32 slots' bits for these units: every matrix a
    weight autocast casts (``models/castable.py``; the embedding's rows are filled in fp32). Not
    so, ``auto`` keeps fp32 slots and ``slot_dtype=compute`` is refused in one line."""
    uncast = uncast_entries([lay for lay in streamed if embed is None or lay is not embed[0]])
    if uncast and cfg.slot_dtype == "compute":
        raise ConfigError([f"slot_dtype: compute holds every block matrix pre-cast, and "
                           f"{uncast[0]} is not a Linear weight autocast casts (this model "
                           f"would train other bits than with fp32 slots); use "
                           f"slot_dtype=fp32 or auto"])
    return not uncast


def streamed_blocks(cfg: RunConfig, device: torch.device, timer: OpTimer, ops: ZOOps,
                    streamed: list[GroupLayout], share: NodeShare | None,
                    embed: tuple | None = None) -> TrainedBlocks | FrozenBase:
    """The kind of ``cfg``'s streamed units (``streamed``: their layouts, in order; ``embed``:
    (the embedding's layout, its token embedding module) when it streams too)."""
    if cfg.peft == "lora":
        return FrozenBase(cfg, device, timer, streamed, share)
    return TrainedBlocks(cfg, device, timer, ops, streamed, share, embed)


def host_storage(transfer, lay: GroupLayout, source, seed: int, device: torch.device):
    """A streamed block's host storage, filled with its initial weights. Random init runs on
    the GPU (in a staging block the slots later reuse) and is copied down: far faster than
    initialising on the CPU."""
    host = transfer.host_storage(lay)
    on_gpu = device.type == "cuda" and isinstance(source, RandomInit)
    staging = torch.empty(lay.numel, device=device if on_gpu else "cpu")
    source.fill(lay.name, lay.named_views(staging), seed)
    transfer.store_fp32(host, staging)  # setup only: synchronous copies are fine here
    return host
