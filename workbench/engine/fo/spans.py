"""fo-offload's timing spans, bounded per step: one span per phase above ``SPAN_LIMIT`` subgroups.

Each subgroup gives up to eight spans a step (``PER_SUBGROUP``). At 2 M parameters a subgroup
opt-6.7b has 3,350 subgroups: ~27,000 spans a step, and with telemetry on the step took 3.4 s
instead of 2.6 s. Above ``SPAN_LIMIT`` subgroups ``PhaseTimer`` merges the spans of
each per-subgroup operation into one a step: from the first subgroup's start to the last one's
end, its bytes the sum of theirs, its detail saying how many subgroups it covers (and, timed on
the host clock, the sum of their own durations: ``busy``). Its block is ``PHASE``. Spans of
other operations (forward, backward, gpu-wait) pass through as they are. A CUDA phase still
records its subgroups' timing events (cheap, enqueued) but resolves and publishes one pair.

Threads: the gradient flush closes spans on the autograd thread, the host side hands its spans
over on the training thread; the merge is guarded by a lock.
"""
from __future__ import annotations

import threading

import torch

from workbench.engine.events import EventBus, OpEvent
from workbench.engine.timing import OpTimer, Spans

#: Subgroups above which per-subgroup spans are merged per phase.
SPAN_LIMIT = 64
#: The operations timed once per subgroup (``offload.py``'s timeline).
PER_SUBGROUP = ("grad-d2h", "cpu-wait", "cpu-update", "downcast", "upload-weights", "prefetch",
                "gpu-update", "flush-out")
PHASE = -3  # OpEvent.block of a span that covers a whole phase of a step


class PhaseTimer(Spans):
    """``OpTimer``'s interface for fo-offload's parts, merging per-subgroup spans per phase
    while ``coarse`` (``place``: more than ``SPAN_LIMIT`` subgroups).

    Args:
        timer: the engine's timer (CUDA events, polled) that spans end up in.
        bus: where host-clock spans are published.
    """

    def __init__(self, timer: OpTimer, bus: EventBus):
        self.timer, self.bus = timer, bus
        self.enabled, self.cuda = timer.enabled, timer.cuda
        self.coarse = False
        self._phases: dict[tuple[int, str, str], list] = {}
        self._lock = threading.Lock()

    # --- OpTimer's interface ------------------------------------------------------------------
    def now(self) -> float:
        return self.timer.now()

    def mark(self, stream):
        return self.timer.mark(stream)

    def at(self, mark) -> float:
        return self.timer.at(mark)

    def poll(self, wait: bool = False) -> None:
        self.timer.poll(wait)

    def open(self, stream) -> object:
        return self.timer.open(stream)

    def close(self, began, op: str, stream_name: str, stream, step: int, block: int,
              nbytes: int = 0, detail: str = "") -> None:
        if began is None:
            return
        if not self._merged(op):
            self.timer.close(began, op, stream_name, stream, step, block, nbytes, detail)
            return
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record(stream)  # where this subgroup's work on the stream ends, for timing
            self._merge(step, op, stream_name, began, end, nbytes, detail, None)
        else:
            t = self.timer.now()
            self._merge(step, op, stream_name, began, t, nbytes, detail, t - began)

    def track(self, op: str, stream_name: str, step: int, block: int, nbytes: int, begin,
              end, detail: str = "") -> None:
        if self._merged(op):
            self._merge(step, op, stream_name, begin, end, nbytes, detail, None)
        else:
            self.timer.track(op, stream_name, step, block, nbytes, begin, end, detail)

    def publish(self, e: OpEvent) -> None:
        """A span timed on the host clock (the host side's, handed over by its worker)."""
        if self._merged(e.op):
            self._merge(e.step, e.op, e.stream, e.start, e.end, e.nbytes, e.detail,
                        e.end - e.start)
        else:
            self.bus.publish(e)

    # --- phases -------------------------------------------------------------------------------
    def place(self, subgroups: int) -> None:
        """A new placement of ``subgroups`` subgroups: merge above ``SPAN_LIMIT``."""
        self.coarse = subgroups > SPAN_LIMIT

    def flush(self) -> None:
        """Publish (host clock) or hand to the timer (CUDA events) every merged phase so far:
        call once a step's update phase has been enqueued."""
        with self._lock:
            phases, self._phases = self._phases, {}
        for (step, op, stream_name), (begin, end, nbytes, n, busy, detail) in phases.items():
            text = f"{detail}; {n} subgroups" if detail else f"{n} subgroups"
            text += f", {busy:.6f} s busy" if busy is not None else ""
            if isinstance(begin, float):
                self.bus.publish(OpEvent(op, stream_name, step, PHASE, nbytes, begin, end, text))
            else:
                self.timer.track(op, stream_name, step, PHASE, nbytes, begin, end, text)

    def _merged(self, op: str) -> bool:
        return self.coarse and op in PER_SUBGROUP

    def _merge(self, step: int, op: str, stream_name: str, begin, end, nbytes: int,
               detail: str, busy: float | None) -> None:
        """Extend the phase (step, op, stream) by one subgroup's span: the first begin, the
        last end (host clock: the latest; CUDA: the last enqueued on the one stream)."""
        with self._lock:
            ph = self._phases.get((step, op, stream_name))
            if ph is None:
                self._phases[step, op, stream_name] = [begin, end, nbytes, 1, busy, detail]
                return
            if isinstance(begin, float):
                ph[0], ph[1] = min(ph[0], begin), max(ph[1], end)
                ph[4] = (ph[4] or 0.0) + (busy or 0.0)
            else:
                ph[1] = end
            ph[2] += nbytes
            ph[3] += 1
