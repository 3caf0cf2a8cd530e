"""Forward-gradient training (ZeROf-Offload) through the block-streaming scheduler.

One forward pass per step in forward-mode AD gives the exact directional derivative
d = grad f . v for a seeded direction v ~ N(0, I); the update is theta <- theta - lr (d v + wd
theta), the same form as a ZO step with g = d, so the pending update, the fused update on the
next upload, the codecs and checkpoints all carry over unchanged (``StreamedEngine``).

Blocks stream exactly as in zo-offload; each block's tangent v is regenerated from (seed, group)
on the device into a block-sized buffer (``step.jvp_tangent``), never stored on the host.
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
from workbench.engine.objective import head_loss
from workbench.engine.precision import autocast
from workbench.engine.protocol import StepOutput
from workbench.engine.zo.lora_offload import LoRAStreamedEngine
from workbench.engine.zo.offload import StreamedEngine
from workbench.engine.zo.perturb import ZOOps
from workbench.engine.zo.step import ApplyUpdate, ZOStep, jvp_tangent, step_seed


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
    return StepOutput(loss, d, forward_passes=1)  # one forward-mode pass


class JVPStep:
    """forward-grad's step for an engine over a ``BlockStreamer``. Full parameters: every group
    carries a tangent and streamed blocks are written back; ``peft=lora``: only each block's
    adapters (``_tangent_group``), over a frozen base that only comes up."""

    @torch.no_grad()
    def step(self, batch: Batch, step: int, lr: float, wd: float) -> StepOutput:
        """One forward-gradient step; returns the loss and d as 0-d device tensors."""
        adapter, s, ops = self.adapter, self.streamer, self.ops
        st = ZOStep(step_seed(self.cfg.seed, step), self.cfg.eps, self.pending)
        compute = s.streams.compute
        trained = self.cfg.peft == "none"  # the embedding, head and base blocks train
        ends = (s.embed, s.head) if trained else ()
        with fwAD.dual_level(), sdpa_kernel(SDPBackend.MATH), autocast(self.device, self.cfg.amp):
            with self.timer.span("jvp", "compute", compute, step, EMBED):
                if trained:
                    bind_dual(ops, s.embed.layout, s.embed.flat, st)
                hidden, ctx = adapter.embed(batch)
            state = [hidden]

            def jvp_block(i: int, flat: torch.Tensor, apply: ApplyUpdate | None) -> None:
                lay, weights, apply = self._tangent_group(i, flat, apply)
                plain = bind_dual(ops, lay, weights, st, apply)
                state[0] = adapter.run_block(adapter.blocks[i], state[0], ctx)
                lay.bind(plain)  # drop the group's tangent now: one block's z alive at a time

            s.stream_blocks(step, jvp_block, write_back=trained, op="jvp")
            with self.timer.span("jvp", "compute", compute, step, HEAD):
                if trained:
                    bind_dual(ops, s.head.layout, s.head.flat, st)
                loss, d = unpack(head_loss(self.objective, adapter, state[0], batch))
        for group in ends:
            group.bind()  # (blocks put their plain weights back as they ran)
        return finish_jvp(self, step, st, loss, d, lr, wd)

    def _tangent_group(self, i: int, flat: torch.Tensor, apply: ApplyUpdate | None):
        """(layout, weights, update) of block i's group that carries the tangent: the block."""
        return self.streamer.blocks[i].layout, flat, apply


class ForwardGradEngine(JVPStep, StreamedEngine):
    """Method ``forward-grad``: the streamed pipeline with a jvp in place of the dual forward.
    Same constructor and knobs as ``ZOOffloadEngine``."""


class LoRAForwardGradEngine(JVPStep, LoRAStreamedEngine):
    """Method ``forward-grad`` with ``peft=lora``: the jvp along a tangent on the adapters."""

    def _tangent_group(self, i: int, flat: torch.Tensor, apply: ApplyUpdate | None):
        """Block i's adapters, resident: their pending update is applied in place."""
        lora = self.loras[i]
        return lora.layout, lora.flat, None
