"""Turns engine events into a ``RunRecord``, with bounded memory for long runs.

Per-block events are kept in full for the last ``keep_steps`` steps; every step, old or new,
keeps a summary (seconds and bytes per operation), so an hour-long run stays small.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict

from workbench.engine.events import EvalEvent, Event, InfoEvent, OpEvent, StepEvent
from workbench.telemetry.record import RunRecord


class Collector:
    """Subscribe ``collector`` to an ``EventBus``; it fills ``record`` under the record's lock.

    Args:
        record: the record to fill.
        keep_steps: steps whose per-block events are kept in full.
    """

    def __init__(self, record: RunRecord, keep_steps: int = 50):
        self.record, self.keep_steps = record, keep_steps
        self._totals: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self._latest_step = -1

    def __call__(self, event: Event) -> None:
        rec = self.record
        with rec.lock:
            if isinstance(event, OpEvent):
                rec.events.append(event)
                t = self._totals[event.step]
                t[f"{event.op} (s)"] += event.seconds
                t[f"{event.op} (bytes)"] += event.nbytes
                if event.step > self._latest_step:
                    self._latest_step = event.step
                    self._trim()
            elif isinstance(event, StepEvent):
                row = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                       for k, v in asdict(event).items()}
                rec.steps.append(row)
                self._close_step(event.step)
            elif isinstance(event, EvalEvent):
                rec.evals.append(asdict(event))
            elif isinstance(event, InfoEvent):
                rec.info[event.key] = event.value

    def _close_step(self, step: int) -> None:
        """Move finished steps' operation totals into ``step_ops`` (kept for all steps)."""
        for s in sorted(k for k in self._totals if k <= step and k >= 0):
            self.record.step_ops.append({"step": s, **self._totals.pop(s)})

    def _trim(self) -> None:
        oldest = self._latest_step - self.keep_steps + 1
        events = self.record.events
        if events and 0 <= events[0].step < oldest:
            self.record.events = [e for e in events if e.step >= oldest or e.step < 0]

    def flush(self) -> None:
        """Close whatever steps are still open (end of run)."""
        with self.record.lock:
            self._close_step(self._latest_step)
