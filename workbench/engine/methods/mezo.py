"""The MeZO baseline: the whole model on one device, ZO-SGD exactly as MeZO describes it.

Per step with seed s: perturb every parameter by +eps z, forward; by -2 eps z, forward; by
+eps z (restore); g = (L+ - L-) / 2 eps; update w <- w - lr (g z + wd w). z is regenerated from
s each time, never stored; the groups' flat buffers make each of those passes one launch per
group. The arithmetic is ``step.py``'s, every group's passes driven together. With
``master=compressed|compressed-sr`` the weights are bf16 / fp16 on the device, each pass
rounded as MeZO's half-precision runs round it (``half.py``).
"""
from __future__ import annotations

import torch

from workbench.config import RunConfig
from workbench.data.batches import Batch
from workbench.engine.checkpoint import Snapshot
from workbench.engine.events import EMBED, HEAD, EventBus
from workbench.engine.objective import Objective, head_loss
from workbench.engine.precision import autocast
from workbench.engine.protocol import StepOutput, held
from workbench.engine.snapshots import DeviceSnapshots
from workbench.engine.timing import OpTimer
from workbench.engine.whole import WholeWeights
from workbench.engine.zo.optim import load_opt_state, new_state
from workbench.engine.zo.perturb import PendingUpdate, ZOOps
from workbench.engine.zo.estimate import estimate, pass_name, step_output
from workbench.engine.zo import half
from workbench.engine.zo.half import weight_dtype
from workbench.engine.zo.step import ZOStep, apply_update, lockstep, step_seed, zo_passes


class MeZOEngine:
    """Args:
        model: a model skeleton (meta weights are fine) from ``build_skeleton``.
        source: where weights come from (random init or a checkpoint folder).
        cfg: the run config (eps, seed, amp, rng, telemetry).
        device: the one device everything lives on.
        bus: where operation events go.
        objective: what the loss is (default: ``cfg``'s, built without a tokenizer).
    """

    def __init__(self, model, source, cfg: RunConfig, device: torch.device, bus: EventBus,
                 objective: Objective | None = None):
        # The groups that train (``groups``) and those that stay as loaded (``frozen``).
        self.cfg, self.device = cfg, device
        self.weights = WholeWeights(model, source, cfg, device, objective)
        self.ops = ZOOps(cfg.rng, device, cfg.directions)
        # half weights under compressed-sr: the update rounds stochastically (else ops.update)
        sr = cfg.master == "compressed-sr" and weight_dtype(cfg) != torch.float32
        self.apply = half.updater(self.ops, sr, step_seed)
        self.timer = OpTimer(device, bus, cfg.telemetry)
        self.bytes_h2d = self.bytes_d2h = 0
        # Data parallel: averages the shard losses over ranks (the only traffic of a step).
        self.reduce = None  # MeZO applies its update within the step
        # momentum / adam: each group's optimizer state beside it (``optim.py``), else None
        self.opt_state = [new_state(cfg.zo_optimizer, g.layout.numel, device)
                          for g in self.weights.groups]
        self.snapshots = DeviceSnapshots(device, cfg.to_dict())
        if cfg.checkpoint_every:  # at setup, not in the first snapshot's step
            self.snapshots.prepare(dict(enumerate(g.flat for g in self.weights.groups)), pending=0,
                                   state=self._state())

    # --- the holder's part of the contract --------------------------------------------------
    adapter = property(lambda self: self.weights.adapter)
    objective = property(lambda self: self.weights.objective)
    groups = property(lambda self: self.weights.groups)  # the trained groups, as held
    frozen = property(lambda self: self.weights.frozen)  # a peft run's base, as loaded
    flush = held(WholeWeights.flush)
    evaluate = held(WholeWeights.evaluate)
    state_flats = held(WholeWeights.state_flats)
    base_flats = held(WholeWeights.base_flats)
    load_state_flats = held(WholeWeights.load_state_flats)
    group_layouts = held(WholeWeights.group_layouts)

    # --- training (the ZO rule) -------------------------------------------------------------
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
        """One ZO step (``cfg.queries`` perturbations, ``cfg.estimator``); returns the loss,
        g, L+ and L- as 0-d device tensors (``step.step_losses``)."""
        st = ZOStep.of(self.cfg, step)
        passes = lockstep([zo_passes(self.ops, g.flat, g.layout, st, state=s)
                           for g, s in zip(self.weights.groups, self.opt_state)], st.passes)
        losses = [self._loss(batch, step, pass_name(st, k)) for k in passes]
        if self.reduce is not None:
            losses = list(self.reduce(torch.stack(losses)).unbind())
        coefs, g = estimate(losses, st)
        upd = PendingUpdate.of(self.cfg, step, st.seed, coefs, lr, wd)
        stream = torch.cuda.current_stream() if self.device.type == "cuda" else None
        with self.timer.span("update", "compute", stream, step, EMBED):
            for group, state in zip(self.weights.groups, self.opt_state):
                apply_update(self.ops, group.flat, group.layout, upd, self.apply, state)
        self.timer.poll()
        return step_output(losses, st, coefs, g)

    # --- state ------------------------------------------------------------------------------
    def snapshot(self, next_step: int):
        """Start host copies of the weights (never blocking the step; ``engine/snapshots.py``);
        returns a function the checkpoint writer calls to get the ``Snapshot``. Call it only
        once the writer is done with the last one."""
        return self.snapshots.take(next_step, dict(enumerate(g.flat for g in self.weights.groups)),
                                   self.group_layouts(), None, state=self._state())

    def _state(self) -> dict[int, torch.Tensor]:
        """The groups' optimizer state by group index (empty: the rule keeps none)."""
        return {k: s for k, s in enumerate(self.opt_state) if s is not None}

    def restore(self, snap: Snapshot) -> None:
        """MeZO applies each update within its step: a snapshot never carries one."""
        if snap.pending is not None:
            raise ValueError("checkpoint: a MeZO snapshot cannot carry a pending update")
        self.load_state_flats(snap.flats)
        load_opt_state(self.opt_state, snap)

    def gpu_param_bytes(self) -> int:
        on_gpu = self.device.type == "cuda"
        return self.weights.device_bytes() if on_gpu else 0

    def close(self) -> None:
        """Drain timing events and free the device memory (the model becomes a skeleton)."""
        self.timer.poll(wait=True)
        self.weights.release()
        self.opt_state = []
        self.snapshots.release()
