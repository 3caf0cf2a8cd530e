"""ZO-Offloading: transformer blocks stream host -> GPU -> host, one PCIe round trip per step.

The engine is the full-parameter streamed holder (``stream/holder.py``: the weights behind a
``BlockStreamer``, their pending update) composed with this module's rule, ``ZOStreamStep``
(``streamed.py`` composes them). The arithmetic is ``zo/step.py``'s.

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

import torch

from workbench.config import RunConfig
from workbench.data.batches import Batch
from workbench.engine.device.shared_host import NodeShare
from workbench.engine.events import EMBED, HEAD, EventBus
from workbench.engine.groups import tied_with_embed
from workbench.engine.methods.streamed import Holder, StreamedEngine
from workbench.engine.objective import Objective, head_loss
from workbench.engine.precision import autocast
from workbench.engine.protocol import StepOutput
from workbench.engine.stream.holder import StreamedWeights
from workbench.engine.zo.estimate import estimate, step_output
from workbench.engine.zo.step import ZOStep, zo_passes
from workbench.engine.zo.tied import TiedHead


def finish_zo(weights: Holder, step: int, st: ZOStep, losses: list[torch.Tensor], lr: float,
              wd: float) -> StepOutput:
    """The end of a ZO step over a streamed holder from its passes' losses: the mean over ranks
    (data parallel), the update's coefficients (``estimate.estimate``) kept pending by the
    holder (``defer``)."""
    if weights.reduce is not None:
        losses = list(weights.reduce(torch.stack(losses)).unbind())
    coefs, g = estimate(losses, st)
    weights.defer(step, st.seed, coefs, lr, wd)
    weights.timer.poll()
    return step_output(losses, st, coefs, g)


class ZOStreamStep:
    """MeZO's step over the full-parameter streamed holder, bit-equal to ``MeZOEngine`` for
    every scheduler knob. Args: ``weights``, the holder it will step (a tied head weight keeps
    its perturbed copies here: ``tied.py``)."""

    def __init__(self, weights: StreamedWeights):
        s, adapter, cfg = weights.streamer, weights.adapter, weights.cfg
        copies = ZOStep.of(cfg, 0).passes - 1  # the last pass reads the group itself
        self.tied = (TiedHead(s.embed, adapter.head_modules, cfg.amp, copies)
                     if tied_with_embed(s.embed.layout, adapter.head_modules) else None)

    def buffer_bytes(self) -> dict[str, int]:
        """The tied head weight copy, if the model ties one."""
        return {"tied head weight copy": self.tied.nbytes} if self.tied is not None else {}

    @torch.no_grad()
    def step(self, weights: StreamedWeights, batch: Batch, step: int, lr: float,
             wd: float) -> StepOutput:
        """One ZO step over the streamed model (``cfg.queries`` perturbations, every pass of a
        block during its one visit); returns the loss, g, L+ and L- as 0-d device tensors."""
        ops, adapter, s, timer = weights.ops, weights.adapter, weights.streamer, weights.timer
        st = ZOStep.of(weights.cfg, step, weights.pending)
        emb, tied, compute, n = s.embed, self.tied, s.streams.compute, st.passes
        if s.ends:
            return self._step_streamed_ends(weights, batch, step, st, lr, wd)
        with autocast(weights.device, weights.cfg.amp):
            with timer.span("compute", "compute", compute, step, EMBED):
                embed_passes = zo_passes(ops, emb.flat, emb.layout, st,
                                         state=weights.group_state(0))
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
            with timer.span("compute", "compute", compute, step, HEAD):
                for k in zo_passes(ops, s.head.flat, s.head.layout, st,
                                   state=weights.group_state(len(s.blocks) + 1)):
                    if tied is not None:  # the head sees the tied weight at pass k
                        tied.bind_for(k, last=k == n - 1)
                    losses[k] = head_loss(weights.objective, adapter, hidden[k], batch)
                if tied is not None:
                    tied.unbind()
                next(embed_passes, None)  # a tied embedding's restore
        return finish_zo(weights, step, st, losses, lr, wd)

    def _step_streamed_ends(self, weights: StreamedWeights, batch: Batch, step: int,
                            st: ZOStep, lr: float, wd: float) -> StepOutput:
        """``step`` with ``stream_embeddings``: one streamed pass visits the embedding, the
        blocks and the head in order, each visit running every ZO pass of its unit."""
        ops, adapter, s, n = weights.ops, weights.adapter, weights.streamer, st.passes
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
                    losses[k] = head_loss(weights.objective, adapter, hidden[k], batch)
                else:
                    hidden[k] = adapter.run_block(adapter.blocks[i], hidden[k], ctx[0])

        with autocast(weights.device, weights.cfg.amp):
            s.stream_blocks(step, visit, write_back=True,
                            state=st.pending is not None or st.rule == "hizoo")  # (H scales z)
        return finish_zo(weights, step, st, losses, lr, wd)


def zo_offload_engine(model, source, cfg: RunConfig, device: torch.device, bus: EventBus,
                      share: NodeShare | None = None,
                      objective: Objective | None = None) -> StreamedEngine:
    """Method ``zo-offload`` (full parameters): the streamed holder and the ZO step. Args: as
    ``StreamedWeights``."""
    weights = StreamedWeights(model, source, cfg, device, bus, share, objective)
    return StreamedEngine(weights, ZOStreamStep(weights))
