"""The engine contract: what every training engine offers the recipe, the CLI and the notebooks.

``Engine`` is a ``typing.Protocol``: MeZO, zo-offload, forward-grad, fo and fo-offload each
implement it (``tests/engine/test_protocol.py`` checks every member and its signature).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, runtime_checkable

import torch

if TYPE_CHECKING:
    from workbench.data.batches import Batch
    from workbench.engine.objective import Objective, Total
    from workbench.engine.checkpoint import Snapshot
    from workbench.engine.groups import GroupLayout
    from workbench.engine.timing import OpTimer


@dataclass
class StepOutput:
    """What a training step returns: 0-d device tensors, read on the host later (never inside
    the step). ZO methods fill the projected gradient and both perturbed losses; a step of
    several queries, or a one-sided one, its update's (q,) coefficients (``coefs``: what the
    step log keeps to replay it). ``forward_passes``: the forward passes the step ran over its
    batch, counted by the rule that ran them (a ZO step: one per loss it took; first-order and
    forward-grad: 1, a backward not counted); the record keeps it per step, so views put a
    rule's accuracy at the passes it really spent. None: not counted (the views then derive
    it from the run's settings, ``telemetry/cost.py``)."""

    loss: torch.Tensor
    projected_grad: torch.Tensor | None = None
    loss_plus: torch.Tensor | None = None
    loss_minus: torch.Tensor | None = None
    coefs: torch.Tensor | None = None
    forward_passes: int | None = None


@runtime_checkable
class Engine(Protocol):
    """A training engine over one model and device.

    Attributes:
        timer: times operations and publishes them on the run's event bus.
        bytes_h2d, bytes_d2h: running totals of bytes moved host -> device and back (0 for
            engines that keep everything on the device).
        reduce: data parallel's mean over ranks of a 1-d tensor of the step's losses, set by
            the recipe under torchrun (ZO methods only; ``distributed.from_env`` refuses the
            others), or None.
        objective: what the steps minimise and ``evaluate`` measures (``engine/objective.py``);
            ``build_engine`` sets the task's.
    """

    timer: OpTimer
    objective: Objective
    bytes_h2d: int
    bytes_d2h: int
    reduce: Callable[[torch.Tensor], torch.Tensor] | None

    def step(self, batch: Batch, step: int, lr: float, wd: float) -> StepOutput:
        """One training step on ``batch``; enqueues work and returns without a host sync."""

    def flush(self) -> None:
        """Apply anything pending (a ZO update deferred into the next step), so the weights
        are those after the last step."""

    def evaluate(self, dev, batch_size: int, total: Total | None = None) -> dict[str, float]:
        """The objective's metrics (``objective.metric_names``) over every example of ``dev``
        (a task's dev data) with the current weights, ``batch_size`` examples per forward.
        ``total``: under data parallel, sums over ranks (``dev`` is then this rank's share, and
        every rank calls this)."""

    def state_flats(self) -> Sequence[torch.Tensor]:
        """Every trainable group's fp32 weights in canonical order (``group_layouts``; an
        adapter run's adapter groups); callers copy. Streamed engines decode a host block only
        when it is reached (``groups.LazyFlats``): iterate, and drop each group before the
        next, to hold one at a time."""

    def load_state_flats(self, flats: Sequence[torch.Tensor]) -> None:
        """Set every group's weights (canonical order, fp32)."""

    def base_flats(self) -> list[torch.Tensor]:
        """An adapter run's frozen base groups, fp32 as computed with (embedding, blocks,
        head; the run's ``base_digest``); empty when every weight trains."""

    def group_layouts(self) -> list[GroupLayout]:
        """The parameter groups in canonical order: embedding, blocks, head."""

    def snapshot(self, next_step: int) -> Callable[[], Snapshot]:
        """Start host copies of the state at a step boundary without blocking the step;
        returns the function the checkpoint writer calls (in its thread) for the Snapshot."""

    def restore(self, snap: Snapshot) -> None:
        """Continue from ``snap``: its weights and its pending update."""

    def gpu_param_bytes(self) -> int:
        """GPU bytes the engine holds for parameters (and their optimizer state)."""

    def close(self) -> None:
        """Drain timing and transfers and free device and pinned memory."""


def held(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A method of a composed engine that is its holder's (``self.weights``): the holder's
    method of ``fn``'s name is called, whatever the holder's type; the signature and docstring
    are ``fn``'s (what ``inspect.signature`` and the protocol tests read)."""
    name = fn.__name__

    @functools.wraps(fn)
    def method(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.weights, name)(*args, **kwargs)

    return method
