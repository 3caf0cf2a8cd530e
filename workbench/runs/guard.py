"""What ends a run early besides the user: a diverged step, and a disk that keeps failing.

Both are seen without waiting for the GPU: a step's loss and projected gradient are checked when
its record is published (the values have already landed on the host), and the checkpoint
writer's failures are polled between steps. With ``stop_on=diverged`` the run's learning health
(``telemetry.health``, the verdict every view shows) is read as steps are published, and a run
it calls diverged stops as one with a non-finite loss does.
"""
from __future__ import annotations

import math
import threading
import warnings
from pathlib import Path

from workbench.config import ZO_METHODS
from workbench.engine.checkpoint import AsyncCheckpointer, StepLog, complete_checkpoints
from workbench.engine.events import EventBus, InfoEvent
from workbench.engine.zo.step import step_seed
from workbench.runs.outcome import os_error
from workbench.runs.rundir import RunWarning
from workbench.telemetry.health import health
from workbench.telemetry.record import RunRecord

MAX_WRITE_FAILURES = 3  # checkpoint writes failing in a row before the run stops as failed


class RunGuard:
    """Args:
        checkpointer / steplog: the run's (None without checkpoints).
        stop: set when the run must stop; ``failure`` / ``diverged_at`` + ``error`` say why.
    """

    def __init__(self, checkpointer: AsyncCheckpointer | None, steplog: StepLog | None,
                 bus: EventBus, stop: threading.Event, seed: int, stop_on: str = "never"):
        self.checkpointer, self.steplog, self.bus, self.stop = checkpointer, steplog, bus, stop
        self.seed, self.stop_on = seed, stop_on
        self._next_check = 0  # steps recorded when health is read next (stop_on)
        self.failure = ""  # why the run must end as failed
        self.diverged_at: int | None = None
        self.error = ""  # the divergence, in one line

    @property
    def healthy(self) -> bool:
        """Neither diverged nor failing: the end-of-run checkpoint and eval still make sense."""
        return self.diverged_at is None and not self.failure

    def outcome(self, stopped: bool) -> tuple[str, str]:
        """(status, error) of a run whose loop has ended (``stopped``: before its last step)."""
        if self.failure:
            return "failed", self.failure
        if self.diverged_at is not None:
            return "diverged", self.error
        return ("stopped" if stopped else "done"), ""

    def published(self, t: int, loss: float, g: float, has_g: bool, lr: float,
                  wd: float, coefs: list[float] | None = None) -> bool:
        """Step ``t``'s values, as it is published: logs it (its update's ``coefs`` when the
        step has several, else g), or stops the run when the loss or the projected gradient
        (``has_g``: the method has one) is not finite."""
        finite = (math.isfinite(loss) and (not has_g or math.isfinite(g))
                  and all(map(math.isfinite, coefs or [])))
        if not finite:
            self._diverge(t, loss, g if has_g else None)
            return False
        if self.steplog is not None:
            self._log(t, g if coefs is None else coefs, lr, wd)
        if self.checkpointer is not None:
            self.checkpointer.verified = t + 1  # checkpoints up to here hold good states
        return True

    def watch(self, rec: RunRecord, t: int) -> None:
        """``stop_on=diverged``: after step ``t`` was recorded in ``rec``, stop the run when its
        health says diverged. Read every step for the first 100, then every 1% of the steps
        so far (a read is linear in the steps)."""
        n = len(rec.steps)
        if self.stop_on != "diverged" or self.diverged_at is not None or n < self._next_check:
            return
        self._next_check = n + max(1, n // 100)
        with rec.lock:
            snap = RunRecord(config=rec.config, steps=list(rec.steps), evals=list(rec.evals))
        h = health(snap)
        if h.state == "diverged":
            self.diverged_at = t
            self.stop.set()
            why = h.text.removeprefix("diverged: ")
            self.error = (f"diverged at step {t} (stop_on=diverged): {why}"
                          + (f"; {h.advice}" if h.advice else ""))

    def writes(self) -> None:
        """Report failed checkpoint writes as they happen; after MAX_WRITE_FAILURES in a row
        the run stops as failed."""
        ck = self.checkpointer
        while ck is not None and (error := ck.failure()) is not None:
            line = os_error(error)
            warnings.warn(f"checkpoint_dir: a checkpoint write failed ({line}); training goes on",
                          RunWarning)
            self.bus.publish(InfoEvent("checkpoint_error", line))
            if ck.failures >= MAX_WRITE_FAILURES and not self.failure:
                self.failure = (f"checkpoint_dir: {ck.failures} checkpoint writes failed in a "
                                f"row (last: {line}); free space in {ck.root} and --resume, or "
                                "resume writing elsewhere: --resume RUN_DIR --set "
                                "checkpoint_dir=FOLDER")
                self.stop.set()

    def _diverge(self, t: int, loss: float, g: float | None) -> None:
        """Stop at step ``t``; checkpoints taken after it hold its result and are dropped."""
        self.diverged_at = t
        self.stop.set()
        kept = []
        if self.checkpointer is not None:
            self.checkpointer.discard_after(t)
            kept = complete_checkpoints(self.checkpointer.root)
        what = ", ".join(f"{k} = {v}" for k, v in (("loss", loss), ("projected_grad", g))
                         if v is not None and not math.isfinite(v))
        where = (f"the last good checkpoint is {kept[-1].name}" if kept else
                 "no checkpoint was taken before it")
        self.error = (f"diverged at step {t} ({what}); {where}; try a lower lr (a resume may "
                      "change it)")

    def _log(self, t: int, g: float | list[float], lr: float, wd: float) -> None:
        """One line of the step log; a failed write turns the log off with a warning (steps
        after it cannot be replayed between snapshots; the snapshots still restore)."""
        try:
            self.steplog.append(t, step_seed(self.seed, t), g, lr, wd)
        except OSError as e:
            warnings.warn(f"{self.steplog.path} not written ({os_error(e)}); the step log is "
                          "off for the rest of this run", RunWarning)
            self.steplog = None


def guard_run(cfg, root: Path | None, timer, identity: dict | None, bus: EventBus,
              stop: threading.Event) -> tuple[AsyncCheckpointer | None, RunGuard]:
    """The run's checkpoint writer into ``root`` (None: it keeps none, or is a rank > 0), with
    the step log of a ZO method, and the guard that watches them and the published steps."""
    checkpointer = steplog = None
    if root is not None:
        checkpointer = AsyncCheckpointer(root, cfg.keep_last, bus, timer, identity)
        if cfg.method in ZO_METHODS:
            steplog = StepLog(root)
    return checkpointer, RunGuard(checkpointer, steplog, bus, stop, cfg.seed, cfg.stop_on)
