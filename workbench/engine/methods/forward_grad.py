"""Forward-gradient training (ZeROf-Offload) through the block-streaming scheduler.

One forward pass per step in forward-mode AD gives the exact directional derivative
d = grad f . v for a seeded direction v ~ N(0, I); the update is theta <- theta - lr (d v + wd
theta), the same form as a ZO step with g = d, so the pending update, the fused update on the
next upload, the codecs and checkpoints all carry over unchanged: the engine is a streamed holder
(``stream/holder.py`` or, with ``peft=lora``, ``stream/adapters.py``) composed with this module's
rule, ``JVPStep``.

Blocks stream exactly as in zo-offload; each block's tangent v is regenerated from (seed, group)
on the device into a block-sized buffer (``step.jvp_tangent``), never stored on the host.
Forward AD has no formula for the flash / memory-efficient SDPA kernels, so attention runs on
SDPA's math backend here (on every device), which is what makes autocast usable too.

With ``peft=lora`` the tangent lives on the resident adapters only (the holder's
``trained_block``): the frozen base streams up and never back, the embedding and head are plain,
and d = grad f . v over the adapter weights.
"""
from __future__ import annotations

import torch
import torch.autograd.forward_ad as fwAD
from torch.nn.attention import SDPBackend, sdpa_kernel

from workbench.config import RunConfig
from workbench.data.batches import Batch
from workbench.engine.device.shared_host import NodeShare
from workbench.engine.events import EMBED, HEAD, EventBus
from workbench.engine.groups import GroupLayout
from workbench.engine.methods.streamed import Holder, StreamedEngine
from workbench.engine.objective import Objective, head_loss
from workbench.engine.precision import autocast
from workbench.engine.protocol import StepOutput
from workbench.engine.stream.adapters import StreamedAdapters
from workbench.engine.stream.holder import StreamedWeights
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


def finish_jvp(weights: Holder, step: int, st: ZOStep, loss: torch.Tensor,
               d: torch.Tensor, lr: float, wd: float) -> StepOutput:
    """The end of a forward-gradient step: the mean over ranks (data parallel), the update
    kept pending by the holder (``defer``)."""
    if weights.reduce is not None:
        loss, d = weights.reduce(torch.stack([loss.float(), d])).unbind()
    weights.defer(step, st.seed, d, lr, wd)
    weights.timer.poll()
    return StepOutput(loss, d, forward_passes=1)  # one forward-mode pass


class JVPStep:
    """forward-grad's step over a streamed holder. Full parameters: every group carries a
    tangent and streamed blocks are written back; adapters: only each block's adapters (the
    holder's ``trained_block``), over a frozen base that only comes up."""

    def buffer_bytes(self) -> dict[str, int]:
        """None of its own: each block's tangent lives only while the block runs."""
        return {}

    @torch.no_grad()
    def step(self, weights: Holder, batch: Batch, step: int, lr: float,
             wd: float) -> StepOutput:
        """One forward-gradient step; returns the loss and d as 0-d device tensors."""
        adapter, s, ops, cfg = weights.adapter, weights.streamer, weights.ops, weights.cfg
        st = ZOStep(step_seed(cfg.seed, step), cfg.eps, weights.pending)
        compute = s.streams.compute
        trained = weights.trains_all  # the embedding, head and base blocks train
        ends = (s.embed, s.head) if trained else ()
        with fwAD.dual_level(), sdpa_kernel(SDPBackend.MATH), autocast(weights.device, cfg.amp):
            with weights.timer.span("jvp", "compute", compute, step, EMBED):
                if trained:
                    bind_dual(ops, s.embed.layout, s.embed.flat, st)
                hidden, ctx = adapter.embed(batch)
            state = [hidden]

            def jvp_block(i: int, flat: torch.Tensor, apply: ApplyUpdate | None) -> None:
                lay, group, apply, _ = weights.trained_block(i, flat, apply)
                plain = bind_dual(ops, lay, group, st, apply)
                state[0] = adapter.run_block(adapter.blocks[i], state[0], ctx)
                lay.bind(plain)  # drop the group's tangent now: one block's z alive at a time

            s.stream_blocks(step, jvp_block, write_back=trained, op="jvp")
            with weights.timer.span("jvp", "compute", compute, step, HEAD):
                if trained:
                    bind_dual(ops, s.head.layout, s.head.flat, st)
                loss, d = unpack(head_loss(weights.objective, adapter, state[0], batch))
        for group in ends:
            group.bind()  # (blocks put their plain weights back as they ran)
        return finish_jvp(weights, step, st, loss, d, lr, wd)


def forward_grad_engine(model, source, cfg: RunConfig, device: torch.device, bus: EventBus,
                        share: NodeShare | None = None,
                        objective: Objective | None = None) -> StreamedEngine:
    """Method ``forward-grad``: the streamed holder (adapters over the frozen stream with
    ``peft=lora``) and the jvp step. Args: as ``StreamedWeights``."""
    holder = StreamedAdapters if cfg.peft == "lora" else StreamedWeights
    return StreamedEngine(holder(model, source, cfg, device, bus, share, objective), JVPStep())
