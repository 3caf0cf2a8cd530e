"""The run directory as a context-managed subscriber of a run's event bus: one setup, one
teardown, and what a refusal must leave behind (nothing changed).

    __enter__   the claim (``RunDir.claim``: the lock, an ``--overwrite``'s clearing) and the
                bus subscription (history.jsonl);
    start()     run.json saying ``running`` (a resumed run's history kept in the record);
    refuse()    a refusal before the first step: a fresh run's folder is withdrawn, a resumed
                run's run.json is put back byte for byte as it was found;
    write()     run.json as it stands, during the run (a failed write is reported, not fatal);
    save()      the end: run.json with its final status, trace.json, the journal folded in;
    __exit__    the lock given back, the subscription ended.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Callable

from workbench.config import ConfigError, RunConfig
from workbench.engine.events import EventBus
from workbench.runs.outcome import artefact_failed, os_error
from workbench.runs.rundir import RunDir, RunWarning
from workbench.telemetry.record import RunRecord, atomic_write


def checkpoint_root(cfg: RunConfig, out_dir: Path | None) -> Path | None:
    """Where the run's checkpoints go: ``checkpoint_dir``, else RUN_DIR/checkpoints (None: the
    run keeps none)."""
    if cfg.checkpoint_dir:
        return Path(cfg.checkpoint_dir).expanduser()
    if out_dir is not None:
        return out_dir / "checkpoints"
    if cfg.checkpoint_every:
        raise ConfigError(["checkpoint_dir: checkpoint_every needs a place to write; set "
                           "checkpoint_dir or give the run an output directory"])
    return None


def check_run_dir(out_dir: Path | None, checkpoint_root: Path | None, resume: bool,
                  overwrite: bool) -> tuple[RunDir | None, RunRecord | None]:
    """The run directory (None: none is written) and, resumed, its record as found; refuses
    (``RunDirError``) one in use, or holding what a fresh run may not replace. Reads only."""
    if out_dir is None:
        return None, None
    rundir = RunDir(out_dir, checkpoint_root)
    if resume:
        return rundir, rundir.check_resume()
    rundir.check_new(overwrite)
    return rundir, None


class RunSession:
    """Args:
        rundir: the run directory (checked already: ``check_new`` / ``check_resume``).
        record: the run's record.
        bus: the run's event bus.
        overwrite: replace the run the directory holds (a fresh run only).
        previous: a resumed run's record as found (None: a fresh run).
    """

    def __init__(self, rundir: RunDir, record: RunRecord, bus: EventBus, *,
                 overwrite: bool = False, previous: RunRecord | None = None):
        self.rundir, self.record, self.bus = rundir, record, bus
        self.overwrite, self.previous = overwrite, previous
        self.written = True  # False while the last write of run.json failed
        self._found: bytes | None = None  # a resumed run's run.json, as found
        self._unsubscribe: Callable[[], None] = lambda: None

    @property
    def path(self) -> Path:
        return self.rundir.path

    def __enter__(self) -> RunSession:
        resume = self.previous is not None
        self.rundir.claim(overwrite=self.overwrite and not resume, new=not resume)
        if resume:
            self._found = (self.path / "run.json").read_bytes()
        self._unsubscribe = self.bus.subscribe(self.rundir)  # history.jsonl
        return self

    def start(self) -> None:
        """run.json saying ``running``; a resumed run's history kept until a checkpoint is
        loaded (``RunDir.start``: a disk that cannot take it ends the start in one line)."""
        rec, previous = self.record, self.previous
        if previous is not None:
            with rec.lock:
                rec.steps, rec.evals, rec.step_ops = previous.steps, previous.evals, \
                    previous.step_ops
        rec.status = "running"
        self.rundir.start(rec, fresh=previous is None)

    def refuse(self) -> None:
        """Leave the directory as it was found: a fresh run's files and folder go
        (``RunDir.withdraw``), a resumed run's run.json is put back as it was."""
        if not self.rundir.claimed:
            return
        self._unsubscribe()
        if self._found is None:
            self.rundir.withdraw()
            return
        try:
            atomic_write(self.path / "run.json", self._found)
        finally:
            self.rundir.release()

    def write(self, every_s: float = 0.0) -> None:
        """run.json as it stands (status running), atomically, at most every ``every_s``; a
        failure is reported, not fatal: the last good run.json stays."""
        if not self.rundir.claimed:
            return  # refused before the claim, or after it and withdrawn: nothing of ours
        try:
            self.written = self.rundir.write(self.record, every_s=every_s) or self.written
        except OSError as e:
            self.written = False
            warnings.warn(f"run.json not updated ({os_error(e)}); the previous one stays",
                          RunWarning)

    def save(self) -> None:
        """run.json first, with the final status; a larger artefact that fails after it is
        reported and costs nothing else."""
        from workbench.telemetry.trace import write_trace

        try:
            self.record.save(self.path, on_error=artefact_failed)
        except OSError:
            self.written = False
            raise
        self.written = True
        try:
            write_trace(self.record, self.path / "trace.json")
        except OSError as e:
            artefact_failed("trace.json", e)
        self.rundir.finish()

    def where_recorded(self) -> str:
        """Where the details of a failure are: run.json, or how to go on when it could not be
        written (a full disk: it still says ``running``)."""
        run_json = self.path / "run.json"
        if self.written:
            return f"details in {run_json}"
        return (f"{run_json} could not be written either and still says running; free space, "
                f"then continue with: python -m workbench run --resume {self.path}")

    def __exit__(self, *exc) -> None:
        try:
            self.rundir.release()
        finally:
            self._unsubscribe()
