"""A sweep folder's lifecycle, as a run directory has one: a lock, refusal before damage,
``resume`` to finish the missing points, ``overwrite`` to replace.

    sweep.json   the manifest (``recipes/sweep.py`` writes it after each change)
    sweep.lock   the pid of the process running the sweep (``lockfile``): a second sweep into
                 the folder is refused while it runs; a killed sweep's lock is taken over
    report.html  the sweep's report (``ui/sweep_view.py``)

A folder holding a sweep is refused unless the new sweep resumes it (the same kind, base
settings, axes and points) or overwrites it, which removes the old manifest, report and the run
directories its points name, and nothing else. The checks run when the sweep is built and again
under the lock, when it starts.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workbench.config import ConfigError
from workbench.runs import lockfile
from workbench.runs.outputs import check_sweep_out, remove_run

MANIFEST = "sweep.json"
LOCK = "sweep.lock"
REPORT = "report.html"


class SweepError(ConfigError):
    """A sweep that cannot start (bad ``--sweep`` values, a folder holding other runs)."""


def load_manifest(out_dir: str | Path) -> dict[str, Any]:
    """A sweep folder's ``sweep.json``.

    Raises:
        FileNotFoundError: the folder holds no sweep.
    """
    path = Path(out_dir) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{out_dir} is not a sweep folder (no {MANIFEST})")
    return json.loads(path.read_text())


def check_sweep_folder(sweep) -> list[Path]:
    """Whether ``sweep`` (a ``Sweep``) may use its folder; returns the old sweep's point
    folders that ``overwrite`` will remove.

    Raises:
        SweepError: in use; holding a sweep without ``resume`` / ``overwrite``; ``resume`` of
            a folder holding no sweep or one with other settings.
    """
    out, kind = sweep.out_dir, sweep.kind
    pid = lockfile.holder(out / LOCK)
    if pid is not None:
        raise SweepError([_busy(sweep).format(pid=pid)])
    try:
        check_sweep_out(out, kind)  # a run, an export, other files: never a sweep's to write in
    except ConfigError as e:
        raise SweepError(e.problems) from None
    if sweep.resume and sweep.overwrite:
        raise SweepError(["--overwrite: not with --resume (one finishes a sweep, the other "
                          "replaces it)"])
    try:
        old = load_manifest(out)
    except FileNotFoundError:
        if sweep.resume:
            raise SweepError([f"--resume: {out} holds no {kind} (no {MANIFEST})"]) from None
        return []
    except (OSError, ValueError) as e:
        raise SweepError([f"--out: {out / MANIFEST} cannot be read ({e}); remove it or choose "
                          "another --out"]) from None
    points = [pt for pt in old.get("points") or [] if isinstance(pt, dict)]
    if sweep.overwrite:
        return [out / pt["dir"] for pt in points if _plain(pt.get("dir"))]
    if not sweep.resume:
        done = sum(pt.get("status") in ("done", "reused") for pt in points)
        how = (f"finish it with --resume {out} or replace it with --overwrite" if kind == "sweep"
               else "choose another --out")
        raise SweepError([f"--out: {out} holds a {old.get('kind', 'sweep')} (status "
                          f"{old.get('status')}, {done} of {len(points)} points done); {how}"])
    mine = _json({"kind": kind, "base": sweep.base.to_dict(), "axes": sweep.axes,
                  "points": [p.changes for p in sweep.points]})
    theirs = {"kind": old.get("kind"), "base": old.get("base"), "axes": old.get("axes"),
              "points": [pt.get("changes") for pt in points]}
    differ = [k for k in mine if mine[k] != theirs[k]]
    if differ:
        raise SweepError([f"--resume: {out} holds a {old.get('kind')} with other settings "
                          f"({', '.join(differ)} differ); resume it as it was, or --overwrite "
                          "it"])
    return []


def claim(sweep) -> int:
    """Take ``sweep.lock`` and check the folder again under it (another sweep may have written
    it since the checks); under ``overwrite``, remove the old sweep's files. Returns the lock's
    fd (give it to ``release``)."""
    out = sweep.out_dir
    out.mkdir(parents=True, exist_ok=True)
    try:
        fd = lockfile.take(out / LOCK, _busy(sweep), "--out")
    except lockfile.LockError as e:
        raise SweepError(e.problems) from None
    try:
        if not (sweep.resume or sweep.overwrite) and (out / MANIFEST).exists():
            raise SweepError([f"--out: {out} holds a {sweep.kind} (written while this one "
                              "started); --resume or --overwrite it"])
        for path in sweep.replaced:  # the old sweep's runs: their run files, not the user's
            if path.is_dir() and (path / "run.json").is_file():
                remove_run(path)
        if sweep.overwrite:
            for name in (MANIFEST, REPORT):
                (out / name).unlink(missing_ok=True)
    except BaseException:
        release(sweep, fd)
        raise
    return fd


def release(sweep, fd: int | None) -> None:
    """Give ``sweep.lock`` back (None: not held); returns None for the caller's field."""
    if fd is not None:
        lockfile.release(sweep.out_dir / LOCK, fd)


def _busy(sweep) -> str:
    return (f"--out: {sweep.out_dir} is being written by another {sweep.kind} (pid {{pid}}, "
            f"{LOCK}); wait for it to end or stop it")


def _plain(name: Any) -> bool:
    """A point folder of a manifest: one plain name inside the sweep folder (a damaged or
    edited manifest must not point the removal elsewhere)."""
    return isinstance(name, str) and name not in ("", ".", "..") and Path(name).name == name


def _json(obj: Any) -> Any:
    """``obj`` as the manifest stores it (tuples become lists, ...)."""
    return json.loads(json.dumps(obj, default=str))
