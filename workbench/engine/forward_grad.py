"""Forward-gradient training (ZeROf-Offload) through the block-streaming scheduler.

One forward pass per step in forward-mode AD gives the exact directional derivative
d = grad f . v for a seeded direction v ~ N(0, I); the update is theta <- theta - lr (d v + wd
theta), the same form as a ZO step with g = d, so the pending update, the fused update on the
next upload, the codecs and checkpoints all carry over unchanged (``StreamedEngine``).

Blocks stream exactly as in zo-offload; each block's tangent v is regenerated from (seed, group)
on the device into a block-sized buffer (``zo_step.jvp_tangent``), never stored on the host.
Forward AD has no formula for the flash / memory-efficient SDPA kernels, so attention runs on
SDPA's math backend here (on every device), which is what makes autocast usable too.
"""
from __future__ import annotations

import torch
import torch.autograd.forward_ad as fwAD
from torch.nn.attention import SDPBackend, sdpa_kernel

from workbench.data.batches import Batch
from workbench.engine.events import EMBED, HEAD
from workbench.engine.groups import GroupLayout
from workbench.engine.objective import head_loss
from workbench.engine.offload import StreamedEngine
from workbench.engine.protocol import StepOutput
from workbench.engine.zo_common import autocast, step_seed
from workbench.engine.zo_step import ApplyUpdate, ZOStep, jvp_tangent


class ForwardGradEngine(StreamedEngine):
    """Method ``forward-grad``: the streamed pipeline with a jvp in place of the dual forward.
    Same constructor and knobs as ``ZOOffloadEngine``."""

    def _bind_dual(self, layout: GroupLayout, flat: torch.Tensor, st: ZOStep,
                   apply: ApplyUpdate | None = None) -> list:
        """Apply the group's pending update and bind its weights as dual tensors whose tangent
        is z(seed, group); returns what was bound before, to put back once the group has run."""
        if not layout.numel:
            return []
        previous = [e.owners[0][0]._parameters[e.owners[0][1]] for e in layout.entries]
        v = jvp_tangent(self.ops, flat, layout, st, apply)
        layout.bind([fwAD.make_dual(w, t) for w, t in zip(layout.views(flat), layout.views(v))])
        return previous

    @torch.no_grad()
    def step(self, batch: Batch, step: int, lr: float, wd: float) -> StepOutput:
        """One forward-gradient step; returns the loss and d as 0-d device tensors."""
        adapter, s = self.adapter, self.streamer
        st = ZOStep(step_seed(self.cfg.seed, step), self.cfg.eps, self.pending)
        compute = s.streams.compute
        with fwAD.dual_level(), sdpa_kernel(SDPBackend.MATH), autocast(self.device, self.cfg.amp):
            with self.timer.span("jvp", "compute", compute, step, EMBED):
                self._bind_dual(s.embed.layout, s.embed.flat, st)
                hidden, ctx = adapter.embed(batch)
            state = [hidden]

            def jvp_block(i: int, flat: torch.Tensor, apply: ApplyUpdate | None) -> None:
                lay = s.blocks[i].layout
                plain = self._bind_dual(lay, flat, st, apply)
                state[0] = adapter.run_block(adapter.blocks[i], state[0], ctx)
                lay.bind(plain)  # drop the block's tangent now: one block's z alive at a time

            s.stream_blocks(step, jvp_block, write_back=True, op="jvp")
            with self.timer.span("jvp", "compute", compute, step, HEAD):
                self._bind_dual(s.head.layout, s.head.flat, st)
                loss_dual = head_loss(self.objective, adapter, state[0], batch)
                loss, d = fwAD.unpack_dual(loss_dual)
                loss = loss.detach().clone()  # plain tensors: the dual level ends below
                d = d.detach().clone().float()
        if self.reduce is not None:
            loss, d = self.reduce(torch.stack([loss.float(), d])).unbind()
        s.embed.bind()
        s.head.bind()  # (blocks put their plain weights back as they ran)
        self.defer(step, st.seed, d, lr, wd)
        self.timer.poll()
        return StepOutput(loss, d)
