"""The whole-model holder: every group on one device, bound into the model, and how its state is
read, loaded and evaluated. The engines that hold the whole model (MeZO, fo) each hold one and
add their rule (the ZO step, AdamW); the holder has no step of its own."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from workbench.config import RunConfig
from workbench.engine.groups import GroupLayout, move_buffers, release
from workbench.engine.objective import Objective, Total, evaluate, objective_for
from workbench.engine.peft import base_values, block_adapter, model_groups
from workbench.engine.storage import Group


class WholeWeights:
    """Materialises and binds every group of ``model`` on ``device`` (``peft``: the adapters
    train, the base stays frozen); ``objective``: the task's (default: ``cfg``'s).

    Attributes: ``cfg``, ``device``, ``adapter``, ``objective``, ``groups`` (the groups that
    train) and ``frozen`` (a peft run's base, as loaded).
    """

    def __init__(self, model, source, cfg: RunConfig, device: torch.device,
                 objective: Objective | None = None):
        self.cfg, self.device = cfg, device
        self.adapter = block_adapter(model, cfg)
        self.objective = objective or objective_for(cfg, model.config.vocab_size)
        self.frozen, self.groups = model_groups(self.adapter, source, cfg, device)
        move_buffers([model], device)

    def flush(self, step: int = -1) -> None:
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

    def device_bytes(self) -> int:
        """Bytes the groups, trained and frozen, take on the device (as held)."""
        return sum(g.flat.numel() * g.flat.element_size() for g in self.groups + self.frozen)

    def release(self) -> None:
        """Free every group's device memory (the model becomes a skeleton)."""
        for group in self.groups + self.frozen:
            release(group.layout)
        self.groups, self.frozen = [], []
