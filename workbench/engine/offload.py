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

from typing import Callable

import torch

from workbench.config import RunConfig
from workbench.data.batches import Batch
from workbench.engine.events import EMBED, HEAD, EventBus
from workbench.engine.groups import build_layouts, move_buffers, tied_with_embed
from workbench.engine.perturb import PendingUpdate, ZOOps
from workbench.engine.streams import Streams
from workbench.engine.timing import OpTimer
from workbench.engine.zo_common import (Group, autocast, label_loss, materialise,
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
        self.slot_numel = max((blocks[i].numel for i in range(n) if i not in self.resident), default=0)
        self.n_slots = cfg.prefetch_depth + 2
        self.slots = ([torch.empty(self.slot_numel, device=device) for _ in range(self.n_slots)]
                      if cfg.reuse_buffers and self.slot_numel else [])
        self.blocks: list[Group] = []
        for i, lay in enumerate(blocks):
            if i in self.resident:
                self.blocks.append(Group(lay, materialise(lay, source, cfg.seed, device)))
            else:
                self.blocks.append(Group(lay, self._host_master(lay, source)))
        self.embed.bind()
        self.head.bind()
        for i in self.resident:
            self.blocks[i].bind()
        move_buffers([model], device)
        self.ops = ZOOps(cfg.rng, device)
        self.timer = OpTimer(device, bus, cfg.telemetry)
        self.pending: PendingUpdate | None = None
        self.bytes_h2d = self.bytes_d2h = 0
        self._offloaded: dict[int, torch.cuda.Event | None] = {}  # block -> its last offload
        self._slot_free: dict[int, torch.cuda.Event | None] = {}  # slot -> last use finished
        self._slot_params: dict[int, list] = {}

    def _host_master(self, lay, source) -> torch.Tensor:
        """fp32 master of a streamed block in (pinned) host memory. Random init runs on the
        GPU in a slot and is copied down, which is much faster than initialising on the CPU."""
        host = torch.empty(lay.numel, dtype=torch.float32, pin_memory=self.cuda)
        if self.cuda and isinstance(source, RandomInit):
            staging = (self.slots[0] if self.slots else torch.empty(lay.numel, device=self.device))
            staging = staging[:lay.numel]
            source.fill(lay.name, lay.named_views(staging), self.cfg.seed)
            host.copy_(staging)  # setup only: a synchronous copy is fine here
        else:
            source.fill(lay.name, lay.named_views(host), self.cfg.seed)
        return host

    # --- the block pipeline ----------------------------------------------------------------
    def _stream_blocks(self, step: int, compute: Callable[[int, torch.Tensor], None],
                       write_back: bool, op: str = "compute") -> None:
        """Run ``compute(i, weights)`` for every block in order, streamed blocks uploaded
        ``prefetch_depth`` ahead and (with ``write_back``) offloaded after."""
        s, n, depth = self.streams, len(self.blocks), self.cfg.prefetch_depth
        inflight: dict[int, tuple[torch.Tensor, object, int]] = {}

        def upload(j: int) -> None:
            if j >= n or j in self.resident:
                return
            group, slot = self.blocks[j], j % self.n_slots
            with s.on(s.upload):
                s.wait(s.upload, self._slot_free.get(slot))  # slot's last block is done with it
                s.wait(s.upload, self._offloaded.get(j))  # last step's offload wrote the master
                flat = (self.slots[slot][:group.layout.numel] if self.slots
                        else torch.empty(group.layout.numel, device=self.device))
                with self.timer.span("upload", "upload", s.upload, step, j, group.layout.nbytes):
                    flat.copy_(group.flat, non_blocking=True)
                inflight[j] = (flat, s.record(s.upload), slot)
            self.bytes_h2d += group.layout.nbytes

        for j in range(min(depth, n)):
            upload(j)
        for i in range(n):
            upload(i + depth)
            group = self.blocks[i]
            if i in self.resident:
                compute(i, group.flat)
                continue
            flat, uploaded, slot = inflight.pop(i)
            s.wait(s.compute, uploaded)  # compute reads the weights only once they have landed
            if not self.slots and self.cuda:
                flat.record_stream(s.compute)  # fresh buffer: keep it alive for compute
            self._bind_slot(i, flat, slot)
            with self.timer.span(op, "compute", s.compute, step, i):
                compute(i, flat)
            computed = s.record(s.compute)
            if not write_back:
                self._slot_free[slot] = computed
                continue
            with s.on(s.offload):
                s.wait(s.offload, computed)  # offload only after compute has finished the block
                with self.timer.span("offload", "offload", s.offload, step, i, group.layout.nbytes):
                    group.flat.copy_(flat, non_blocking=True)
                done = s.record(s.offload)
                if not self.slots and self.cuda:
                    flat.record_stream(s.offload)
            self.bytes_d2h += group.layout.nbytes
            self._offloaded[i] = self._slot_free[slot] = done

    def _bind_slot(self, i: int, flat: torch.Tensor, slot: int) -> None:
        """Point block i's modules at its weights in the slot (views cached per slot)."""
        lay = self.blocks[i].layout
        if not self.slots:
            lay.bind(lay.make_params(flat))
            return
        key = (slot, lay.signature())
        params = self._slot_params.get(key)
        if params is None:
            params = self._slot_params[key] = lay.make_params(flat)
        lay.bind(params)

    # --- training ---------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, batch: Batch, step: int, lr: float, wd: float) -> tuple[torch.Tensor, ...]:
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
                    h_plus, ctx = adapter.embed(batch.input_ids, batch.attention_mask)
                    ops.perturb(self.scratch, emb.layout, seed, -2 * eps, out=emb.flat)
                    emb.bind()
                    h_minus, _ = adapter.embed(batch.input_ids, batch.attention_mask)
                else:
                    self._perturb_group(emb, upd, seed, eps)
                    h_plus, ctx = adapter.embed(batch.input_ids, batch.attention_mask)
                    ops.perturb(emb.flat, emb.layout, seed, -2 * eps)
                    h_minus, _ = adapter.embed(batch.input_ids, batch.attention_mask)
                    ops.perturb(emb.flat, emb.layout, seed, +eps)
            hidden = [h_plus, h_minus]

            def dual_forward(i: int, flat: torch.Tensor) -> None:
                lay, block = self.blocks[i].layout, adapter.blocks[i]
                ops.update_perturb(flat, lay, upd, seed, +eps)
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
        g = projected_grad(loss_plus, loss_minus, eps)
        self.pending = PendingUpdate(seed, g, lr, wd)
        if not cfg.fused_update:
            self.flush(step)  # the unfused baseline: a separate update pass with its own transfers
        self.timer.poll()
        return loss_plus, loss_minus, g

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
        self._stream_blocks(step, lambda i, flat: self.ops.update(flat, self.blocks[i].layout, upd),
                            write_back=True, op="update")

    @torch.no_grad()
    def predict(self, batch: Batch) -> torch.Tensor:
        """Label-word logits (B, 2) with the current weights, blocks streamed read-only."""
        self.flush()
        with autocast(self.device, self.cfg.amp):
            hidden, ctx = self.adapter.embed(batch.input_ids, batch.attention_mask)
            state = [hidden]

            def forward(i: int, flat: torch.Tensor) -> None:
                state[0] = self.adapter.run_block(self.adapter.blocks[i], state[0], ctx)

            self._stream_blocks(-1, forward, write_back=False, op="eval")
            return self.adapter.head(state[0], ctx)[:, batch.label_ids].float()

    # --- state ------------------------------------------------------------------------------
    def sync(self) -> None:
        """Wait for every transfer (outside steps: before reading host masters)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def state_flats(self) -> list[torch.Tensor]:
        """Every group's weights in canonical order; streamed blocks are their host masters."""
        self.sync()
        return [self.embed.flat, *(b.flat for b in self.blocks), self.head.flat]

    def load_state_flats(self, flats: list[torch.Tensor]) -> None:
        self.sync()
        for group, flat in zip([self.embed, *self.blocks, self.head], flats):
            group.flat.copy_(flat)

    def gpu_param_bytes(self) -> int:
        if not self.cuda:
            return 0
        resident = sum(self.blocks[i].layout.nbytes for i in self.resident)
        slots = 4 * self.slot_numel * len(self.slots)
        scratch = self.scratch.numel() * 4 if self.scratch is not None else 0
        return self.embed.layout.nbytes + self.head.layout.nbytes + resident + slots + scratch

    def close(self) -> None:
        """Drain timing events and point the model back at the host masters."""
        self.sync()
        self.timer.poll(wait=True)
        for i, group in enumerate(self.blocks):
            if i not in self.resident:
                group.bind()
