"""An engine over streamed weights, composed: a holder plus a rule, nothing inherited.

The holder (``stream/holder.py``: every group trains; ``stream/adapters.py``: adapters over a
frozen base) owns the weights, their pending update, evaluation, state and snapshots. The rule
(the ZO step of ``zo_offload.py`` or ``lora_offload.py``, the jvp of ``forward_grad.py``) owns
one step: it runs the passes over the holder's stream and hands the update back to the holder
(``defer``). ``StreamedEngine`` is the ``Engine`` of the pair: the step is the rule's, the rest
the holder's.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from workbench.data.batches import Batch
from workbench.engine.protocol import StepOutput, held
from workbench.engine.stream.adapters import StreamedAdapters
from workbench.engine.stream.holder import StreamedWeights

#: A streamed holder: every group trains, or adapters over a frozen base.
Holder = StreamedWeights | StreamedAdapters


class StreamRule(Protocol):
    """One training step over a streamed holder."""

    def step(self, weights: Holder, batch: Batch, step: int, lr: float,
             wd: float) -> StepOutput:
        """One step on ``batch``: the passes over ``weights``' stream, the update handed to
        ``weights.defer``; returns without a host sync."""

    def buffer_bytes(self) -> dict[str, int]:
        """Device buffers the rule keeps of its own, by item (bytes)."""


class StreamedEngine:
    """Args:
        weights: the holder (``StreamedWeights`` or ``StreamedAdapters``).
        rule: the step (``StreamRule``).
    """

    def __init__(self, weights: Holder, rule: StreamRule):
        self.weights, self.rule = weights, rule

    # --- what the recipe and telemetry read: the holder's ----------------------------------
    cfg = property(lambda self: self.weights.cfg)
    device = property(lambda self: self.weights.device)
    timer = property(lambda self: self.weights.timer)
    objective = property(lambda self: self.weights.objective)
    adapter = property(lambda self: self.weights.adapter)
    streamer = property(lambda self: self.weights.streamer)
    ops = property(lambda self: self.weights.ops)
    pending = property(lambda self: self.weights.pending)

    @property
    def tied(self):
        """The rule's copies of a head weight tied to the embedding (``zo/tied.py``), or None."""
        return getattr(self.rule, "tied", None)

    @property
    def bytes_h2d(self) -> int:
        return self.weights.bytes_h2d

    @property
    def bytes_d2h(self) -> int:
        return self.weights.bytes_d2h

    @property
    def reduce(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        return self.weights.reduce

    @reduce.setter
    def reduce(self, fn: Callable[[torch.Tensor], torch.Tensor] | None) -> None:
        self.weights.reduce = fn  # data parallel: the rule reads it from the holder

    # --- the contract: the step is the rule's, the rest the holder's ------------------------
    def step(self, batch: Batch, step: int, lr: float, wd: float) -> StepOutput:
        return self.rule.step(self.weights, batch, step, lr, wd)

    flush = held(StreamedWeights.flush)
    evaluate = held(StreamedWeights.evaluate)
    streamed_forward = held(StreamedWeights.streamed_forward)
    streamed_head = held(StreamedWeights.streamed_head)
    state_flats = held(StreamedWeights.state_flats)
    load_state_flats = held(StreamedWeights.load_state_flats)
    base_flats = held(StreamedWeights.base_flats)
    group_layouts = held(StreamedWeights.group_layouts)
    snapshot = held(StreamedWeights.snapshot)
    restore = held(StreamedWeights.restore)
    host_report = held(StreamedWeights.host_report)

    def buffer_bytes(self) -> dict[str, int]:
        """The engine's own device buffers by item (bytes): the holder's and the rule's."""
        return {**self.weights.buffer_bytes(), **self.rule.buffer_bytes()}

    def gpu_param_bytes(self) -> int:
        return sum(self.buffer_bytes().values()) if self.device.type == "cuda" else 0

    def close(self) -> None:
        """Drain transfers and timing events, free GPU and pinned host memory."""
        self.weights.close()
