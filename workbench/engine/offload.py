"""ZO-Offloading: transformer blocks stream host -> GPU -> host, one PCIe round trip per step.

Layout: the embedding, the head and ``resident_blocks`` blocks live on the GPU; every other
block's fp32 master lives in pinned host memory. ``prefetch_depth + 2`` GPU slots, allocated once,
hold the blocks in flight: block i+d uploads while block i computes and block i-1 offloads, on
three CUDA streams ordered by events only (the host never waits inside a step).

Per block and step, after its upload: apply the previous step's pending update (its g and seed)
fused with the +eps perturbation, run the + pass, perturb -2 eps, run the - pass, restore, offload.
The + and - hidden states travel block by block together, so one upload serves both passes.
A weight tied between the embedding and the LM head keeps its +eps copy in a scratch buffer
from the embedding's + pass to the head's, so every value equals MeZO's bit for bit.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import torch

from workbench.config import RunConfig
from workbench.engine import StepOutput
from workbench.data.batches import Batch
from workbench.engine.events import EMBED, HEAD, EventBus
from workbench.engine.groups import build_layouts, move_buffers, release, tied_with_embed
from workbench.engine.perturb import PendingUpdate, ZOOps
from workbench.engine.streams import Streams
from workbench.engine.timing import OpTimer
from workbench.engine.transfers import MirrorTransfer, make_transfer
from workbench.engine.zo_common import (Group, autocast, device_copies, label_loss,
                                        materialise, pending_dict, pending_from_dict,
                                        projected_grad, step_seed)
from workbench.models.adapter import BlockAdapter
from workbench.models.build import RandomInit


class ZOOffloadEngine:
    """Args: as ``MeZOEngine``; the scheduler knobs come from ``cfg`` (overlap, reuse_buffers,
    fused_update, resident_blocks, prefetch_depth)."""

    streaming = True

    def __init__(self, model, source, cfg: RunConfig, device: torch.device, bus: EventBus):
        self.cfg, self.device = cfg, device
        self.cuda = device.type == "cuda"
        self.adapter = BlockAdapter(model)
        embed, blocks, head = build_layouts(self.adapter)
        n = len(blocks)
        self.resident = set(range(min(cfg.resident_blocks, n)))
        self.embed = Group(embed, materialise(embed, source, cfg.seed, device))
        self.head = Group(head, materialise(head, source, cfg.seed, device))
        self.tied = tied_with_embed(embed, self.adapter.head_modules)
        # +eps copy of a tied embedding, alive from the embedding's + pass to the head's.
        self.scratch = torch.empty_like(self.embed.flat) if self.tied else None
        self.streams = Streams(device, cfg.overlap)
        self.ops = ZOOps(cfg.rng, device)
        self.timer = OpTimer(device, bus, cfg.telemetry)
        self.transfer = make_transfer(cfg.master, cfg.codec, device, self.timer, self.ops)
        self.mirror = isinstance(self.transfer, MirrorTransfer)
        self.slot_numel = max((blocks[i].numel for i in range(n) if i not in self.resident), default=0)
        self.n_slots = cfg.prefetch_depth + 2
        self.slots: list[tuple[torch.Tensor, dict]] = []
        if cfg.reuse_buffers and self.slot_numel:
            self.slots = [(torch.empty(self.slot_numel, device=device),
                           self.transfer.slot_extra(self.slot_numel)) for _ in range(self.n_slots)]
        self.blocks: list[Group] = []
        for i, lay in enumerate(blocks):
            if i in self.resident:
                self.blocks.append(Group(lay, materialise(lay, source, cfg.seed, device)))
            else:
                self.blocks.append(Group(lay, self._host_storage(lay, source)))
        self.embed.bind()
        self.head.bind()
        for i in self.resident:
            self.blocks[i].bind()
        move_buffers([model], device)
        self.pending: PendingUpdate | None = None
        # Data parallel: averages the shard losses over ranks (the only traffic of a step).
        self.reduce = None
        self.bytes_h2d = self.bytes_d2h = 0
        self._offloaded: dict[int, torch.cuda.Event | None] = {}  # block -> its last offload
        self._slot_free: dict[int, torch.cuda.Event | None] = {}  # slot -> last use finished
        self._slot_params: dict[tuple, list] = {}
        self._gates: dict[int, Future] = {}  # block -> its snapshot copy, awaited before offload
        self._snap_host: dict[int, torch.Tensor] = {}  # self-copy buffers, reused
        self._copier = ThreadPoolExecutor(max_workers=2, thread_name_prefix="self-copy")

    def _host_storage(self, lay, source):
        """A streamed block's host storage, filled with its initial weights. Random init runs on
        the GPU (in a slot) and is copied down: far faster than initialising on the CPU."""
        host = self.transfer.host_storage(lay.numel)
        on_gpu = self.cuda and isinstance(source, RandomInit)
        staging = (self.slots[0][0] if on_gpu and self.slots
                   else torch.empty(lay.numel, device=self.device if on_gpu else "cpu"))
        staging = staging[:lay.numel]
        source.fill(lay.name, lay.named_views(staging), self.cfg.seed)
        self.transfer.store_fp32(host, staging)  # setup only: synchronous copies are fine here
        return host

    # --- the block pipeline ----------------------------------------------------------------
    def _stream_blocks(self, step: int, compute: Callable[[int, torch.Tensor, dict | None], None],
                       write_back: bool, op: str = "compute") -> None:
        """Run ``compute(i, weights, extra)`` for every block in order, streamed blocks uploaded
        ``prefetch_depth`` ahead and (with ``write_back``) offloaded after."""
        s, n, depth, tr = self.streams, len(self.blocks), self.cfg.prefetch_depth, self.transfer
        inflight: dict[int, tuple] = {}

        def upload(j: int) -> None:
            if j >= n or j in self.resident:
                return
            group, slot = self.blocks[j], j % self.n_slots
            numel = group.layout.numel
            tr.wait_host(j)  # host-side work on this block's storage has finished
            with s.on(s.upload):
                s.wait(s.upload, self._slot_free.get(slot))  # slot's last block is done with it
                s.wait(s.upload, self._offloaded.get(j))  # last step's offload wrote the host copy
                if self.slots:
                    flat, extra = self.slots[slot][0][:numel], self.slots[slot][1]
                else:  # reuse_buffers off: fresh buffers from the caching allocator each time
                    flat, extra = torch.empty(numel, device=self.device), tr.slot_extra(numel)
                tr.upload(group.flat, flat, extra, step, j, s.upload)
                inflight[j] = (flat, extra, s.record(s.upload), slot)
            self.bytes_h2d += tr.up_bytes(numel)

        for j in range(min(depth, n)):
            upload(j)
        for i in range(n):
            upload(i + depth)
            group = self.blocks[i]
            if i in self.resident:
                with self.timer.span(op, "compute", s.compute, step, i):
                    compute(i, group.flat, None)
                continue
            flat, extra, uploaded, slot = inflight.pop(i)
            s.wait(s.compute, uploaded)  # compute reads the weights only once they have landed
            fresh = [flat, *extra.values()] if not self.slots and self.cuda else []
            for t in fresh:
                t.record_stream(s.compute)  # fresh buffers: alive until compute is done
            self._bind_slot(i, flat, slot)
            with self.timer.span(op, "compute", s.compute, step, i):
                compute(i, flat, extra)
            computed = s.record(s.compute)
            if not write_back:
                self._slot_free[slot] = computed
                continue
            gate = self._gates.pop(i, None)
            if gate is not None:
                gate.result()  # the checkpoint's self-copy of this block's half is done
            with s.on(s.offload):
                s.wait(s.offload, computed)  # offload only after compute has finished the block
                self.bytes_d2h += tr.offload(group.flat, flat, extra, step, i, group.layout,
                                             s.offload)
                done = s.record(s.offload)
                for t in fresh:
                    t.record_stream(s.offload)  # and until the offload has read them
            self._offloaded[i] = self._slot_free[slot] = done

    def _bind_slot(self, i: int, flat: torch.Tensor, slot: int) -> None:
        """Point block i's modules at its weights in the slot (views cached per slot)."""
        lay = self.blocks[i].layout
        if not self.slots:
            lay.bind(lay.make_params(flat))
            return
        key = (slot, lay.signature())  # views of one slot serve every block of that shape
        params = self._slot_params.get(key)
        if params is None:
            params = self._slot_params[key] = lay.make_params(flat)
        lay.bind(params)

    # --- training ---------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, batch: Batch, step: int, lr: float, wd: float) -> StepOutput:
        """One ZO step over the streamed model; returns (L+, L-, g) as 0-d device tensors."""
        cfg, ops, adapter = self.cfg, self.ops, self.adapter
        eps, seed, upd = cfg.eps, step_seed(cfg.seed, step), self.pending
        compute_stream = self.streams.compute
        emb = self.embed
        with autocast(self.device, cfg.amp):
            with self.timer.span("compute", "compute", compute_stream, step, EMBED):
                if self.tied:  # main <- updated w; scratch <- p = w + eps z
                    ops.update_perturb(emb.flat, emb.layout, upd, seed, +eps, out=self.scratch)
                    emb.bind(self.scratch)
                    h_plus, ctx = adapter.embed(batch)
                    ops.perturb(self.scratch, emb.layout, seed, -2 * eps, out=emb.flat)
                    emb.bind()
                    h_minus, _ = adapter.embed(batch)
                else:
                    self._perturb_group(emb, upd, seed, eps)
                    h_plus, ctx = adapter.embed(batch)
                    ops.perturb(emb.flat, emb.layout, seed, -2 * eps)
                    h_minus, _ = adapter.embed(batch)
                    ops.perturb(emb.flat, emb.layout, seed, +eps)
            hidden = [h_plus, h_minus]

            def dual_forward(i: int, flat: torch.Tensor, extra: dict | None) -> None:
                lay, block = self.blocks[i].layout, adapter.blocks[i]
                self._update_perturb_block(i, flat, extra, upd, seed, eps)
                hidden[0] = adapter.run_block(block, hidden[0], ctx)
                ops.perturb(flat, lay, seed, -2 * eps)
                hidden[1] = adapter.run_block(block, hidden[1], ctx)
                ops.perturb(flat, lay, seed, +eps)

            self._stream_blocks(step, dual_forward, write_back=True)
            with self.timer.span("compute", "compute", compute_stream, step, HEAD):
                head = self.head
                self._perturb_group(head, upd, seed, eps)
                if self.tied:
                    emb.bind(self.scratch)
                loss_plus = label_loss(adapter.head(hidden[0], ctx), batch)
                if head.layout.numel:
                    ops.perturb(head.flat, head.layout, seed, -2 * eps)
                if self.tied:
                    emb.bind()
                loss_minus = label_loss(adapter.head(hidden[1], ctx), batch)
                if head.layout.numel:
                    ops.perturb(head.flat, head.layout, seed, +eps)
                if self.tied:
                    ops.perturb(emb.flat, emb.layout, seed, +eps)
        if self.reduce is not None:
            loss_plus, loss_minus = self.reduce(torch.stack([loss_plus, loss_minus])).unbind()
        g = projected_grad(loss_plus, loss_minus, eps)
        self.pending = PendingUpdate(seed, g, lr, wd)
        if not cfg.fused_update:
            self.flush(step)  # the unfused baseline: a separate update pass with its own transfers
        self.timer.poll()
        return StepOutput((loss_plus + loss_minus) / 2, g, loss_plus, loss_minus)

    def _update_perturb_block(self, i: int, flat, extra, upd, seed: int, eps: float) -> None:
        if self.mirror and extra is not None and upd is not None:
            # fp32 master on the host: apply the update here and keep it to send down.
            self.transfer.apply_update(flat, self.blocks[i].layout, upd, extra, i)
            upd = None
        self.ops.update_perturb(flat, self.blocks[i].layout, upd, seed, +eps)

    def _update_block(self, i: int, flat, extra, upd) -> None:
        if self.mirror and extra is not None:
            self.transfer.apply_update(flat, self.blocks[i].layout, upd, extra, i)
        else:
            self.ops.update(flat, self.blocks[i].layout, upd)

    def _perturb_group(self, group: Group, upd: PendingUpdate | None, seed: int, eps: float) -> None:
        if group.layout.numel:
            self.ops.update_perturb(group.flat, group.layout, upd, seed, +eps)

    @torch.no_grad()
    def flush(self, step: int = -1) -> None:
        """Apply the pending update everywhere (end of training, before eval or a checkpoint)."""
        upd, self.pending = self.pending, None
        if upd is None:
            return
        compute_stream = self.streams.compute
        with self.timer.span("update", "compute", compute_stream, step, EMBED):
            for group in (self.embed, self.head):
                if group.layout.numel:
                    self.ops.update(group.flat, group.layout, upd)
        self._stream_blocks(step, lambda i, flat, extra: self._update_block(i, flat, extra, upd),
                            write_back=True, op="update")

    @torch.no_grad()
    def predict(self, batch: Batch) -> torch.Tensor:
        """Label-word logits (B, 2) with the current weights, blocks streamed read-only."""
        self.flush()
        with autocast(self.device, self.cfg.amp):
            hidden, ctx = self.adapter.embed(batch)
            state = [hidden]

            def forward(i: int, flat: torch.Tensor, extra: dict | None) -> None:
                state[0] = self.adapter.run_block(self.adapter.blocks[i], state[0], ctx)

            self._stream_blocks(-1, forward, write_back=False, op="eval")
            return self.adapter.head(state[0], ctx)[:, batch.label_ids].float()

    # --- state ------------------------------------------------------------------------------
    def sync(self) -> None:
        """Wait for every transfer and host pass (outside steps: before reading host copies)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)  # all streams: transfers have landed
        for i in range(len(self.blocks)):
            self.transfer.wait_host(i)

    def _weights(self, i: int) -> torch.Tensor:
        group = self.blocks[i]
        return group.flat if i in self.resident else self.transfer.to_fp32(group.flat)

    def state_flats(self) -> list[torch.Tensor]:
        """Every group's fp32 weights in canonical order (streamed blocks from the host)."""
        self.sync()
        return [self.embed.flat, *(self._weights(i) for i in range(len(self.blocks))),
                self.head.flat]

    def load_state_flats(self, flats: list[torch.Tensor]) -> None:
        self.sync()
        self.embed.flat.copy_(flats[0])
        self.head.flat.copy_(flats[-1])
        for i, flat in enumerate(flats[1:-1]):
            if i in self.resident:
                self.blocks[i].flat.copy_(flat)
            else:
                self.transfer.store_fp32(self.blocks[i].flat, flat)

    def group_layouts(self) -> list:
        return [g.layout for g in (self.embed, *self.blocks, self.head)]

    def snapshot(self, next_step: int):
        """The paper's asynchronous checkpoint: GPU-resident groups are copied down on a side
        stream; each half's streamed blocks are self-copied on the host by a thread once their
        offloads have landed, while training goes on. The next step waits only before it
        overwrites a block whose copy is not done yet. Returns a function for the writer."""
        from workbench.engine.checkpoint import Snapshot, halves

        groups = [self.embed, *self.blocks, self.head]
        on_gpu = [k for k in range(len(groups)) if k in (0, len(groups) - 1)
                  or (k - 1) in self.resident]
        gpu_bufs, done = device_copies([groups[k].flat for k in on_gpu] +
                                       ([self.pending.g.reshape(1)] if self.pending else []),
                                       None, self.device)
        out: list[torch.Tensor | None] = [None] * len(groups)
        futures = []
        for part in halves(len(groups)):
            streamed = [k - 1 for k in part if k not in on_gpu]
            if streamed:
                future = self._copier.submit(self._self_copy, streamed, out)
                futures.append(future)
                for b in streamed:
                    self._gates[b] = future
        upd, names = self.pending, [lay.name for lay in self.group_layouts()]

        def make() -> Snapshot:
            if done is not None:
                done.synchronize()  # writer thread: the side-stream copies have landed
            for k, buf in zip(on_gpu, gpu_bufs):
                out[k] = buf
            for future in futures:
                future.result()
            host_g = gpu_bufs[-1] if upd is not None else None
            return Snapshot(next_step, out, names, pending_dict(upd, host_g),
                            self.cfg.to_dict(), [lay.n_decay for lay in self.group_layouts()])

        return make

    def _self_copy(self, blocks: list[int], out: list) -> None:
        """Copy thread: host copies of streamed blocks once their last offload has landed, into
        buffers kept from one snapshot to the next (fresh memory would be page-faulted in on
        every snapshot, which costs more than the copy; the writer is idle when a snapshot
        starts, so nothing still reads them)."""
        for b in blocks:
            landed = self._offloaded.get(b)
            if landed is not None:
                landed.synchronize()  # copy thread only: the step's offload wrote the master
            self.transfer.wait_host(b)
            numel = self.blocks[b].layout.numel
            buf = self._snap_host.get(b)
            if buf is None or buf.numel() != numel:
                buf = self._snap_host[b] = torch.empty(numel, dtype=self.transfer.master_dtype)
            out[b + 1] = self.transfer.read_master(self.blocks[b].flat, buf)

    def set_pending(self, pending: dict | None) -> None:
        self.pending = pending_from_dict(pending, self.device)

    def gpu_param_bytes(self) -> int:
        if not self.cuda:
            return 0
        resident = sum(self.blocks[i].layout.nbytes for i in self.resident)
        slots = sum(4 * flat.numel() + sum(t.numel() * t.element_size() for t in extra.values())
                    for flat, extra in self.slots)
        scratch = self.scratch.numel() * 4 if self.scratch is not None else 0
        return self.embed.layout.nbytes + self.head.layout.nbytes + resident + slots + scratch

    def close(self) -> None:
        """Drain timing events and free GPU and pinned host memory (the model becomes a
        skeleton: a notebook runs many jobs in one process)."""
        self.sync()
        for gate in self._gates.values():
            gate.result()
        self._copier.shutdown(wait=True)
        self.transfer.close()
        self.timer.poll(wait=True)
        for group in (self.embed, *self.blocks, self.head):
            release(group.layout)
        self.blocks, self.slots, self.scratch = [], [], None
        self._slot_params.clear()
        self._snap_host.clear()
