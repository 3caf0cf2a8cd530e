"""Frozen event records the engine publishes, and the bus that carries them to subscribers.

The engine knows nothing of who listens (telemetry, a test, a notebook). Subscribers are called
on the training thread and must be quick and thread-safe.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Union

#: Block index used for the embedding and the head in ``OpEvent.block`` (the head is -2).
EMBED, HEAD = -1, -2


@dataclass(frozen=True)
class OpEvent:
    """One operation on one stream: an upload, a compute, an offload, an update, a codec pass,
    a checkpoint write or an optimizer-subgroup operation.

    Times are seconds since the run's time origin (host clock on CPU; CUDA events on a GPU).
    ``block`` is the transformer block (EMBED / HEAD for those groups) or the subgroup id.
    """

    op: str
    stream: str
    step: int
    block: int
    nbytes: int
    start: float
    end: float
    detail: str = ""

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class StepEvent:
    """One finished training step. Losses are NaN where a method has none (e.g. ``loss_minus``
    for first-order methods); memory in bytes, 0 on CPU."""

    step: int
    loss: float
    projected_grad: float
    seconds: float
    tokens: int
    loss_plus: float = float("nan")
    loss_minus: float = float("nan")
    lr: float = float("nan")
    mem_allocated: int = 0
    mem_reserved: int = 0
    mem_peak: int = 0
    bytes_h2d: int = 0  # host -> GPU bytes the step moved
    bytes_d2h: int = 0
    end: float = 0.0  # seconds since the time origin
    forward_passes: float = float("nan")  # the step's, as its rule counted them (NaN: not)


@dataclass(frozen=True)
class EvalEvent:
    """Dev metrics after ``step`` steps. ``metrics``: every metric of the objective
    (classify: accuracy, loss; completion: loss, perplexity, exact_match, token_f1; lm: loss,
    perplexity); ``accuracy`` (None unless classify) and ``loss`` repeat two of them for views
    that plot them; ``examples``: dev items evaluated (examples, or packed rows for lm)."""

    step: int
    accuracy: float | None
    loss: float
    examples: int
    metrics: dict = field(default_factory=dict)


@dataclass(frozen=True)
class InfoEvent:
    """A free-form fact worth recording once (e.g. the stride the performance model chose)."""

    key: str
    value: object = field(default=None)


Event = Union[OpEvent, StepEvent, EvalEvent, InfoEvent]


class EventBus:
    """Publish / subscribe, in process."""

    def __init__(self) -> None:
        self._subscribers: list[Callable[[Event], None]] = []
        self._lock = threading.Lock()

    def subscribe(self, fn: Callable[[Event], None]) -> Callable[[], None]:
        """Add a subscriber; returns a function that removes it."""
        with self._lock:
            self._subscribers.append(fn)
        return lambda: self._unsubscribe(fn)

    def _unsubscribe(self, fn: Callable[[Event], None]) -> None:
        with self._lock:
            if fn in self._subscribers:
                self._subscribers.remove(fn)

    def publish(self, event: Event) -> None:
        for fn in list(self._subscribers):
            fn(event)
