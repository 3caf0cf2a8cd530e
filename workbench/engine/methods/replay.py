"""Checkpoint replay: the weights after any step, from a snapshot and the step log.

A step's effect on the weights does not depend on its forward passes once its g is known (the
step log keeps (seed, g, lr, wd) per step), so the replay runs each step's arithmetic without
them: ``step.replay_pass`` on every group, in the engine's order, with the update applied
where the engine applies it (deferred into the next step's pass, or at the end of the step for
MeZO and fused_update=false). Streamed blocks go through the run's own host format
(``stream/transfers.py``): the fp32 master, its compressed mirror (whose updates are computed on the
decoded mirror and reach the master as bf16), or compressed(-sr) with its seeded roundings;
MeZO's half weights (``half.py``) in their own dtype, rounded as the engine rounds them.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch

from workbench.config import ZO_METHODS, RunConfig
from workbench.engine.checkpoint import (CheckpointError, StepLog, complete_checkpoints,
                                         read_checkpoint)
from workbench.engine.events import EventBus
from workbench.engine.groups import GroupLayout
from workbench.engine.stream.layout import trained_layout
from workbench.engine.stream.transfers import make_transfer
from workbench.engine.timing import OpTimer
from workbench.engine.zo import half
from workbench.engine.zo.half import weight_dtype
from workbench.engine.stream.opt_state import StreamedState
from workbench.engine.zo.optim import STATEFUL
from workbench.engine.zo.perturb import PendingUpdate, ZOOps, pending_from_dict
from workbench.engine.zo.step import ApplyUpdate, ZOStep, apply_update, replay_pass, step_seed

#: What a replayed pass does to one group: ``fn(weights, layout, apply, state)`` (state: the
#: group's optimizer state on the device, or None).
GroupPass = Callable[[torch.Tensor, GroupLayout, ApplyUpdate | None, torch.Tensor | None], None]


def replay(flats: list[torch.Tensor], names: list[str], n_decay: list[int],
           pending: dict | None, config: RunConfig, rows: dict[int, dict], first: int,
           last: int, device: torch.device,
           opt_state: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Groups' fp32 weights (canonical order, CPU) after steps ``first`` .. ``last - 1`` are
    replayed on ``device`` from the snapshot taken before step ``first`` (``flats`` with its
    ``pending`` update and, for momentum / adam, the groups' ``opt_state``) and the step log's
    ``rows``, with the final pending update applied as a flush outside any step applies it."""
    ops = ZOOps(config.rng, device, config.directions)
    eps, zo = float(config.eps), config.method != "forward-grad"
    rule = config.zo_optimizer  # the step log's rows leave it to the run
    deferred = config.method != "mezo" and config.fused_update
    layouts = [GroupLayout(n, [], f.numel(), d) for n, f, d in zip(names, flats, n_decay)]
    layout = trained_layout(config, len(layouts) - 2)  # the engine's own: one function says
    streamed, uid = set(layout.streamed), layout.uid
    dtype = weight_dtype(config)  # MeZO's half weights: bf16 / fp16, else fp32
    resident_apply = half.updater(ops, config.master == "compressed-sr"
                                  and dtype != torch.float32, step_seed)
    transfer = None
    if streamed:
        timer = OpTimer(device, EventBus(), enabled=False)
        transfer = make_transfer(config.master, config.codec, device, timer, ops)
    weights = []
    for k in range(len(layouts)):  # one group read at a time: streamed ones go to host storage
        if k in streamed:
            weights.append(transfer.host_storage(layouts[k]))
            transfer.store_fp32(weights[k], flats[k])
        else:
            weights.append(flats[k].to(device, dtype))
    states = None
    if rule in STATEFUL:  # the state crosses the engine's own transfers, in its own format
        if opt_state is None:
            raise ValueError(f"replay: zo_optimizer={rule} needs the snapshot's optimizer state")
        states = StreamedState(rule, config.master, config.codec,
                               layouts, sorted(streamed), device,
                               OpTimer(device, EventBus(), enabled=False), ops, 0, False)
        states.load(opt_state)

    def each_group(t: int, fn: GroupPass, moves_state: bool) -> None:
        """One pass of step ``t`` (-1: outside any step) over every group, in order; a
        streamed block's state travels with it in a pass that applies an update."""
        moved = states if moves_state else None
        for k, lay in enumerate(layouts):
            if k not in streamed:
                fn(weights[k], lay, resident_apply, states and states.for_group(k))
                continue
            b = uid(k)  # the unit's id, as the engine's transfer counts offloads
            transfer.wait_host(b)  # the mirror's host pass of the last offload has finished
            slot, extra = transfer.slot_buffers(lay.numel)
            transfer.upload(weights[k], slot, extra, t, b, None)
            if moved is not None:
                moved.upload(k, 0, t, None)
            fn(slot, lay, transfer.updater(extra, b), moved and moved.for_group(k))
            if moved is not None:  # before the weights, as the engine offloads them
                moved.offload(k, t, None)
            transfer.offload(weights[k], slot, extra, t, b, lay, None)

    upd = pending_from_dict(pending, device)
    for t in range(first, last):
        st = ZOStep(int(rows[t]["seed"]), eps, upd, config.queries, config.estimator,
                    rule)
        each_group(t, lambda w, lay, apply, s: replay_pass(ops, w, lay, st, zo, apply, s),
                   upd is not None or rule == "hizoo")  # hizoo: H scales every perturbation
        row = pending_from_dict(rows[t], device, rule)  # its rule's count and knobs: the run's
        upd = PendingUpdate.of(config, t, row.seed, row.g, row.lr, row.wd)
        if not deferred:  # applied within the step, in a pass of its own
            each_group(t, lambda w, lay, apply, s: apply_update(ops, w, lay, upd, apply, s), True)
            upd = None
    if upd is not None:
        each_group(-1, lambda w, lay, apply, s: apply_update(ops, w, lay, upd, apply, s), True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # replay only: the offloads have written the host copies
    if states is not None:
        states.close()
    if transfer is None:
        return [w.cpu().float() for w in weights]
    for k in streamed:
        transfer.wait_host(uid(k))  # every host pass has written its master
    out = [w.cpu() if k not in streamed else transfer.to_fp32(w).clone()
           for k, w in enumerate(weights)]
    transfer.close()
    return out


def restore_step(root: Path, step: int, device: str = "cpu") -> list[torch.Tensor]:
    """Weights after ``step`` steps (pending update applied), rebuilt from the newest snapshot
    at or before it plus the step log, with the engines' own arithmetic and host formats
    (``replay`` above). Bit-identical to the straight run when replayed on the device type that
    trained; under master=compressed-sr, only if no evaluation fell between the snapshot and
    ``step`` (an eval applies the pending update early, with a rounding of its own; the replay
    then matches the straight run in expectation)."""
    root = Path(root)
    candidates = [p for p in complete_checkpoints(root)
                  if json.loads((p / "manifest.json").read_text())["step"] <= step]
    if not candidates:
        raise CheckpointError(f"no complete checkpoint at or before step {step} in {root}")
    manifest = json.loads((candidates[-1] / "manifest.json").read_text())
    names = [g[0] for g in manifest["groups"]]
    snap = read_checkpoint(candidates[-1], names, [g[1] for g in manifest["groups"]])
    if snap.config.get("method") not in ZO_METHODS:
        raise CheckpointError(f"method {snap.config.get('method')!r} keeps optimizer state: "
                              "only its snapshots can be restored, not steps between them")
    cfg = RunConfig.from_saved(snap.config, data="synthetic", eval_every=0)  # not read here
    log = StepLog(root).read()
    missing = [t for t in range(snap.step, step) if t not in log]
    if missing:
        raise CheckpointError(f"the step log lacks steps {missing[:5]}: cannot replay to {step}")
    return replay(snap.flats, names, snap.n_decay, snap.pending, cfg, log, snap.step, step,
                  torch.device(device), snap.opt_state)
