"""A resumed run's way back, from the plan (before anything is built) to the loaded checkpoint:
where its checkpoints are, which to try (``resume.plan_resume``), whether its data is the data
it ran on (``identity.accept_data``), then the weights, the step and the history before it."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench.config import RunConfig
from workbench.engine.events import EventBus, InfoEvent
from workbench.runs.identity import accept_data
from workbench.runs.resume import load_resume_checkpoint, plan_resume, resume_roots
from workbench.runs.rundir import RunDir
from workbench.telemetry.record import RunRecord


class Resumption:
    """Args:
        cfg: the resumed run's settings.
        checkpoint_root: where it writes checkpoints now.
        out_dir: its run directory (None: a rank > 0, or checkpoints only).
        previous: its record as found (None: no run directory).
        main: rank 0 (or the one process), which plans the resume; the other ranks get its
            plan from ``distributed.agree`` (set ``folders``).
    Raises:
        ConfigError: a fixed knob changed, too few steps, another run's checkpoints.
    """

    def __init__(self, cfg: RunConfig, checkpoint_root: Path | None, out_dir: Path | None,
                 previous: RunRecord | None, main: bool = True):
        self.cfg, self.previous = cfg, previous
        self.roots = resume_roots(cfg, checkpoint_root, out_dir, previous)
        # newest first; planned once, by rank 0
        self.folders: list[str] = plan_resume(cfg, self.roots, previous) if main else []

    def accept(self, fingerprint: str) -> dict[str, Any]:
        """What the record keeps of the data check (refuses data that changed, unless
        ``data_changed_ok``)."""
        return accept_data(self.cfg, self.previous, self.folders, fingerprint)

    def load(self, engine, record: RunRecord, rundir: RunDir | None, bus: EventBus) -> int:
        """The newest usable checkpoint into ``engine``; the record's history cut to before
        it (no step twice) and history.jsonl begun again from it. Returns its step."""
        snap = load_resume_checkpoint(engine, self.cfg, self.folders,
                                      " or ".join(map(str, self.roots)))
        start = snap.step if snap is not None else 0
        with record.lock:
            record.steps = [r for r in record.steps if r["step"] < start]
            record.evals = [e for e in record.evals if e["step"] <= start]
            record.step_ops = [r for r in record.step_ops if r["step"] < start]
        if rundir is not None:
            rundir.start_history(record.steps, record.evals)
            rundir.write(record)
        bus.publish(InfoEvent("resumed_from", f"step-{start:08d}" if snap else None))
        return start
