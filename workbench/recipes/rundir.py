"""A run directory's lifecycle: one writer at a time, a record from the first second, nothing
saved ever replaced without being asked.

Beside the record's own files (``telemetry.record``) a run directory holds:
    run.lock       the pid of the process writing the run. Created exclusively and held with
                   ``flock`` for the run's life, so the lock of a process that died (kill -9)
                   is free and is taken over, with a warning.
    run.json       ``status: running`` from the start; rewritten atomically (temp file, fsync,
                   rename) at checkpoints (at most once a second: a checkpoint every step must
                   not rewrite a long history every step), at least every ``WRITE_EVERY_S`` and
                   at the end, when its status is one of done, stopped, failed, diverged.
    history.jsonl  one line per published step and eval, flushed as each is published: after a
                   kill -9 the history reaches the last finished step, not the last run.json.
                   Folded into run.json at the end and removed.
"""
from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
import time
import warnings
from dataclasses import asdict
from pathlib import Path

from workbench.config import ConfigError
from workbench.engine.checkpoint import checkpoint_step, complete_checkpoints
from workbench.engine.events import EvalEvent, Event, StepEvent
from workbench.telemetry.record import RunRecord, atomic_write, write_json

WRITE_EVERY_S = 30.0
#: What a run writes in its directory (``--overwrite`` removes these and nothing else).
RUN_FILES = ("run.json", "history.jsonl", "events.json.gz", "samples.json.gz", "trace.json",
             "checkpoints", "report.html", "weights", "weights.partial", "tensorboard", "wandb",
             "mlruns")
LOCK = "run.lock"


class RunDirError(ConfigError):
    """The run directory cannot be used as asked (one line, exit status 2)."""

    def __init__(self, problem: str):
        super().__init__([problem])


class RunWarning(UserWarning):
    """Something the user should know that does not stop the run (shown as one line)."""


def holds_run(path: Path) -> bool:
    return any((path / name).exists() for name in ("run.json", "history.jsonl", "checkpoints",
                                                   LOCK))


def holds_checkpoints(root: Path) -> bool:
    return root.is_dir() and any(p.name.startswith("step-") or p.name == "steps.jsonl"
                                 for p in root.iterdir())


class RunDir:
    """Args:
        path: the run directory.
        checkpoint_root: where the run's checkpoints live (inside ``path`` or elsewhere).
    """

    def __init__(self, path: Path, checkpoint_root: Path | None):
        self.path, self.checkpoint_root = Path(path), checkpoint_root
        self._fd: int | None = None
        self.was_claimed = False  # stays True after the release: this run wrote here
        self._journal = None
        self._last_write = 0.0

    # --- before anything is written ---------------------------------------------------------
    def check_new(self, overwrite: bool) -> None:
        """Refuse a directory that holds a run (unless ``overwrite``) or other files."""
        p = self.path
        if p.exists() and not p.is_dir():
            raise RunDirError(f"--out: {p} is a file, not a folder")
        self._refuse_if_in_use()
        if p.is_dir() and holds_run(p):
            if not overwrite:
                raise RunDirError(f"--out: {p} already holds a run ({self._describe()}); continue "
                                  f"it with --resume {p} or replace it with --overwrite")
        elif p.is_dir() and any(p.iterdir()):
            raise RunDirError(f"--out: {p} is a folder holding other files; give a new or empty "
                              "folder (nothing there is deleted, not even with --overwrite)")
        root = self.checkpoint_root
        if root is not None and not _inside(root, p) and holds_checkpoints(root) and not overwrite:
            raise RunDirError(f"checkpoint_dir: {root} already holds checkpoints of another run; "
                              "give an empty folder, or --overwrite to delete them")

    def check_resume(self) -> RunRecord:
        """The record of the run to continue (run.json, history folded in)."""
        self._refuse_if_in_use("--resume")
        if not (self.path / "run.json").is_file():
            raise RunDirError(f"--resume: {self.path} is not a run directory (no run.json)")
        try:
            previous = RunRecord.load(self.path)
        except ValueError as e:  # RecordError: damaged telemetry need not stop a resume
            warnings.warn(f"{e}; resuming without its per-operation history", RunWarning)
            previous = RunRecord.load(self.path, telemetry=False)
        steps, evals = read_history(self.path)
        previous.steps = steps or previous.steps
        previous.evals = evals or previous.evals
        return previous

    def _refuse_if_in_use(self, option: str = "--out") -> None:
        """A live process holds the lock: say so (its pid) rather than anything else."""
        try:
            fd = os.open(self.path / LOCK, os.O_RDONLY)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # free unless a run holds it
        except BlockingIOError:
            raise self._in_use(fd, option) from None
        finally:
            os.close(fd)

    def _in_use(self, fd: int, option: str = "--out") -> RunDirError:
        pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        return RunDirError(f"{option}: {self.path} is being written by another run (pid {pid}, "
                           f"{LOCK}); wait for it to end or stop it")

    def _describe(self) -> str:
        try:
            data = json.loads((self.path / "run.json").read_text())
            return f"status {data.get('status', '?')}, {len(data.get('steps', []))} steps"
        except (OSError, ValueError):
            return "with checkpoints" if (self.path / "checkpoints").exists() else "unfinished"

    # --- the claim --------------------------------------------------------------------------
    @property
    def claimed(self) -> bool:
        return self._fd is not None

    def claim(self, overwrite: bool = False, new: bool = True) -> None:
        """Take the lock (refusing a directory another process writes); for a ``new`` run,
        check again under the lock that no run finished here meanwhile; with ``overwrite``,
        remove the old run's files; clear temp files a killed run left behind."""
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock()
        try:
            if new and not overwrite and any((self.path / n).exists() for n in
                                             ("run.json", "history.jsonl", "checkpoints")):
                raise RunDirError(f"--out: {self.path} already holds a run (it finished while "
                                  "this one started); --resume or --overwrite it")
            if overwrite:
                for name in RUN_FILES:
                    _remove(self.path / name)
                root = self.checkpoint_root
                if root is not None and root.is_dir():
                    for p in root.iterdir():
                        if p.name.startswith("step-") or p.name == "steps.jsonl":
                            _remove(p)
            for tmp in self.path.glob("*.tmp"):
                tmp.unlink(missing_ok=True)
            _remove(self.path / "weights.partial")  # a final-weights write a kill cut short
            if self.checkpoint_root is not None and self.checkpoint_root.is_dir():
                for partial in self.checkpoint_root.glob("step-*.partial"):
                    shutil.rmtree(partial, ignore_errors=True)  # a write a kill cut short
        except BaseException:
            self.release()
            raise

    def _lock(self) -> None:
        path = self.path / LOCK
        while True:
            try:
                fd, fresh = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644), True
            except FileExistsError:
                try:
                    fd, fresh = os.open(path, os.O_RDWR), False
                except FileNotFoundError:
                    continue  # released in between: try to create it again
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                error = self._in_use(fd)
                os.close(fd)
                raise error from None
            try:  # the file we locked must still be the one at ``path`` (not just released)
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            if not fresh:
                old = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                warnings.warn(f"{path}: taking over the lock of pid {old}, which is no longer "
                              "running", RunWarning)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            self._fd, self.was_claimed = fd, True
            return

    def release(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        if self._fd is not None:
            (self.path / LOCK).unlink(missing_ok=True)  # before unlocking: see ``_lock``
            os.close(self._fd)
            self._fd = None

    # --- while running ----------------------------------------------------------------------
    def start_history(self, steps: list[dict], evals: list[dict]) -> None:
        """Begin history.jsonl with what the run keeps (a resumed run's earlier steps)."""
        lines = [json.dumps({"step": r}) for r in steps] + [json.dumps({"eval": e}) for e in evals]
        atomic_write(self.path / "history.jsonl", "".join(l + "\n" for l in lines).encode())
        self._journal = open(self.path / "history.jsonl", "a", encoding="utf-8")

    def __call__(self, event: Event) -> None:
        """Bus subscriber: append each finished step and eval to history.jsonl."""
        if self._journal is None or not isinstance(event, (StepEvent, EvalEvent)):
            return
        key = "step" if isinstance(event, StepEvent) else "eval"
        row = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
               for k, v in asdict(event).items()}
        self._journal.write(json.dumps({key: row}) + "\n")
        self._journal.flush()  # in the OS's hands: survives a kill -9 of this process

    def write(self, record: RunRecord, every_s: float = 0.0) -> bool:
        """Rewrite run.json atomically (only if ``every_s`` has passed since the last write)."""
        now = time.monotonic()
        if now - self._last_write < every_s:
            return False
        self._last_write = now
        with record.lock:
            data = record.run_json()
            data["steps"], data["evals"] = list(data["steps"]), list(data["evals"])
        write_json(self.path / "run.json", data)
        return True

    def finish(self) -> None:
        """run.json holds the whole history now: drop the journal."""
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        (self.path / "history.jsonl").unlink(missing_ok=True)


def read_history(path: Path) -> tuple[list[dict], list[dict]]:
    """Steps and evals recorded in ``path``: run.json's, then history.jsonl's (newer; a torn
    last line from a kill is ignored), one row per step, in order."""
    steps: dict[int, dict] = {}
    evals: dict[int, dict] = {}
    try:
        data = json.loads((path / "run.json").read_text())
        steps.update((r["step"], r) for r in data.get("steps", []))
        evals.update((e["step"], e) for e in data.get("evals", []))
    except (OSError, ValueError, KeyError, TypeError):
        pass  # the caller has already reported a damaged run.json
    journal = path / "history.jsonl"
    if journal.is_file():
        for line in journal.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                break
            if "step" in row:
                steps[row["step"]["step"]] = row["step"]
            elif "eval" in row:
                evals[row["eval"]["step"]] = row["eval"]
    return [steps[k] for k in sorted(steps)], [evals[k] for k in sorted(evals)]


def newest_covered(root: Path, steps: list[dict]) -> tuple[list[Path], Path | None]:
    """Complete checkpoints under ``root`` (oldest first) and the newest one whose earlier
    steps are all in ``steps`` (the history), so a resumed history has no gap."""
    found = complete_checkpoints(root) if root is not None else []
    done = {r["step"] for r in steps}
    covered = [p for p in found if all(t in done for t in range(checkpoint_step(p)))]
    return found, (covered[-1] if covered else None)


def _inside(child: Path, parent: Path) -> bool:
    try:
        child.resolve().relative_to(parent.resolve())
        return True
    except ValueError:
        return False


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    else:
        p.unlink(missing_ok=True)
