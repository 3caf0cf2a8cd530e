"""The MeZO baseline: the whole model on one device, ZO-SGD exactly as MeZO describes it.

Per step with seed s: perturb every parameter by +eps z, forward; by -2 eps z, forward; by
+eps z (restore); g = (L+ - L-) / 2 eps; update w <- w - lr (g z + wd w). z is regenerated from
s each time, never stored; the groups' flat buffers make each of those passes one launch per
group. The arithmetic is ``step.py``'s, every group's passes driven together.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from workbench.config import RunConfig
from workbench.data.batches import Batch
from workbench.engine.checkpoint import Snapshot
from workbench.engine.events import EMBED, HEAD, EventBus
from workbench.engine.groups import move_buffers, release
from workbench.engine.objective import Total, evaluate, head_loss, objective_for
from workbench.engine.peft import base_values, block_adapter, model_groups
from workbench.engine.precision import autocast
from workbench.engine.protocol import StepOutput
from workbench.engine.snapshots import device_copies
from workbench.engine.stream.pinned import SnapshotBuffers
from workbench.engine.timing import OpTimer
from workbench.engine.zo.perturb import PendingUpdate, ZOOps
from workbench.engine.zo.step import (ZOStep, apply_update, lockstep, projected_grad, step_seed,
                                      zo_passes)


class MeZOEngine:
    """Args:
        model: a model skeleton (meta weights are fine) from ``build_skeleton``.
        source: where weights come from (random init or a checkpoint folder).
        cfg: the run config (eps, seed, amp, rng, telemetry).
        device: the one device everything lives on.
        bus: where operation events go.
    """

    def __init__(self, model, source, cfg: RunConfig, device: torch.device, bus: EventBus):
        self.cfg, self.device = cfg, device
        self.adapter = block_adapter(model, cfg)
        # The groups that train (``groups``) and those that stay as loaded (``frozen``).
        self.frozen, self.groups = model_groups(self.adapter, source, cfg, device)
        move_buffers([model], device)
        self.ops = ZOOps(cfg.rng, device)
        self.timer = OpTimer(device, bus, cfg.telemetry)
        self.objective = objective_for(cfg, model.config.vocab_size)
        self.bytes_h2d = self.bytes_d2h = 0
        # Data parallel: averages the shard losses over ranks (the only traffic of a step).
        self.reduce = None  # MeZO applies its update within the step
        self.snap_bufs = SnapshotBuffers(device.type == "cuda")
        if cfg.checkpoint_every:
            self._snapshot_buffers()  # at setup, not in the first snapshot's step

    # --- training ---------------------------------------------------------------------------
    def _loss(self, batch: Batch, step: int, sign: str) -> torch.Tensor:
        stream = torch.cuda.current_stream() if self.device.type == "cuda" else None
        with autocast(self.device, self.cfg.amp):
            with self.timer.span("compute", "compute", stream, step, EMBED, detail=sign):
                hidden, ctx = self.adapter.embed(batch)
            for i, block in enumerate(self.adapter.blocks):
                with self.timer.span("compute", "compute", stream, step, i, detail=sign):
                    hidden = self.adapter.run_block(block, hidden, ctx)
            with self.timer.span("compute", "compute", stream, step, HEAD, detail=sign):
                return head_loss(self.objective, self.adapter, hidden, batch)

    @torch.no_grad()
    def step(self, batch: Batch, step: int, lr: float, wd: float) -> StepOutput:
        """One ZO-SGD step; returns (L+, L-, g) as 0-d device tensors."""
        st = ZOStep(step_seed(self.cfg.seed, step), self.cfg.eps)
        passes = lockstep([zo_passes(self.ops, g.flat, g.layout, st) for g in self.groups])
        loss_plus, loss_minus = [self._loss(batch, step, "+-"[sign]) for sign in passes]
        if self.reduce is not None:
            loss_plus, loss_minus = self.reduce(torch.stack([loss_plus, loss_minus])).unbind()
        g = projected_grad(loss_plus, loss_minus, st.eps)
        upd = PendingUpdate(st.seed, g, lr, wd)
        stream = torch.cuda.current_stream() if self.device.type == "cuda" else None
        with self.timer.span("update", "compute", stream, step, EMBED):
            for group in self.groups:
                apply_update(self.ops, group.flat, group.layout, upd)
        self.timer.poll()
        return StepOutput((loss_plus + loss_minus) / 2, g, loss_plus, loss_minus)

    def flush(self) -> None:
        """Nothing is ever pending in MeZO."""

    def evaluate(self, dev, batch_size: int, total: Total | None = None) -> dict[str, float]:
        """The objective's metrics on ``dev`` with the current weights."""
        return evaluate(self.objective, self.adapter, dev, self.device, self.cfg.amp, batch_size,
                        total=total)

    # --- state ------------------------------------------------------------------------------
    def state_flats(self) -> list[torch.Tensor]:
        """Every trainable group's weights in canonical order (device tensors; callers copy)."""
        return [g.flat for g in self.groups]

    def base_flats(self) -> Sequence[torch.Tensor]:
        """The frozen base groups' weights as fp32, one at a time (peft runs; else empty)."""
        return base_values(self.frozen)

    def load_state_flats(self, flats: list[torch.Tensor]) -> None:
        for group, flat in zip(self.groups, flats):
            group.flat.copy_(flat)

    def group_layouts(self) -> list:
        return [g.layout for g in self.groups]

    def snapshot(self, next_step: int):
        """Start host copies of the weights (never blocking the step) into buffers kept from
        one snapshot to the next; returns a function the checkpoint writer calls to get the
        ``Snapshot``. Call it only once the writer is done with the last one."""
        bufs = self._snapshot_buffers()
        done = device_copies([g.flat for g in self.groups], bufs, self.device)
        names = [lay.name for lay in self.group_layouts()]

        def make() -> Snapshot:
            if done is not None:
                done.synchronize()  # writer thread: wait for the side-stream copies
            return Snapshot(next_step, bufs, names, None, self.cfg.to_dict(),
                            [lay.n_decay for lay in self.group_layouts()])

        return make

    def _snapshot_buffers(self) -> list[torch.Tensor]:
        """One page-locked host buffer per group, allocated once (at setup when the run
        checkpoints)."""
        return [self.snap_bufs.get(k, g.flat.numel(), g.flat.dtype, pinned=True)
                for k, g in enumerate(self.groups)]

    def restore(self, snap: Snapshot) -> None:
        """MeZO applies each update within its step: a snapshot never carries one."""
        if snap.pending is not None:
            raise ValueError("checkpoint: a MeZO snapshot cannot carry a pending update")
        self.load_state_flats(snap.flats)

    def gpu_param_bytes(self) -> int:
        on_gpu = self.device.type == "cuda"
        groups = self.groups + self.frozen
        return sum(g.flat.numel() * g.flat.element_size() for g in groups) if on_gpu else 0

    def close(self) -> None:
        """Drain timing events and free the device memory (the model becomes a skeleton)."""
        self.timer.poll(wait=True)
        for group in self.groups + self.frozen:
            release(group.layout)
        self.groups, self.frozen = [], []
        self.snap_bufs.release()
