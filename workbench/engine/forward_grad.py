"""Forward-gradient training (ZeROf-Offload) through the block-streaming engine.

One forward pass per step in forward-mode AD gives the exact directional derivative
d = grad f . v for a seeded direction v ~ N(0, I); the update is theta <- theta - lr (d v + wd
theta), the same form as a ZO step with g = d, so the pending-update machinery, the fused
update on the next upload, the codecs and checkpoints all carry over unchanged.

Blocks stream exactly as in zo-offload; each block's tangent v is regenerated from (seed, group)
on the device into a block-sized buffer, never stored on the host. Forward AD has no formula for
the flash / memory-efficient SDPA kernels, so attention runs on SDPA's math backend here (on
every device), which is what makes autocast usable too.
"""
from __future__ import annotations

import torch
import torch.autograd.forward_ad as fwAD
from torch.nn.attention import SDPBackend, sdpa_kernel

from workbench.data.batches import Batch
from workbench.engine import StepOutput
from workbench.engine.events import EMBED, HEAD
from workbench.engine.offload import ZOOffloadEngine
from workbench.engine.perturb import PendingUpdate
from workbench.engine.zo_common import Group, autocast, label_loss, step_seed


class ForwardGradEngine(ZOOffloadEngine):
    """Method ``forward-grad``: the zo-offload pipeline with a jvp in place of the dual forward.
    Same constructor and knobs as ``ZOOffloadEngine``."""

    def _bind_dual(self, layout, flat: torch.Tensor, seed: int) -> list:
        """Bind the group's weights as dual tensors whose tangent is z(seed, group); returns
        what was bound before, to put back once the group has run."""
        previous = [e.owners[0][0]._parameters[e.owners[0][1]] for e in layout.entries]
        v = self.ops.z(layout.numel, seed, layout.gid, flat.device)
        layout.bind([fwAD.make_dual(w, t) for w, t in zip(layout.views(flat), layout.views(v))])
        return previous

    def _dual_group(self, group: Group, upd: PendingUpdate | None, seed: int) -> None:
        if group.layout.numel:
            if upd is not None:
                self.ops.update(group.flat, group.layout, upd)
            self._bind_dual(group.layout, group.flat, seed)

    @torch.no_grad()
    def step(self, batch: Batch, step: int, lr: float, wd: float) -> StepOutput:
        """One forward-gradient step; returns the loss and d as 0-d device tensors."""
        cfg, adapter, upd = self.cfg, self.adapter, self.pending
        seed = step_seed(cfg.seed, step)
        compute = self.streams.compute
        with fwAD.dual_level(), sdpa_kernel(SDPBackend.MATH), autocast(self.device, cfg.amp):
            with self.timer.span("jvp", "compute", compute, step, EMBED):
                self._dual_group(self.embed, upd, seed)
                hidden, ctx = adapter.embed(batch)
            state = [hidden]

            def jvp_block(i: int, flat: torch.Tensor, extra: dict | None) -> None:
                if upd is not None:
                    self._update_block(i, flat, extra, upd)
                lay = self.blocks[i].layout
                plain = self._bind_dual(lay, flat, seed)
                state[0] = adapter.run_block(adapter.blocks[i], state[0], ctx)
                lay.bind(plain)  # drop the block's tangent now: one block's z alive at a time

            self._stream_blocks(step, jvp_block, write_back=True, op="jvp")
            with self.timer.span("jvp", "compute", compute, step, HEAD):
                self._dual_group(self.head, upd, seed)
                loss_dual = label_loss(adapter.head(state[0], ctx), batch)
                loss, d = fwAD.unpack_dual(loss_dual)
                loss = loss.detach().clone()  # plain tensors: the dual level ends below
                d = d.detach().clone().float()
        if self.reduce is not None:
            loss, d = self.reduce(torch.stack([loss.float(), d])).unbind()
        self.embed.bind()
        self.head.bind()  # (blocks put their plain weights back as they ran)
        self.pending = PendingUpdate(seed, d, lr, wd)
        if not cfg.fused_update:
            self.flush(step)
        self.timer.poll()
        return StepOutput(loss, d)
