"""The block-streaming scheduler: which group is where, on which stream, after which event.

Layout: the embedding, the head and ``resident_blocks`` blocks live on the GPU; every other
block's master lives in host memory behind a transfer (``transfers.py``: fp32, a compressed
mirror, or compressed-sr). With ``stream_embeddings`` the embedding and head stream too, first
and last in each pass. ``block_slots`` GPU slots (auto: ``prefetch_depth`` + the transfer's
``spare_slots``), allocated once and sized for the largest streamed unit, hold the units in
flight: unit i+d uploads while unit i computes and unit i-1 offloads, on three CUDA streams
ordered by events only (the host never waits inside a step); with fewer slots an upload waits
on its stream for the offload of its slot's last unit. A compressed codec's wire buffers are
two in all (one per direction), not one per slot; under compressed-sr a slot is free once its
block is encoded, so one slot fewer serves. An adapter run's frozen base
(``frozen_transfer.py``) only comes up: compressed, each slot is a wire of its own, decoded on
the compute stream just before its block into one shared buffer. What a pass does to a unit is
the caller's ``compute``; the arithmetic lives in ``zo/step.py``. Used by the streamed holders
(``holder.py``, ``adapters.py``) through its public methods.

This module only schedules. What the blocks are (trained, or a frozen base) is ``blocks.py``;
the hand-off of the node's one host copy under data parallel, ``shared_host.py`` (a rank with a
copy of its own runs the same hooks, which do nothing); snapshots, ``engine/snapshots.py`` (the
groups on the device) and ``self_copy.py`` (the streamed blocks' host masters).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from workbench.config import RunConfig
from workbench.engine.events import EMBED, HEAD
from workbench.engine.groups import (GroupLayout, LazyFlats, build_layouts, move_buffers, release,
                                    tied_with_embed)
from workbench.engine.snapshots import DeviceSnapshots
from workbench.engine.storage import Group, materialise
from workbench.engine.stream.blocks import streamed_blocks
from workbench.engine.stream.layout import stream_layout
from workbench.engine.stream.opt_state import StreamedState
from workbench.engine.stream.self_copy import BlockCopies
from workbench.engine.device.shared_host import NodeShare, Unshared
from workbench.engine.device.streams import Streams
from workbench.engine.timing import OpTimer
from workbench.engine.zo.optim import STATEFUL
from workbench.engine.zo.perturb import PendingUpdate, ZOOps
from workbench.engine.zo.step import ApplyUpdate
from workbench.models.adapter import BlockAdapter

#: ``compute(i, weights, apply)``: unit i's pass over its (n,) fp32 weights on the device (i: a
#: block index, or EMBED / HEAD for a streamed embedding / head); ``apply`` is how a pending
#: update reaches them (None: the fused update of ``zo/step.py``).
BlockCompute = Callable[[int, torch.Tensor, ApplyUpdate | None], None]


class BlockStreamer:
    """Args:
        adapter: the model's block adapter; its groups are materialised and bound here.
        source: where weights come from (random init or a checkpoint folder).
        cfg: the run config; the scheduler knobs (overlap, reuse_buffers, resident_blocks,
            prefetch_depth) and the host format (master, codec).
        device: the GPU (or the CPU, where the streams are no-ops and the schedule is tested).
        timer: the engine's operation timer.
        ops: the engine's ZO operations (the transfers use them for their own updates).
        share: the node's one host copy under data parallel (``shared_host.NodeShare``).

    Attributes: ``embed``, ``head``, ``blocks`` (Groups; a streamed unit's ``flat`` is its
    host storage), ``resident`` (block indices on the GPU), ``ends`` (the embedding and head
    stream), ``order`` (canonical group indices a full pass visits), ``streamed`` (those whose
    master is on the host), ``streams``, ``transfer``, ``slot_numel``, ``n_slots``,
    ``bytes_h2d`` / ``bytes_d2h`` (running totals), ``node`` (the host copy's hand-off),
    ``snapshots`` / ``copies`` (the two halves of a snapshot). Units are named by canonical
    index k (embedding 0, block i at i + 1, head N + 1) inside, and to transfers, events and
    ``compute`` by their id (``uid``: the block index, EMBED or HEAD).
    """

    def __init__(self, adapter: BlockAdapter, source, cfg: RunConfig, device: torch.device,
                 timer: OpTimer, ops: ZOOps, share: NodeShare | None = None):
        self.cfg, self.device, self.timer = cfg, device, timer
        self.node = share if share is not None else Unshared()  # the hand-off of a host copy
        self.cuda = device.type == "cuda"
        embed, blocks, head = build_layouts(adapter)
        n = len(blocks)
        self.n_blocks = n
        self.layout = stream_layout(cfg, n)
        self.resident = set(range(min(cfg.resident_blocks, n)))
        self.ends = cfg.stream_embeddings
        if self.ends and tied_with_embed(embed, adapter.head_modules):
            raise ValueError("stream_embeddings: this model ties its LM head to the embedding "
                             "(one weight in two groups); use stream_embeddings=false")
        layouts = [embed, *blocks, head]
        self.order, self.streamed = list(self.layout.order), list(self.layout.streamed)
        self.streams = Streams(device, cfg.overlap)
        kind = streamed_blocks(cfg, device, timer, ops, [layouts[k] for k in self.streamed],
                               share, (embed, adapter.model.get_input_embeddings())
                               if self.ends else None)
        self.transfer = kind.transfer
        self.slot_numel = max((layouts[k].numel for k in self.streamed), default=0)
        self.n_slots = (cfg.prefetch_depth + self.transfer.spare_slots
                        if cfg.block_slots == "auto" else int(cfg.block_slots))
        groups: list[Group] = []
        self.node.start(len(self.order))
        for k, lay in enumerate(layouts):
            if k not in self.streamed:  # on the device: fp32 ends, resident blocks (a
                groups.append(Group(lay, materialise(lay, source, cfg.seed, device))  # base's
                              if k in (0, n + 1) else kind.resident(lay, source))  # form)
            else:  # under a NodeShare only its writer fills the host copy; the rest map it
                groups.append(Group(lay, kind.host_storage(lay, source)
                                    if self.node.writer else None))
        self.node.filled()
        for group in groups:
            if group.flat is None:
                group.flat = self.transfer.host_storage(group.layout)
        self.node.mapped()
        self.embed, self.blocks, self.head = groups[0], groups[1:n + 1], groups[n + 1]
        self.slots: list[tuple[torch.Tensor, dict]] = []  # after the blocks: their staging
        if cfg.reuse_buffers and self.slot_numel:  # has gone back to the allocator
            self.slots = [self.transfer.slot_buffers(self.slot_numel, shared=True)
                          for _ in range(self.n_slots)]
        # compute-dtype slots: each forward pass of a streamed block first has the transfer
        # write the block as that pass sees it (``compute_slots.py``)
        self._hooks = self._lazy_hooks(adapter) if self.transfer.lazy else []
        for k, group in enumerate(groups):
            if k not in self.streamed:
                group.bind()
        move_buffers([adapter.model], device)
        self.bytes_h2d = self.bytes_d2h = 0
        self._offloaded: dict[int, torch.cuda.Event | None] = {}  # unit k -> its last offload
        self._slot_free: dict[int, torch.cuda.Event | None] = {}  # slot -> last use finished
        self._slot_params: dict[tuple, list] = {}
        self.snapshots = DeviceSnapshots(device, cfg.to_dict())
        self.copies = BlockCopies(groups, {k: self.uid(k) for k in self.streamed}, self.transfer,
                                  timer, self.snapshots.buffers, self._offloaded.get)
        # momentum / adam: each trained group's optimizer state, where the group is
        self.opt_state = (StreamedState(cfg.zo_optimizer, cfg.master, cfg.codec,
                                        self.group_layouts(), self.streamed, device,
                                        timer, ops, self.n_slots, cfg.reuse_buffers)
                          if kind.trained and cfg.zo_optimizer in STATEFUL else None)
        if cfg.checkpoint_every and kind.trained:  # an adapter run snapshots its adapters
            self.snapshots.prepare(self._on_gpu(), pending=cfg.queries,
                                   state=self._state_on_gpu())
            self.copies.prepare()

    def groups(self) -> list[Group]:
        """Every group in canonical order: embedding, blocks, head."""
        return [self.embed, *self.blocks, self.head]

    def uid(self, k: int) -> int:
        """Canonical group k's id for transfers, events and ``compute`` (``layout.py``)."""
        return self.layout.uid(k)

    def canonical(self, i: int) -> int:
        """The canonical index of the unit with id i (``uid``'s inverse)."""
        return 0 if i == EMBED else self.n_blocks + 1 if i == HEAD else i + 1

    def group(self, i: int) -> Group:
        """The group of the unit with id i (a block index, EMBED or HEAD)."""
        return self.groups()[self.canonical(i)]

    def _lazy_hooks(self, adapter: BlockAdapter) -> list:
        """Compute-dtype slots: each forward of a streamed unit first has the transfer write the
        unit as that pass sees it (``compute_slots.py``): a pre-hook on each streamed block, on
        each head module (the first to run fills; the rest find it filled) and on the token
        embedding (which also maps the batch's ids to the rows it filled)."""
        tr, n = self.transfer, self.n_blocks
        hooks = [adapter.blocks[k - 1].register_forward_pre_hook(
            lambda module, args, i=k - 1: tr.ready(i)) for k in self.streamed if 0 < k <= n]
        if self.ends:
            hooks += [m.register_forward_pre_hook(lambda module, args: tr.ready(HEAD))
                      for m in adapter.head_modules]
            hooks.append(adapter.model.get_input_embeddings().register_forward_pre_hook(
                lambda module, args: tr.ready_rows(EMBED, args)))
        return hooks

    # --- the block pipeline ----------------------------------------------------------------
    def stream_blocks(self, step: int, compute: BlockCompute, write_back: bool,
                      op: str = "compute", state: bool = False,
                      units: Sequence[int] | None = None) -> None:
        """Run ``compute`` for every unit of ``units`` (canonical indices, in order; default
        ``order``: the blocks, and the embedding first and head last when they stream) on the
        compute stream, streamed units uploaded ``prefetch_depth`` ahead and (with
        ``write_back``) offloaded after; each compute runs inside an ``op`` span of the timer.
        ``state``: the pass applies an update whose rule keeps optimizer state, so each unit's
        state travels with it (``state_for``)."""
        s, depth, tr, node = self.streams, self.cfg.prefetch_depth, self.transfer, self.node
        order = self.order if units is None else list(units)
        n, streamed, first = len(order), set(self.streamed), self.order[0]
        moved = self.opt_state if state and write_back else None
        inflight: dict[int, tuple] = {}
        node.begin_pass(write_back)

        def upload(p: int) -> None:  # the p-th unit of ``order``
            if p >= n or order[p] not in streamed:
                return
            k = order[p]
            j, group, slot = self.uid(k), self.groups()[k], p % self.n_slots
            numel = group.layout.numel
            tr.wait_host(j)  # host-side work on this unit's storage has finished
            with s.on(s.upload):
                s.wait(s.upload, self._offloaded.get(k))  # last step's offload wrote the host copy
                if self.slots:
                    flat, extra = tr.slot_view(self.slots[slot][0], numel), self.slots[slot][1]
                else:  # reuse_buffers off: fresh buffers from the caching allocator each time
                    flat, extra = tr.slot_buffers(numel)
                node.before_upload(k - first, write_back)  # readers: the last write-back landed
                self.bytes_h2d += tr.upload(group.flat, flat, extra, step, j, s.upload,
                                            # the slot's last unit (the one before the unit
                                            # computing, at prefetch_depth + 1 slots) is done
                                            # with it: its offload or a frozen decode read it
                                            lambda: s.wait(s.upload, self._slot_free.get(slot)))
                if moved is not None:  # after the weights: the stream has waited for the slot
                    self.bytes_h2d += moved.upload(k, slot, step, s.upload)
                inflight[p] = (flat, extra, s.record(s.upload), slot)
                if write_back:
                    node.after_upload(k - first, inflight[p][2])

        for p in range(min(depth, n)):
            upload(p)
        for p in range(n):
            upload(p + depth)
            k = order[p]
            i, group = self.uid(k), self.groups()[k]
            if k not in streamed:
                with self.timer.span(op, "compute", s.compute, step, i):
                    compute(i, group.flat, None)
                continue
            flat, extra, uploaded, slot = inflight.pop(p)
            s.wait(s.compute, uploaded)  # compute reads the weights only once they have landed
            fresh = [flat, *extra.values()] if not self.slots and self.cuda else []
            for t in fresh:
                t.record_stream(s.compute)  # fresh buffers: alive until compute is done
            decoded: list = []  # a frozen block decoded on the compute stream frees its wire
            tr.before_compute(group.flat, flat, extra, step, i, s.compute,
                              lambda: decoded.append(s.record(s.compute)), group.layout)
            self._bind_slot(group.layout, flat, slot)
            with self.timer.span(op, "compute", s.compute, step, i):
                compute(i, flat, tr.updater(extra, i))
            if write_back and node.writer:  # on the compute stream: a compute-dtype slot's
                tr.settle(step, i, group.layout)  # master takes the pass's operations now
            computed = s.record(s.compute)
            if not write_back:
                self._slot_free[slot] = decoded[0] if decoded else computed
                continue
            self.copies.before_offload(k)  # a snapshot's copy of its master is done
            if moved is not None:  # every rank keeps its own state: no node copy to defer to
                with s.on(s.offload):
                    s.wait(s.offload, computed)  # the update has written the unit's state
                    self.bytes_d2h += moved.offload(k, step, s.offload)
                computed = s.record(s.offload)  # the slot pair is free once both are down
            if not node.writer:  # the writer writes the node's copy
                self._offloaded[k] = self._slot_free[slot] = computed
                continue
            node.before_write(k - first)  # every reader has uploaded this pass's old values
            released: list = []
            with s.on(s.offload):
                s.wait(s.offload, computed)  # offload only after compute has finished the block
                self.bytes_d2h += tr.offload(group.flat, flat, extra, step, i, group.layout,
                                             s.offload, lambda: released.append(
                                                 s.record(s.offload)))
                done = s.record(s.offload)
                for t in fresh:
                    t.record_stream(s.offload)  # and until the offload has read them
            self._offloaded[k] = done
            self._slot_free[slot] = released[0] if released else done
            node.after_write(k - first, done)

    def _bind_slot(self, lay: GroupLayout, flat: torch.Tensor, slot: int) -> None:
        """Point a unit's modules (of layout ``lay``) at its weights in the slot (views cached
        per slot and shape)."""
        tr = self.transfer
        if not self.slots:
            lay.bind(tr.make_params(lay, flat))
            return
        key = (slot, lay.signature())  # views of one slot serve every unit of that shape
        params = self._slot_params.get(key)
        if params is None:
            params = self._slot_params[key] = tr.make_params(lay, flat)
        lay.bind(params)

    # --- state ------------------------------------------------------------------------------
    def sync(self) -> None:
        """Wait for every transfer and host pass (outside steps: before reading host copies)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)  # all streams: transfers have landed
        for k in self.streamed:
            self.transfer.wait_host(self.uid(k))
        self.node.settled(len(self.order))  # readers: the writer's copies have landed

    def _weights(self, k: int) -> torch.Tensor:
        group = self.groups()[k]
        return self.transfer.to_fp32(group.flat) if k in self.streamed else group.values()

    def state_flats(self) -> LazyFlats:
        """Every group's fp32 weights in canonical order; a streamed unit is decoded from the
        host when it is reached, so iterating holds one decoded unit at a time."""
        self.sync()
        groups = self.groups()

        def reader(k: int):  # a streamed unit the transfer reads piece by piece, or None
            return self.transfer.reader(groups[k].flat) if k in self.streamed else None

        return LazyFlats(len(groups), self._weights, reader)

    def load_state_flats(self, flats: Sequence[torch.Tensor]) -> None:
        """Set every group from ``flats`` (fp32, canonical order), read one group at a time
        (a checkpoint's ``LazyFlats`` loads each from disk only here)."""
        self.sync()
        for k, group in enumerate(self.groups()):
            if k not in self.streamed:
                group.load(flats[k])
            elif self.node.writer:  # one copy per node: one writer
                self.transfer.store_fp32(group.flat, flats[k])
        self.node.barrier()  # readers upload only once the writer has stored every block

    def group_layouts(self) -> list[GroupLayout]:
        return [g.layout for g in self.groups()]

    def snapshot(self, next_step: int, pending: PendingUpdate | None):
        """The paper's asynchronous checkpoint: the groups on the GPU copied down on a side
        stream (``engine/snapshots.py``), the streamed blocks self-copied on the host by a
        thread while training goes on (``self_copy.py``); the next step waits only before it
        overwrites a block whose copy is not done yet. Every buffer is kept from one snapshot
        to the next, so call this only once the writer is done with the last one. Returns a
        function for the writer."""
        host_state = None
        if self.opt_state is not None:  # the host state is copied now, the step waiting: it
            self.sync()  # is not self-copied (a checkpoint step pays the copy of its bytes)
            host_state = self.opt_state.host_copies(len(self.blocks) + 2)
        return self.snapshots.take(next_step, self._on_gpu(), self.group_layouts(), pending,
                                   self.copies.start(next_step), self._state_on_gpu(),
                                   host_state)

    def load_opt_state(self, snap) -> None:
        """The optimizer state from a checkpoint's ``Snapshot`` (none kept: nothing)."""
        if self.opt_state is None:
            return
        if snap.opt_state is None:
            raise ValueError("checkpoint: this run's zo_optimizer keeps per-weight state, and "
                             "the checkpoint carries none")
        self.sync()
        self.opt_state.load(snap.opt_state)

    def _on_gpu(self) -> dict[int, torch.Tensor]:
        """The groups that live on the GPU (embedding, head, residents) by canonical index."""
        return {k: g.flat for k, g in enumerate(self.groups()) if k not in self.streamed}

    def state_for(self, i: int) -> torch.Tensor | None:
        """Unit i's (a block index, EMBED or HEAD) optimizer state on the device (a streamed
        unit's during a pass that moves it; None: the run's rule keeps none)."""
        return None if self.opt_state is None else self.opt_state.for_group(self.canonical(i))

    def _state_on_gpu(self) -> dict[int, torch.Tensor]:
        return {} if self.opt_state is None else dict(self.opt_state.gpu)

    def gpu_param_bytes(self) -> int:
        if not self.cuda:
            return 0
        return sum(self.buffer_bytes().values())

    def buffer_bytes(self) -> dict[str, int]:
        """The streamer's own buffers on its device, by item (bytes; each tensor once): what
        ``gpu_param_bytes`` sums on a GPU, itemised (``benchmarks/amp_memory.py``)."""
        nbytes = lambda t: t.numel() * t.element_size()  # noqa: E731
        extras: dict[str, dict[int, int]] = {}
        for _, extra in self.slots:
            for key, t in extra.items():
                extras.setdefault("mirror deltas" if key == "delta" else "codec wire buffers",
                                  {})[t.data_ptr()] = nbytes(t)
        last = self.n_blocks + 1
        out = {"embedding + head": sum(nbytes(self.groups()[k].flat) for k in (0, last)
                                       if k not in self.streamed),
               "resident blocks": sum(nbytes(self.blocks[i].flat) for i in self.resident),
               "block slots": sum({flat.data_ptr(): nbytes(flat)  # a shared one once
                                   for flat, _ in self.slots}.values())}
        out.update({k: sum(v.values()) for k, v in extras.items()})
        work = getattr(self.transfer, "work", None)
        if work is not None:  # compute-dtype slots: the one buffer blocks compute from
            out["work buffer"] = nbytes(work)
        if self.opt_state is not None:
            out["optimizer state"] = sum(nbytes(t) for t in self.opt_state.buffers())
        return out

    def host_param_bytes(self) -> int:
        """Host bytes holding the streamed units: the master plus any mirror / delta."""
        groups = self.groups()
        return sum(self.transfer.host_bytes(groups[k].flat) for k in self.streamed)

    def close(self) -> None:
        """Drain transfers and snapshot copies, free GPU and pinned host memory (the model
        becomes a skeleton: a notebook runs many jobs in one process)."""
        self.sync()
        for hook in self._hooks:
            hook.remove()
        self.copies.close()
        self.transfer.close()
        if self.opt_state is not None:
            self.opt_state.close()
        for group in self.groups():
            release(group.layout)
        self.blocks, self.slots = [], []
        self._slot_params.clear()
        self.snapshots.release()
        self.node.close()
