"""Operation timing that never stalls the hot loop, and scalars read back without a sync.

On CUDA each timed span records a pair of timing events on its stream; ``poll`` turns pairs
whose end has completed into ``OpEvent`` records (``Event.query`` never blocks). On the CPU
the host clock is read around the span and the record is published at once.
"""
from __future__ import annotations

import time
from collections import deque
from contextlib import contextmanager
from typing import Iterator

import torch

from workbench.engine.events import EventBus, OpEvent


class Spans:
    """``span`` over a timer's own ``open`` and ``close`` (``OpTimer``, and timers that wrap
    one: ``fo/spans.py``'s ``PhaseTimer``)."""

    @contextmanager
    def span(self, op: str, stream_name: str, stream, step: int, block: int, nbytes: int = 0,
             detail: str = "") -> Iterator[None]:
        """Time the work enqueued (CUDA) or done (CPU) inside the block."""
        began = self.open(stream)
        yield
        self.close(began, op, stream_name, stream, step, block, nbytes, detail)


class OpTimer(Spans):
    """Args:
        device: compute device.
        bus: where resolved ``OpEvent`` records go.
        enabled: False turns every span into a no-op (telemetry off).
    """

    def __init__(self, device: torch.device, bus: EventBus, enabled: bool = True):
        self.cuda = device.type == "cuda"
        self.bus, self.enabled = bus, enabled
        self._pending: deque = deque()
        self._free: list[torch.cuda.Event] = []
        if self.cuda:
            # One-off sync outside any step: pins the CUDA time origin to the host clock.
            torch.cuda.synchronize(device)
            self._origin = torch.cuda.Event(enable_timing=True)
            self._origin.record()
            torch.cuda.synchronize(device)
        self.t0 = time.perf_counter()

    def now(self) -> float:
        """Host seconds since the time origin."""
        return time.perf_counter() - self.t0

    def mark(self, stream) -> torch.cuda.Event | float:
        """A point in time to read later with ``at``: on CUDA a timing event recorded where
        ``stream``'s enqueued work ends (the host does not wait); on the CPU the host clock now."""
        if not self.cuda:
            return self.now()
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream)  # marks where the stream's enqueued work ends, for timing only
        return event

    def at(self, mark: torch.cuda.Event | float) -> float:
        """Seconds since the time origin of a ``mark`` (a CUDA one must have completed)."""
        return mark if isinstance(mark, float) else self._origin.elapsed_time(mark) / 1e3

    def _event(self) -> torch.cuda.Event:
        return self._free.pop() if self._free else torch.cuda.Event(enable_timing=True)

    def open(self, stream) -> object:
        """The start of an operation whose work is enqueued in parts, at different times, on
        ``stream`` (a subgroup moved in pieces); ``close`` ends it. None when disabled."""
        if not self.enabled:
            return None
        if not self.cuda:
            return self.now()
        begin = self._event()
        begin.record(stream)
        return begin

    def close(self, began, op: str, stream_name: str, stream, step: int, block: int,
              nbytes: int = 0, detail: str = "") -> None:
        """End the operation ``open`` started: everything enqueued on ``stream`` since."""
        if began is None:
            return
        if not self.cuda:
            self.bus.publish(OpEvent(op, stream_name, step, block, nbytes, began, self.now(), detail))
            return
        end = self._event()
        end.record(stream)
        self.track(op, stream_name, step, block, nbytes, began, end, detail)

    def track(self, op: str, stream_name: str, step: int, block: int, nbytes: int,
              begin: torch.cuda.Event, end: torch.cuda.Event, detail: str = "") -> None:
        """Publish, once ``end`` has completed, an operation timed by CUDA events recorded
        elsewhere (e.g. by another thread, which hands them over here on this one)."""
        self._pending.append((op, stream_name, step, block, nbytes, detail, begin, end))

    def poll(self, wait: bool = False) -> None:
        """Publish every span whose end event has completed (all of them with ``wait``)."""
        still = deque()
        while self._pending:
            item = self._pending.popleft()
            begin, end = item[-2], item[-1]
            if wait:
                end.synchronize()  # only at the end of a run: drain the last spans
            elif not end.query():
                still.append(item)
                continue
            op, stream_name, step, block, nbytes, detail = item[:6]
            t_begin = self._origin.elapsed_time(begin) / 1e3
            t_end = self._origin.elapsed_time(end) / 1e3
            self._free += [begin, end]
            self.bus.publish(OpEvent(op, stream_name, step, block, nbytes, t_begin, t_end, detail))
        self._pending = still


class Deferred:
    """Device scalars copied to pinned host memory; ``ready`` / ``get`` read them later without
    a host-blocking sync in the step. The copy runs on a side stream after the current one's
    work so far: on the current (compute) stream it would hold that stream until the copy
    engine had finished the block offload queued before it (``runs/prefetch.py``)."""

    _streams: dict[torch.device, torch.cuda.Stream] = {}  # one side stream per device

    def __init__(self, *scalars: torch.Tensor):
        stacked = torch.stack([s.detach().float().reshape(()) for s in scalars])
        if stacked.is_cuda:
            side = Deferred._streams.get(stacked.device)
            if side is None:
                side = Deferred._streams[stacked.device] = torch.cuda.Stream(stacked.device)
            side.wait_stream(torch.cuda.current_stream(stacked.device))  # the scalars are done
            self._host = torch.empty(stacked.shape, dtype=torch.float32, pin_memory=True)
            with torch.cuda.stream(side):
                self._host.copy_(stacked, non_blocking=True)
                self._done = torch.cuda.Event()
                self._done.record(side)  # marks when the copy lands in host memory
            stacked.record_stream(side)  # made on the current stream, read on the side one
        else:
            self._host, self._done = stacked, None

    def ready(self) -> bool:
        return self._done is None or self._done.query()

    def get(self) -> list[float]:
        if self._done is not None:
            self._done.synchronize()  # callers poll ready() first; this waits only at the end
        return self._host.tolist()
