"""Pieces the engines share: step seeds, autocast, group storage, host copies, the pending
update's checkpoint form."""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import ContextManager

import torch

from workbench.engine.frozen_form import FrozenForm
from workbench.engine.groups import GroupLayout
from workbench.engine.perturb import PendingUpdate

MASK64 = (1 << 64) - 1


def step_seed(run_seed: int, step: int) -> int:
    """The perturbation seed of ``step`` (31 bits; splitmix64 of (run seed, step)), so a
    resumed run regenerates exactly the z of a straight one."""
    x = (run_seed * 0x9E3779B97F4A7C15 + (step + 1) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return (x ^ (x >> 31)) & 0x7FFFFFFF


def autocast(device: torch.device, amp: str) -> ContextManager:
    if amp == "off":
        return nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if amp == "bf16" else torch.float16)


@dataclass
class Group:
    """A layout and the flat fp32 buffer holding it on one device, plus cached param views.
    A frozen base block may instead be held in a ``form`` (``frozen_form.py``: matrices in the
    compute dtype), ``flat`` then being the form's byte buffer."""

    layout: GroupLayout
    flat: torch.Tensor
    form: FrozenForm | None = None
    _params: dict = field(default_factory=dict)

    def values(self) -> torch.Tensor:
        """The weights held, as fp32 (n,) (a new tensor for a form, else ``flat`` itself)."""
        return self.flat if self.form is None else self.form.to_fp32(self.flat)

    def load(self, values: torch.Tensor) -> None:
        """Set the weights from fp32 ``values`` (n,) (a form rounds its matrices)."""
        if self.form is None:
            self.flat.copy_(values)
        else:
            self.form.fill(self.flat, values)

    def bind(self, flat: torch.Tensor | None = None) -> None:
        """Point the model at ``flat`` (default: this group's own buffer; a long-lived buffer
        such as a scratch copy), with the parameter views cached per buffer."""
        flat = self.flat if flat is None else flat
        key = (flat.data_ptr(), flat.numel())
        if key not in self._params:
            make = self.layout.make_params if self.form is None else self.form.make_params
            self._params[key] = make(flat)
        self.layout.bind(self._params[key])


def materialise(layout: GroupLayout, source, seed: int, device: torch.device,
                pin: bool = False) -> torch.Tensor:
    """A flat fp32 buffer for ``layout`` on ``device``, filled by ``source``."""
    flat = torch.empty(layout.numel, dtype=torch.float32, device=device, pin_memory=pin)
    if layout.numel:
        source.fill(layout.name, layout.named_views(flat), seed)
    return flat


def device_copies(flats: list[torch.Tensor], bufs: list[torch.Tensor], device: torch.device):
    """Copy device tensors into host buffers ``bufs`` (pinned on CUDA, kept by the caller from
    one snapshot to the next) without stalling the step: on CUDA, on a side stream that the
    compute stream then waits for; returns the done event (None on the CPU)."""
    if device.type != "cuda":
        for buf, flat in zip(bufs, flats):
            buf.copy_(flat)
        return None
    compute = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(compute)  # copy the weights as the step left them
    with torch.cuda.stream(side):
        for buf, flat in zip(bufs, flats):
            buf.copy_(flat, non_blocking=True)
        done = side.record_event()
    compute.wait_event(done)  # the next step changes the weights only once they are copied
    return done


def pending_dict(upd: PendingUpdate | None, host_g: torch.Tensor | None) -> dict | None:
    """A pending update as a checkpoint stores it (``host_g``: its g, copied to the host)."""
    if upd is None:
        return None
    return {"seed": upd.seed, "g": float(host_g), "lr": upd.lr, "wd": upd.wd}


def pending_from_dict(d: dict | None, device: torch.device) -> PendingUpdate | None:
    """The inverse of ``pending_dict`` (also reads a step-log row), g on ``device``."""
    if d is None:
        return None
    return PendingUpdate(int(d["seed"]), torch.tensor(float(d["g"]), dtype=torch.float32,
                                                      device=device), float(d["lr"]), float(d["wd"]))
