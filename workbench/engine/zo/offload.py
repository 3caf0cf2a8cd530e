"""ZO-Offloading: transformer blocks stream host -> GPU -> host, one PCIe round trip per step.

``StreamedEngine`` is the engine contract around a ``BlockStreamer`` (``stream/scheduler.py``: where
each group is and when it moves) for the methods that defer each step's update into the next
step's uploads; ``ZOOffloadEngine`` adds the ZO step, ``ForwardGradEngine``
(``forward_grad.py``) the forward-gradient step. The arithmetic is ``step.py``'s.

A zo-offload step, per block after its upload: apply the previous step's pending update fused
with the +eps perturbation, run the + pass, perturb -2 eps, run the - pass, restore, offload.
The + and - hidden states travel block by block together, so one upload serves both passes;
with ``queries=q`` the 2q (or q + 1, one-sided) passes all run during the block's one visit,
2q hidden states travelling together: q perturbations for one PCIe round trip.
A weight tied between the embedding and the LM head keeps its +eps copy, in the head's compute
dtype, from the embedding's + pass to the head's (``tied.py``), so every value equals MeZO's
bit for bit. With ``stream_embeddings`` (an untied head) the embedding and the head are the
first and last units of the same streamed pass, each visit the step of a block.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from workbench.config import RunConfig
from workbench.data.batches import Batch
from workbench.engine.checkpoint import Snapshot
from workbench.engine.events import EMBED, HEAD, EventBus
from workbench.engine.groups import GroupLayout, tied_with_embed
from workbench.engine.objective import Objective, Total, evaluate, head_loss, objective_for
from workbench.engine.peft import block_adapter
from workbench.engine.precision import autocast
from workbench.engine.protocol import StepOutput
from workbench.engine.stream.scheduler import BlockStreamer
from workbench.engine.stream.shared_host import NodeShare
from workbench.engine.timing import OpTimer
from workbench.engine.zo.perturb import PendingUpdate, ZOOps, pending_from_dict
from workbench.engine.zo.estimate import estimate, step_output
from workbench.engine.zo.step import ZOStep, apply_update, zo_passes
from workbench.engine.zo.tied import TiedHead
from workbench.models.adapter import Inputs


class StreamedEngine:
    """Everything but ``step`` for an engine over a ``BlockStreamer`` whose update stays
    pending until the next step's uploads (``pending``). Args: as ``MeZOEngine``; the scheduler
    knobs come from ``cfg`` (overlap, reuse_buffers, fused_update, resident_blocks,
    prefetch_depth); ``share``: the node's one host copy under data parallel
    (``stream/shared_host.py``)."""

    def __init__(self, model, source, cfg: RunConfig, device: torch.device, bus: EventBus,
                 share: NodeShare | None = None, objective: Objective | None = None):
        self.cfg, self.device = cfg, device
        self.adapter = block_adapter(model, cfg)
        self.ops = ZOOps(cfg.rng, device, cfg.directions)
        self.timer = OpTimer(device, bus, cfg.telemetry)
        self.objective = objective or objective_for(cfg, model.config.vocab_size)
        self.streamer = BlockStreamer(self.adapter, source, cfg, device, self.timer, self.ops,
                                      share)
        self.pending: PendingUpdate | None = None
        # Data parallel: averages the shard losses over ranks (the only traffic of a step).
        self.reduce = None

    @property
    def bytes_h2d(self) -> int:
        return self.streamer.bytes_h2d

    @property
    def bytes_d2h(self) -> int:
        return self.streamer.bytes_d2h

    def defer(self, step: int, seed: int, g: torch.Tensor, lr: float, wd: float) -> None:
        """Keep the step's update pending for the next step's uploads (fused_update), or apply
        it now in a separate pass with its own transfers (the unfused baseline)."""
        self.pending = PendingUpdate.of(self.cfg, step, seed, g, lr, wd)
        if not self.cfg.fused_update:
            self.flush(step)

    def finish_zo(self, step: int, st: ZOStep, losses: list[torch.Tensor], lr: float,
                  wd: float) -> StepOutput:
        """The end of a ZO step from its passes' losses: the mean over ranks (data parallel),
        the update's coefficients (``step.estimate``) kept pending (``defer``)."""
        if self.reduce is not None:
            losses = list(self.reduce(torch.stack(losses)).unbind())
        coefs, g = estimate(losses, st)
        self.defer(step, st.seed, coefs, lr, wd)
        self.timer.poll()
        return step_output(losses, st, coefs, g)

    @torch.no_grad()
    def flush(self, step: int = -1) -> None:
        """Apply the pending update everywhere (end of training, before eval or a checkpoint)."""
        upd, self.pending = self.pending, None
        if upd is None:
            return
        s, ops = self.streamer, self.ops
        if not s.ends:
            with self.timer.span("update", "compute", s.streams.compute, step, EMBED):
                for k, group in ((0, s.embed), (len(s.blocks) + 1, s.head)):
                    apply_update(ops, group.flat, group.layout, upd, state=self.group_state(k))
        s.stream_blocks(step, lambda i, flat, apply: apply_update(
            ops, flat, s.group(i).layout, upd, apply, s.state_for(i)),
                        write_back=True, op="update", state=True)

    def group_state(self, k: int) -> torch.Tensor | None:
        """Group k's (canonical index) optimizer state on the device (None: none kept)."""
        st = self.streamer.opt_state
        return None if st is None else st.for_group(k)

    @torch.no_grad()
    def evaluate(self, dev, batch_size: int, total: Total | None = None) -> dict[str, float]:
        """The objective's metrics on ``dev`` with the current weights; every forward pass
        (one per eval batch, one per generated token) streams the blocks read-only."""
        self.flush()
        return evaluate(self.objective, self.adapter, dev, self.device, self.cfg.amp, batch_size,
                        self.streamed_forward, total,
                        self.streamed_head if self.streamer.ends else None)

    def streamed_forward(self, input_ids: torch.Tensor,
                         attention_mask: torch.Tensor) -> torch.Tensor:
        """Final hidden states (B, T, D) with the current weights (the update flushed first),
        the blocks (and a streamed embedding) through the GPU once, read-only
        (``models/generate.py::Forward``)."""
        adapter, s, inputs = self.adapter, self.streamer, Inputs(input_ids, attention_mask)
        state: list = [None, None]  # hidden states, block context
        if not s.ends:
            state[:] = adapter.embed(inputs)

        def forward(i: int, flat: torch.Tensor, apply) -> None:
            if i == EMBED:
                state[:] = adapter.embed(inputs)
            else:
                state[0] = adapter.run_block(adapter.blocks[i], state[0], state[1])

        s.stream_blocks(-1, forward, write_back=False, op="eval",  # a streamed head: apart
                        units=s.order[:-1] if s.ends else None)  # (``streamed_head``)
        return state[0]

    def streamed_head(self, hidden: torch.Tensor, ctx=None) -> torch.Tensor:
        """``BlockAdapter.head`` with a streamed head: its one unit uploaded, read-only."""
        out: list = [None]

        def head(i: int, flat: torch.Tensor, apply) -> None:
            out[0] = self.adapter.head(hidden, ctx)

        self.streamer.stream_blocks(-1, head, write_back=False, op="eval",
                                    units=self.streamer.order[-1:])
        return out[0]

    # --- state ------------------------------------------------------------------------------
    def state_flats(self) -> Sequence[torch.Tensor]:
        return self.streamer.state_flats()

    def base_flats(self) -> list[torch.Tensor]:
        """No frozen base: every weight trains."""
        return []

    def load_state_flats(self, flats: list[torch.Tensor]) -> None:
        self.streamer.load_state_flats(flats)

    def group_layouts(self) -> list[GroupLayout]:
        return self.streamer.group_layouts()

    def snapshot(self, next_step: int):
        return self.streamer.snapshot(next_step, self.pending)

    def restore(self, snap: Snapshot) -> None:
        self.streamer.load_state_flats(snap.flats)
        self.streamer.load_opt_state(snap)
        self.pending = pending_from_dict(snap.pending, self.device)

    def gpu_param_bytes(self) -> int:
        return self.streamer.gpu_param_bytes()

    def host_report(self) -> dict[str, int]:
        """Host bytes of the streamed blocks this rank sees, and how many of them it allocated
        itself (``private``), created for its node or mapped from it (data parallel)."""
        total, node = self.streamer.host_param_bytes(), self.streamer.node
        return {"streamed_bytes": total,
                "private_bytes": total - node.created_bytes - node.mapped_bytes,
                "created_bytes": node.created_bytes, "mapped_bytes": node.mapped_bytes}

    def close(self) -> None:
        """Drain transfers and timing events, free GPU and pinned host memory."""
        self.streamer.close()
        self.timer.poll(wait=True)


class ZOOffloadEngine(StreamedEngine):
    """Method ``zo-offload``: MeZO's step over the streamed model, bit-equal to ``MeZOEngine``
    for every scheduler knob."""

    def __init__(self, model, source, cfg: RunConfig, device: torch.device, bus: EventBus,
                 share: NodeShare | None = None, objective: Objective | None = None):
        super().__init__(model, source, cfg, device, bus, share, objective)
        s = self.streamer
        copies = ZOStep.of(cfg, 0).passes - 1  # the last pass reads the group itself
        self.tied = (TiedHead(s.embed, self.adapter.head_modules, cfg.amp, copies)
                     if tied_with_embed(s.embed.layout, self.adapter.head_modules) else None)

    def buffer_bytes(self) -> dict[str, int]:
        """The engine's own device buffers by item (bytes): the streamer's and the tied head
        weight copy."""
        tied = {"tied head weight copy": self.tied.nbytes} if self.tied is not None else {}
        return {**self.streamer.buffer_bytes(), **tied}

    def gpu_param_bytes(self) -> int:
        return sum(self.buffer_bytes().values()) if self.device.type == "cuda" else 0

    @torch.no_grad()
    def step(self, batch: Batch, step: int, lr: float, wd: float) -> StepOutput:
        """One ZO step over the streamed model (``cfg.queries`` perturbations, every pass of a
        block during its one visit); returns the loss, g, L+ and L- as 0-d device tensors."""
        ops, adapter, s = self.ops, self.adapter, self.streamer
        st = ZOStep.of(self.cfg, step, self.pending)
        emb, tied, compute, n = s.embed, self.tied, s.streams.compute, st.passes
        if s.ends:
            return self._step_streamed_ends(batch, step, st, lr, wd)
        with autocast(self.device, self.cfg.amp):
            with self.timer.span("compute", "compute", compute, step, EMBED):
                embed_passes = zo_passes(ops, emb.flat, emb.layout, st,
                                         state=self.group_state(0))
                hidden, ctx = [], None
                for k in range(n):
                    next(embed_passes)
                    h, ctx = adapter.embed(batch)
                    hidden.append(h)
                    if tied is not None and k < n - 1:
                        tied.keep(k)  # the tied weight at pass k, for the head's pass k
                if tied is None:
                    next(embed_passes, None)  # restore (tied: after the head's last pass)

            def dual_forward(i: int, flat: torch.Tensor, apply) -> None:
                block = adapter.blocks[i]
                for k in zo_passes(ops, flat, s.blocks[i].layout, st, apply=apply,
                                   state=s.state_for(i)):
                    hidden[k] = adapter.run_block(block, hidden[k], ctx)

            s.stream_blocks(step, dual_forward, write_back=True,
                            state=st.pending is not None or st.rule == "hizoo")  # (H scales z)
            losses = [None] * n
            with self.timer.span("compute", "compute", compute, step, HEAD):
                for k in zo_passes(ops, s.head.flat, s.head.layout, st,
                                   state=self.group_state(len(s.blocks) + 1)):
                    if tied is not None:  # the head sees the tied weight at pass k
                        tied.bind_for(k, last=k == n - 1)
                    losses[k] = head_loss(self.objective, adapter, hidden[k], batch)
                if tied is not None:
                    tied.unbind()
                next(embed_passes, None)  # a tied embedding's restore
        return self.finish_zo(step, st, losses, lr, wd)

    def _step_streamed_ends(self, batch: Batch, step: int, st: ZOStep, lr: float,
                            wd: float) -> StepOutput:
        """``step`` with ``stream_embeddings``: one streamed pass visits the embedding, the
        blocks and the head in order, each visit running every ZO pass of its unit."""
        ops, adapter, s, n = self.ops, self.adapter, self.streamer, st.passes
        hidden: list = [None] * n
        losses: list = [None] * n
        ctx: list = [None]

        def visit(i: int, flat: torch.Tensor, apply) -> None:
            passes = zo_passes(ops, flat, s.group(i).layout, st, apply=apply,
                               state=s.state_for(i))
            for k in passes:
                if i == EMBED:
                    hidden[k], ctx[0] = adapter.embed(batch)
                elif i == HEAD:
                    losses[k] = head_loss(self.objective, adapter, hidden[k], batch)
                else:
                    hidden[k] = adapter.run_block(adapter.blocks[i], hidden[k], ctx[0])

        with autocast(self.device, self.cfg.amp):
            s.stream_blocks(step, visit, write_back=True,
                            state=st.pending is not None or st.rule == "hizoo")  # (H scales z)
        return self.finish_zo(step, st, losses, lr, wd)
