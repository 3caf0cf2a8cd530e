"""Forward-gradient training (ZeROf-Offload) through the block-streaming scheduler.

One forward pass per step in forward-mode AD gives the exact directional derivative
d = grad f . v for a seeded direction v ~ N(0, I); the update is theta <- theta - lr (d v + wd
theta), the same form as a ZO step with g = d, so the pending update, the fused update on the
next upload, the codecs and checkpoints all carry over unchanged (``StreamedEngine``).

Blocks stream exactly as in zo-offload; each block's tangent v is regenerated from (seed, group)
on the device into a block-sized buffer (``zo_step.jvp_tangent``), never stored on the host.
Forward AD has no formula for the flash / memory-efficient SDPA kernels, so attention runs on
SDPA's math backend here (on every device), which is what makes autocast usable too.

With ``peft=lora`` (``LoRAForwardGradEngine``) the tangent lives on the resident adapters only:
the frozen base streams up and never back (``lora_offload.py``), the embedding and head are
plain, and d = grad f . v over the adapter weights.
"""
from __future__ import annotations

import torch
import torch.autograd.forward_ad as fwAD
from torch.nn.attention import SDPBackend, sdpa_kernel

from workbench.data.batches import Batch
from workbench.engine.events import EMBED, HEAD
from workbench.engine.groups import GroupLayout
from workbench.engine.lora_offload import LoRAStreamedEngine
from workbench.engine.objective import head_loss
from workbench.engine.offload import StreamedEngine
from workbench.engine.perturb import ZOOps
from workbench.engine.protocol import StepOutput
from workbench.engine.zo_common import autocast, step_seed
from workbench.engine.zo_step import ApplyUpdate, ZOStep, jvp_tangent


def bind_dual(ops: ZOOps, layout: GroupLayout, flat: torch.Tensor, st: ZOStep,
              apply: ApplyUpdate | None = None) -> list:
    """Apply the group's pending update and bind its weights as dual tensors whose tangent is
    z(seed, group); returns what was bound before, to put back once the group has run."""
    if not layout.numel:
        return []
    previous = [e.owners[0][0]._parameters[e.owners[0][1]] for e in layout.entries]
    v = jvp_tangent(ops, flat, layout, st, apply)
    layout.bind([fwAD.make_dual(w, t) for w, t in zip(layout.views(flat), layout.views(v))])
    return previous


def unpack(loss_dual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, d) of the dual loss as plain tensors (they outlive the dual level), d in fp32."""
    loss, d = fwAD.unpack_dual(loss_dual)
    return loss.detach().clone(), d.detach().clone().float()


def finish_jvp(engine: StreamedEngine, step: int, st: ZOStep, loss: torch.Tensor,
               d: torch.Tensor, lr: float, wd: float) -> StepOutput:
    """The end of a forward-gradient step: the mean over ranks (data parallel), the update
    kept pending (``StreamedEngine.defer``)."""
    if engine.reduce is not None:
        loss, d = engine.reduce(torch.stack([loss.float(), d])).unbind()
    engine.defer(step, st.seed, d, lr, wd)
    engine.timer.poll()
    return StepOutput(loss, d)


class ForwardGradEngine(StreamedEngine):
    """Method ``forward-grad``: the streamed pipeline with a jvp in place of the dual forward.
    Same constructor and knobs as ``ZOOffloadEngine``."""

    @torch.no_grad()
    def step(self, batch: Batch, step: int, lr: float, wd: float) -> StepOutput:
        """One forward-gradient step; returns the loss and d as 0-d device tensors."""
        adapter, s, ops = self.adapter, self.streamer, self.ops
        st = ZOStep(step_seed(self.cfg.seed, step), self.cfg.eps, self.pending)
        compute = s.streams.compute
        with fwAD.dual_level(), sdpa_kernel(SDPBackend.MATH), autocast(self.device, self.cfg.amp):
            with self.timer.span("jvp", "compute", compute, step, EMBED):
                bind_dual(ops, s.embed.layout, s.embed.flat, st)
                hidden, ctx = adapter.embed(batch)
            state = [hidden]

            def jvp_block(i: int, flat: torch.Tensor, apply: ApplyUpdate | None) -> None:
                lay = s.blocks[i].layout
                plain = bind_dual(ops, lay, flat, st, apply)
                state[0] = adapter.run_block(adapter.blocks[i], state[0], ctx)
                lay.bind(plain)  # drop the block's tangent now: one block's z alive at a time

            s.stream_blocks(step, jvp_block, write_back=True, op="jvp")
            with self.timer.span("jvp", "compute", compute, step, HEAD):
                bind_dual(ops, s.head.layout, s.head.flat, st)
                loss, d = unpack(head_loss(self.objective, adapter, state[0], batch))
        s.embed.bind()
        s.head.bind()  # (blocks put their plain weights back as they ran)
        return finish_jvp(self, step, st, loss, d, lr, wd)


class LoRAForwardGradEngine(LoRAStreamedEngine):
    """Method ``forward-grad`` with ``peft=lora``: the jvp along a tangent on the adapters."""

    @torch.no_grad()
    def step(self, batch: Batch, step: int, lr: float, wd: float) -> StepOutput:
        """One forward-gradient step on the adapters; returns the loss and d (0-d, device)."""
        adapter, s, ops = self.adapter, self.streamer, self.ops
        st = ZOStep(step_seed(self.cfg.seed, step), self.cfg.eps, self.pending)
        compute = s.streams.compute
        with fwAD.dual_level(), sdpa_kernel(SDPBackend.MATH), autocast(self.device, self.cfg.amp):
            with self.timer.span("jvp", "compute", compute, step, EMBED):
                hidden, ctx = adapter.embed(batch)  # frozen: no tangent
            state = [hidden]

            def jvp_block(i: int, base: torch.Tensor, apply: ApplyUpdate | None) -> None:
                lora = self.loras[i]  # resident: its pending update is applied in place here
                bind_dual(ops, lora.layout, lora.flat, st)
                state[0] = adapter.run_block(adapter.blocks[i], state[0], ctx)
                lora.bind()  # drop the adapter's tangent now: one block's z alive at a time

            s.stream_blocks(step, jvp_block, write_back=False, op="jvp")
            with self.timer.span("jvp", "compute", compute, step, HEAD):
                loss, d = unpack(head_loss(self.objective, adapter, state[0], batch))
        return finish_jvp(self, step, st, loss, d, lr, wd)
