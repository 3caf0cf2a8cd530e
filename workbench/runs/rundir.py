"""A run directory's lifecycle: one writer at a time, a record from the first second, nothing
saved ever replaced without being asked.

Beside the record's own files (``telemetry.record``) a run directory holds:
    run.lock       the pid of the process writing the run (``lockfile``): the lock of a process
                   that died (kill -9) is free and is taken over, with a warning. A
                   ``checkpoint_dir`` outside the run directory gets its own ``checkpoint.lock``:
                   two live runs never write one folder of checkpoints.
    run.json       ``status: running`` from the start; rewritten atomically (temp file, fsync,
                   rename) at checkpoints (at most once a second: a checkpoint every step must
                   not rewrite a long history every step), at least every ``WRITE_EVERY_S`` and
                   at the end, when its status is one of done, stopped, failed, diverged.
    history.jsonl  one line per published step and eval, flushed as each is published: after a
                   kill -9 the history reaches the last finished step, not the last run.json.
                   Folded into run.json at the end and removed.
"""
from __future__ import annotations

import json
import math
import shutil
import time
import warnings
from dataclasses import asdict
from pathlib import Path

from workbench.config import ConfigError
from workbench.engine.checkpoint import checkpoint_identity, complete_checkpoints
from workbench.engine.events import EvalEvent, Event, StepEvent
from workbench.runs import lockfile
from workbench.telemetry.record import RunRecord, atomic_write, write_json

WRITE_EVERY_S = 30.0
#: What a run writes in its directory (``--overwrite`` removes these and nothing else; a report
#: is not one: a run never writes one, a user may have saved one there).
RUN_FILES = ("run.json", "history.jsonl", "events.json.gz", "samples.json.gz", "trace.json",
             "checkpoints", "weights", "weights.partial", "tensorboard", "wandb", "mlruns")
LOCK = "run.lock"
CHECKPOINT_LOCK = "checkpoint.lock"  # in a checkpoint_dir outside the run directory


class RunDirError(ConfigError):
    """The run directory cannot be used as asked (one line, exit status 2)."""

    def __init__(self, problem: str):
        super().__init__([problem])


class RunWarning(UserWarning):
    """Something the user should know that does not stop the run (shown as one line)."""


def holds_run(path: Path) -> bool:
    """A run was started here (a lock alone, free, is what a start that failed at once left)."""
    return any((path / name).exists() for name in ("run.json", "history.jsonl", "checkpoints")) \
        or (path / LOCK).exists() and not lockfile.is_stale(path / LOCK)


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
        self._ck_fd: int | None = None  # checkpoint.lock of a checkpoint_dir outside ``path``
        self.was_claimed = False  # stays True after the release: this run wrote here
        self.created = False  # the claim made the folder
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
        elif p.is_dir() and any(q.name != LOCK for q in p.iterdir()):
            raise RunDirError(f"--out: {p} is a folder holding other files; give a new or empty "
                              "folder (nothing there is deleted, not even with --overwrite)")
        self._check_checkpoint_dir(overwrite)

    def _check_checkpoint_dir(self, overwrite: bool) -> None:
        """A checkpoint_dir outside the run directory: not in use by a live run; holding another
        run's checkpoints only with ``overwrite``, and never those of a run whose directory
        still holds it (they are that run's way back)."""
        root, p = self.checkpoint_root, self.path
        if root is None or _inside(root, p):
            return
        pid = lockfile.holder(root / CHECKPOINT_LOCK)
        if pid is not None:
            raise RunDirError(_ck_busy(root).format(pid=pid))
        if not holds_checkpoints(root):
            return
        with warnings.catch_warnings():  # an incomplete one is said when the run reads them
            warnings.simplefilter("ignore")
            found = complete_checkpoints(root)
        owner = next((i for i in map(checkpoint_identity, reversed(found)) if i), None)
        theirs = owner is not None and owner.get("run_dir") and \
            Path(owner["run_dir"]) != p.resolve() and holds_run_id(Path(owner["run_dir"]),
                                                                    owner.get("run_id"))
        if theirs:
            raise RunDirError(f"checkpoint_dir: {root} holds the checkpoints of the run in "
                              f"{owner['run_dir']} (run id {owner['run_id']}), which may still "
                              "resume from them; give this run another checkpoint_dir")
        if not overwrite:
            raise RunDirError(f"checkpoint_dir: {root} already holds checkpoints of another run; "
                              "give an empty folder, or --overwrite to delete them")

    def check_resume(self) -> RunRecord:
        """The record of the run to continue (run.json, history folded in)."""
        self._refuse_if_in_use("--resume")
        if not (self.path / "run.json").is_file():
            raise RunDirError(f"--resume: {self.path} is not a run directory (no run.json)"
                              + ("; the lock alone was left by a start that failed at once: "
                                 "start the run anew with --out" if (self.path / LOCK).exists()
                                 else ""))
        root = self.checkpoint_root
        if root is not None and not _inside(root, self.path):
            pid = lockfile.holder(root / CHECKPOINT_LOCK)
            if pid is not None:
                raise RunDirError(_ck_busy(root).format(pid=pid))
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
        pid = lockfile.holder(self.path / LOCK)
        if pid is not None:
            raise RunDirError(self._busy(option).format(pid=pid))

    def _busy(self, option: str = "--out") -> str:
        return (f"{option}: {self.path} is being written by another run (pid {{pid}}, {LOCK}); "
                "wait for it to end or stop it")

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
        try:
            self.created = not self.path.exists()  # ``withdraw`` removes a folder it made
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunDirError(f"--out: cannot create {self.path} ({e.strerror or e}); nothing "
                              "was started") from None
        try:
            self._fd = lockfile.take(self.path / LOCK, self._busy(), "--out", RunWarning)
        except lockfile.LockError as e:
            raise RunDirError(e.problems[0]) from None
        self.was_claimed = True
        try:
            root = self.checkpoint_root
            if root is not None and not _inside(root, self.path):
                root.mkdir(parents=True, exist_ok=True)
                try:
                    self._ck_fd = lockfile.take(root / CHECKPOINT_LOCK, _ck_busy(root),
                                                "checkpoint_dir", RunWarning)
                except lockfile.LockError as e:
                    raise RunDirError(e.problems[0]) from None
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

    def _close_journal(self) -> None:
        if self._journal is not None:
            try:
                self._journal.close()
            except OSError:
                pass  # its last line did not fit (a full disk): run.json has the steps
            self._journal = None

    def release(self) -> None:
        self._close_journal()
        if self._ck_fd is not None:
            lockfile.release(self.checkpoint_root / CHECKPOINT_LOCK, self._ck_fd)
            self._ck_fd = None
        if self._fd is not None:
            lockfile.release(self.path / LOCK, self._fd)
            self._fd = None

    def withdraw(self) -> None:
        """Undo a fresh start that was refused before its first step (a setting the engine
        refuses once it sees the model): run.json and history.jsonl go, the lock is given back,
        and the folder goes too when the claim made it and nothing else is in it; the next run
        there needs no --overwrite."""
        self.finish()  # the journal closed and removed
        _remove(self.path / "run.json")
        self.release()
        self.was_claimed = False  # nothing of this run is left here
        if self.created:
            try:
                self.path.rmdir()
            except OSError:
                pass  # something else is in it (a tracker's folder): it stays

    def start(self, record: RunRecord, fresh: bool) -> None:
        """run.json saying ``running`` (and, for a ``fresh`` run, an empty history.jsonl), just
        after the claim. A disk that cannot take them ends the start here: the lock is given
        back, nothing the run wrote is left, and the error is one line."""
        try:
            if fresh:
                self.start_history([], [])
            self.write(record)
        except OSError as e:
            try:
                if fresh:
                    self.finish()
            except OSError:
                pass  # a read-only disk: nothing could be written there either
            self.release()
            why = e.strerror or str(e)
            raise RunDirError(f"--out: cannot write in {self.path} ({why}); nothing was "
                              "started, free space or give another folder") from None

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
        try:
            self._journal.write(json.dumps({key: row}) + "\n")
            self._journal.flush()  # in the OS's hands: survives a kill -9 of this process
        except OSError as e:  # a full disk: the run goes on, its steps kept in memory
            warnings.warn(f"{self.path / 'history.jsonl'} not written ({e.strerror or e}); "
                          "the steps are kept for run.json, which a kill would lose", RunWarning)
            self._close_journal()

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
        self._close_journal()
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


def _ck_busy(root: Path) -> str:
    return (f"checkpoint_dir: {root} is in use by another run (pid {{pid}}, {CHECKPOINT_LOCK}); "
            "give each run its own checkpoint_dir")


def holds_run_id(path: Path, run_id: str | None) -> bool:
    """``path``'s run.json belongs to the run ``run_id``."""
    try:
        info = json.loads((path / "run.json").read_text()).get("info") or {}
    except (OSError, ValueError, AttributeError):
        return False
    return run_id is not None and info.get("run_id") == run_id


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
