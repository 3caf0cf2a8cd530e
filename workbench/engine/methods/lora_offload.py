"""zo-offload with ``peft=lora``: ZO steps on adapters over a frozen, streamed base.

The engine is the streamed adapter holder (``stream/adapters.py``: resident adapters, their
pending update, state and snapshots, over a base that only comes up) composed with this
module's rule, ``ZOAdapterStep``; ``forward_grad.py`` composes the same holder with the jvp.
Each block's ZO passes run on its adapter group while the block's base sits in its slot, the +
and - hidden states travelling together as in ``zo_offload.py``; the embedding is frozen and
resident, so it runs once per step for every pass.

Bit-equal to ``MeZOEngine`` with the same ``peft`` and ``base_codec`` for every scheduler knob:
the adapters see the same ``step.py`` arithmetic and the base the same decoded values.
"""
from __future__ import annotations

import torch

from workbench.config import RunConfig
from workbench.data.batches import Batch
from workbench.engine.device.shared_host import NodeShare
from workbench.engine.events import EMBED, HEAD, EventBus
from workbench.engine.methods.streamed import StreamedEngine
from workbench.engine.methods.zo_offload import finish_zo
from workbench.engine.objective import Objective, head_loss
from workbench.engine.precision import autocast
from workbench.engine.protocol import StepOutput
from workbench.engine.stream.adapters import StreamedAdapters
from workbench.engine.zo.step import ZOStep, zo_passes


class ZOAdapterStep:
    """The ZO step on the adapters of a ``StreamedAdapters`` holder."""

    def buffer_bytes(self) -> dict[str, int]:
        """None of its own: the adapters and their state are the holder's."""
        return {}

    @torch.no_grad()
    def step(self, weights: StreamedAdapters, batch: Batch, step: int, lr: float,
             wd: float) -> StepOutput:
        """One ZO step on the adapters; returns the loss, g, L+ and L- as 0-d device tensors."""
        adapter, s, ops = weights.adapter, weights.streamer, weights.ops
        st = ZOStep.of(weights.cfg, step, weights.pending)
        compute = s.streams.compute
        with autocast(weights.device, weights.cfg.amp):
            with weights.timer.span("compute", "compute", compute, step, EMBED):
                h, ctx = adapter.embed(batch)  # frozen: one pass serves every perturbed one
            hidden = [h] * st.passes

            def dual_forward(i: int, base: torch.Tensor, apply) -> None:
                # the adapters; the pending update is fused into their first perturbation
                layout, flat, _, state = weights.trained_block(i, base, apply)
                for k in zo_passes(ops, flat, layout, st, state=state):
                    hidden[k] = adapter.run_block(adapter.blocks[i], hidden[k], ctx)

            s.stream_blocks(step, dual_forward, write_back=False)
            with weights.timer.span("compute", "compute", compute, step, HEAD):
                losses = [head_loss(weights.objective, adapter, hidden[k], batch)
                          for k in range(st.passes)]
        return finish_zo(weights, step, st, losses, lr, wd)


def lora_offload_engine(model, source, cfg: RunConfig, device: torch.device, bus: EventBus,
                        share: NodeShare | None = None,
                        objective: Objective | None = None) -> StreamedEngine:
    """Method ``zo-offload`` with ``peft=lora``: the streamed adapter holder and the ZO step.
    Args: as ``StreamedAdapters``."""
    return StreamedEngine(StreamedAdapters(model, source, cfg, device, bus, share, objective),
                          ZOAdapterStep())
