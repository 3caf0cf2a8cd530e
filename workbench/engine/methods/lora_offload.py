"""zo-offload with ``peft=lora``: ZO steps on adapters over a frozen, streamed base.

``LoRAStreamedEngine`` is the engine contract for adapters over the frozen stream (resident
adapters, their pending update, state and snapshots); ``LoRAOffloadEngine`` adds the ZO step,
``forward_grad.LoRAForwardGradEngine`` the forward-gradient step.

The base never changes, so each streamed block comes up (host -> GPU, in its ``base_codec``,
decoded into the slot) and is never sent back: no offload pass, no update pass over base
weights, no D2H traffic at all. The adapter groups (one per block, ``block.{i}.lora``) stay on
the GPU for the whole run; each block's ZO passes run on its adapter group while the block's
base sits in its slot, the + and - hidden states travelling together as in ``offload.py``. The
embedding and head are frozen and resident, so the embedding runs once per step for both passes.

Bit-equal to ``MeZOEngine`` with the same ``peft`` and ``base_codec`` for every scheduler knob:
the adapters see the same ``step.py`` arithmetic and the base the same decoded values.
"""
from __future__ import annotations

import torch

from workbench.config import RunConfig
from workbench.data.batches import Batch
from workbench.engine.checkpoint import Snapshot
from workbench.engine.events import EMBED, HEAD, EventBus
from workbench.engine.groups import GroupLayout, release
from workbench.engine.objective import Objective, head_loss
from workbench.engine.peft import adapter_groups
from workbench.engine.precision import autocast
from workbench.engine.protocol import StepOutput
from workbench.engine.snapshots import DeviceSnapshots
from workbench.engine.device.shared_host import NodeShare
from workbench.engine.methods.zo_offload import StreamedEngine
from workbench.engine.zo.optim import load_opt_state, new_state
from workbench.engine.zo.perturb import pending_from_dict
from workbench.engine.zo.step import ZOStep, apply_update, zo_passes


class LoRAStreamedEngine(StreamedEngine):
    """Everything but ``step`` for adapters over the frozen stream. Args: as
    ``StreamedEngine`` (``share``: the node's one host copy of the frozen base under data
    parallel; only local rank 0 fills it)."""

    def __init__(self, model, source, cfg: RunConfig, device: torch.device, bus: EventBus,
                 share: NodeShare | None = None, objective: Objective | None = None):
        super().__init__(model, source, cfg, device, bus, share, objective)  # a frozen streamer
        self.loras = adapter_groups(self.adapter, cfg, device)
        # momentum / adam: each adapter group's optimizer state beside it (else None)
        self.lora_state = [new_state(cfg.zo_optimizer, g.layout.numel, device)
                           for g in self.loras]
        self.snapshots = DeviceSnapshots(device, cfg.to_dict())  # of the adapters
        if cfg.checkpoint_every:  # at setup, not in the first snapshot's step
            self.snapshots.prepare(self._adapters(), pending=cfg.queries, state=self._state())

    @torch.no_grad()
    def flush(self, step: int = -1) -> None:
        """Apply the pending update to the adapters (resident: no block moves)."""
        upd, self.pending = self.pending, None
        if upd is None:
            return
        with self.timer.span("update", "compute", self.streamer.streams.compute, step, EMBED):
            for lora, state in zip(self.loras, self.lora_state):
                apply_update(self.ops, lora.flat, lora.layout, upd, state=state)

    # --- state: the adapters; the base is the streamer's ------------------------------------
    def state_flats(self) -> list[torch.Tensor]:
        return [g.flat for g in self.loras]

    def load_state_flats(self, flats: list[torch.Tensor]) -> None:
        for group, flat in zip(self.loras, flats):
            group.flat.copy_(flat)

    def base_flats(self) -> list[torch.Tensor]:
        """Embedding, every block's decoded base, head (host copies of streamed blocks)."""
        return self.streamer.state_flats()

    def group_layouts(self) -> list[GroupLayout]:
        return [g.layout for g in self.loras]

    def _adapters(self) -> dict[int, torch.Tensor]:
        return dict(enumerate(g.flat for g in self.loras))

    def _state(self) -> dict[int, torch.Tensor]:
        return {k: s for k, s in enumerate(self.lora_state) if s is not None}

    def snapshot(self, next_step: int):
        """Host copies of the adapters and the pending g (``engine/snapshots.py``; never
        blocking the step); returns the function the checkpoint writer calls. Call it only
        once the writer is done with the last one."""
        return self.snapshots.take(next_step, self._adapters(), self.group_layouts(),
                                   self.pending, state=self._state())

    def restore(self, snap: Snapshot) -> None:
        self.load_state_flats(snap.flats)
        load_opt_state(self.lora_state, snap)
        self.pending = pending_from_dict(snap.pending, self.device)

    def buffer_bytes(self) -> dict[str, int]:
        """The engine's own device buffers by item (bytes): the streamer's and the adapters."""
        state = sum(4 * s.numel() for s in self.lora_state if s is not None)
        return {**self.streamer.buffer_bytes(),
                "adapters (fp32)": sum(g.layout.nbytes for g in self.loras),
                **({"optimizer state": state} if state else {})}

    def gpu_param_bytes(self) -> int:
        return sum(self.buffer_bytes().values()) if self.device.type == "cuda" else 0

    def close(self) -> None:
        for group in self.loras:
            release(group.layout)
        self.loras, self.lora_state = [], []
        self.snapshots.release()
        super().close()


class LoRAOffloadEngine(LoRAStreamedEngine):
    """Method ``zo-offload`` with ``peft=lora``."""

    @torch.no_grad()
    def step(self, batch: Batch, step: int, lr: float, wd: float) -> StepOutput:
        """One ZO step on the adapters; returns the loss, g, L+ and L- as 0-d device tensors."""
        adapter, s, ops = self.adapter, self.streamer, self.ops
        st = ZOStep.of(self.cfg, step, self.pending)
        compute = s.streams.compute
        with autocast(self.device, self.cfg.amp):
            with self.timer.span("compute", "compute", compute, step, EMBED):
                h, ctx = adapter.embed(batch)  # frozen: one pass serves every perturbed one
            hidden = [h] * st.passes

            def dual_forward(i: int, base: torch.Tensor, apply) -> None:
                lora = self.loras[i]  # the pending update is fused into the first perturbation
                for k in zo_passes(ops, lora.flat, lora.layout, st, state=self.lora_state[i]):
                    hidden[k] = adapter.run_block(adapter.blocks[i], hidden[k], ctx)

            s.stream_blocks(step, dual_forward, write_back=False)
            with self.timer.span("compute", "compute", compute, step, HEAD):
                losses = [head_loss(self.objective, adapter, hidden[k], batch)
                          for k in range(st.passes)]
        return self.finish_zo(step, st, losses, lr, wd)
