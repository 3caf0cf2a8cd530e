"""Steps in flight and their publication. The loop never waits for the GPU: each step's losses
travel to the host through ``Deferred`` copies and the step is published (a ``StepEvent`` on
the bus, the guard told) once they have landed, at most ``RUN_AHEAD`` steps behind."""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from workbench.engine.events import EventBus, StepEvent
from workbench.engine.timing import Deferred
from workbench.recipes.readings import memory
from workbench.runs.guard import RunGuard
from workbench.telemetry.record import RunRecord

RUN_AHEAD = 2  # steps the loop may run ahead of the published ones


@dataclass(frozen=True)
class InFlight:
    """A step the loop has enqueued but not yet published: its number, its scalars on their way
    to the host (loss, g, L+, L-, and under torchrun the stop vote), the tokens of its global
    batch, the live knobs it ran with, its start and end marks (CUDA events, or host seconds),
    the PCIe bytes it moved (up, down) and whether the method has a projected gradient."""

    step: int
    scalars: Deferred
    tokens: int
    lr: float
    wd: float
    begin: Any
    end: Any
    moved: tuple[int, int]
    has_g: bool
    coefs: Deferred | None = None  # the update's coefficients, for a step of several queries
    forward_passes: int | None = None  # as the engine counted them (None: not counted)


def marker(device: torch.device):
    """The end of the work enqueued so far: a CUDA event on the GPU, host seconds otherwise."""
    if device.type != "cuda":
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()  # end of this step's work on the compute stream
    return event


class Publisher:
    """Publishes steps in order as their scalars land. ``stop_at``: under torchrun, the step
    count every rank stops at once any rank asked (a vote) or the run diverged."""

    def __init__(self, engine, guard: RunGuard, bus: EventBus, record: RunRecord,
                 device: torch.device, voting: bool):
        self.engine, self.guard, self.bus, self.record = engine, guard, bus, record
        self.device, self.voting = device, voting
        self.stop_at = math.inf
        self._nan = torch.full((), float("nan"), device=device)  # stands in for absent scalars

    def in_flight(self, t: int, out, tokens: int, lr: float, wd: float, begin, end,
                  moved: tuple[int, int], vote) -> InFlight:
        """Step ``t``'s ``StepOutput`` on its way to the host (its scalars copied, not read)."""
        nan = self._nan
        scalars = [out.loss, *(x if x is not None else nan for x in
                               (out.projected_grad, out.loss_plus, out.loss_minus))]
        if vote is not None:
            scalars.append(vote.agreed)  # any rank's stop request, all-reduced
        coefs = Deferred(*out.coefs.unbind()) if out.coefs is not None else None
        return InFlight(step=t, scalars=Deferred(*scalars), tokens=tokens, lr=lr, wd=wd,
                        begin=begin, end=end, moved=moved, has_g=out.projected_grad is not None,
                        coefs=coefs, forward_passes=out.forward_passes)

    def __call__(self, inflight: deque, block: bool, bar, drain: bool = False) -> None:
        while inflight and (drain or block or inflight[0].scalars.ready()):
            item = inflight.popleft()
            t, begin, end = item.step, item.begin, item.end
            loss, g, loss_plus, loss_minus, *vote = item.scalars.get()
            if vote and vote[0] > 0:  # a rank asked to stop: all stop after the same step, the
                self.stop_at = min(self.stop_at, t + RUN_AHEAD + 1)  # last any may have run
            if self.guard.diverged_at is not None:
                continue  # steps after a divergence are not part of the run
            self.engine.timer.poll()  # the step's spans are complete: publish them before it
            if isinstance(end, float):
                seconds, end_t = end - begin, end - self.engine.timer.t0
            else:
                end.synchronize()  # already complete once the losses have landed; no stall
                seconds = begin.elapsed_time(end) / 1e3
                end_t = self.engine.timer.now()
            allocated, reserved, peak = memory(self.device)
            coefs = item.coefs.get() if item.coefs is not None else None
            finite = self.guard.published(t, loss, g, item.has_g, item.lr, item.wd, coefs)
            self.bus.publish(StepEvent(
                step=t, loss=loss, projected_grad=g, seconds=seconds, tokens=item.tokens,
                loss_plus=loss_plus, loss_minus=loss_minus, lr=item.lr,
                mem_allocated=allocated, mem_reserved=reserved, mem_peak=peak,
                bytes_h2d=item.moved[0], bytes_d2h=item.moved[1], end=end_t,
                forward_passes=(float("nan") if item.forward_passes is None
                                else float(item.forward_passes))))
            if finite:
                self.guard.watch(self.record, t)  # stop_on=diverged reads the run's health
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}", g=f"{g:.3g}")
            if self.guard.diverged_at is not None and self.voting:
                self.stop_at = min(self.stop_at, t + RUN_AHEAD + 1)
            block = False
