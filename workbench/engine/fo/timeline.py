"""fo-offload's update clock: how long each step's update phase took, on the engine's one clock
(``timing.py``'s time origin), read without ever stalling a step.

A step's update phase runs from the end of the backward pass on the GPU to the end of the last
update work on either side: the GPU's streams (compute, offload, upload, flush-out) and the host
worker (the moment the host got past its wait for it). Each step leaves a start mark, end marks
and the host's end; ``resolve`` turns finished ones into seconds (``seconds``) and publishes
their mean after the first (a warm-up) as ``fo_update_measured_s``.
"""
from __future__ import annotations

from collections import deque

from workbench.engine.events import EventBus, InfoEvent
from workbench.engine.timing import OpTimer


class UpdateClock:
    """Args:
        timer: the engine's timer (its time origin and ``mark`` / ``at``).
        bus: where ``fo_update_measured_s`` goes.

    Attributes: ``seconds`` (per resolved step, since the last ``reset``).
    """

    def __init__(self, timer: OpTimer, bus: EventBus):
        self.timer, self.bus = timer, bus
        self.seconds: list[float] = []
        self._open: deque = deque()

    def start(self, stream):
        """The update phase begins where ``stream`` (compute: the backward pass) has got to."""
        return self.timer.mark(stream)

    def stop(self, start, streams: list) -> None:
        """The update phase that began at ``start`` ends with the work enqueued on ``streams``
        so far and, on the host, now."""
        ends = [self.timer.mark(stream) for stream in streams]
        self._open.append((start, ends, self.timer.now()))

    def reset(self) -> None:
        """A new placement: its steps are timed afresh."""
        self.seconds = []

    def resolve(self, wait: bool = False) -> None:
        """Turn finished update phases into seconds (never blocks unless ``wait``)."""
        at = self.timer.at
        while self._open:
            start, ends, host_end = self._open[0]
            if not isinstance(start, float):  # CUDA events
                if not wait and not all(e.query() for e in (start, *ends)):
                    return
                for e in ends:
                    e.synchronize()  # only with wait (end of run); otherwise already complete
            t0 = at(start)
            self._open.popleft()
            self.seconds.append(max(max((at(e) for e in ends), default=t0), host_end) - t0)
            timed = self.seconds[1:] or self.seconds  # the first step warms up
            self.bus.publish(InfoEvent("fo_update_measured_s", sum(timed) / len(timed)))
