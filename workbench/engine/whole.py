"""The part of the engine contract that is the same for every engine holding the whole model on
one device (MeZO, fo): the groups, bound into the model, and how its state is read, loaded and
evaluated. A base of one level, with no step of its own: the engines differ in their step and
what else they hold, never in these."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from workbench.config import RunConfig
from workbench.engine.groups import GroupLayout, move_buffers
from workbench.engine.objective import Objective, Total, evaluate, objective_for
from workbench.engine.peft import base_values, block_adapter, model_groups
from workbench.engine.storage import Group


class WholeModel:
    """Set by ``hold``: ``cfg``, ``device``, ``adapter``, ``objective``, ``groups`` (the groups
    that train) and ``frozen`` (a peft run's base, as loaded)."""

    cfg: RunConfig
    device: torch.device
    groups: list[Group]
    frozen: list[Group]

    def hold(self, model, source, cfg: RunConfig, device: torch.device,
             objective: Objective | None) -> None:
        """Materialise and bind every group of ``model`` on ``device`` (``peft``: the adapters
        train, the base stays frozen); ``objective``: the task's (default: ``cfg``'s)."""
        self.cfg, self.device = cfg, device
        self.adapter = block_adapter(model, cfg)
        self.objective = objective or objective_for(cfg, model.config.vocab_size)
        self.frozen, self.groups = model_groups(self.adapter, source, cfg, device)
        move_buffers([model], device)

    def flush(self) -> None:
        """Nothing is ever pending: each step's update runs inside it."""

    def evaluate(self, dev, batch_size: int, total: Total | None = None) -> dict[str, float]:
        """The objective's metrics on ``dev`` with the current weights."""
        return evaluate(self.objective, self.adapter, dev, self.device, self.cfg.amp, batch_size,
                        total=total)

    def state_flats(self) -> list[torch.Tensor]:
        """Every trainable group's weights in canonical order (device tensors; callers copy):
        fp32, or MeZO's half weights in their bf16 / fp16 (a checkpoint stores those bits)."""
        return [g.flat for g in self.groups]

    def base_flats(self) -> Sequence[torch.Tensor]:
        """The frozen base groups' weights as fp32, one at a time (peft runs; else empty)."""
        return base_values(self.frozen)

    def load_state_flats(self, flats: Sequence[torch.Tensor]) -> None:
        with torch.no_grad():  # fo's groups are leaves autograd tracks
            for group, flat in zip(self.groups, flats):
                group.flat.copy_(flat)

    def group_layouts(self) -> list[GroupLayout]:
        return [g.layout for g in self.groups]
