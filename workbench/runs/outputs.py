"""What a command may write over: one rule for run, export, report, sweep and tune.

A command writes only into a folder it makes, or one holding its own kind of output (a run, an
export, a report, a sweep); it replaces such a thing only when asked (``--overwrite``), after
checking what it is, and then removes only the files that kind of output consists of: never a
file it did not write. Every check here runs before anything on disk changes, so a refusal
changes nothing.

What each kind is recognised by:
    run      run.json, history.jsonl or checkpoints (``rundir.holds_run``)
    export   ``workbench_export.json`` (``EXPORT_MARKER``), which lists the files it wrote
    report   an HTML file whose head carries ``REPORT_MARKER``
    sweep    sweep.json (``sweep_folder.MANIFEST``)
"""
from __future__ import annotations

import json
from pathlib import Path

from workbench.config import ConfigError
from workbench.runs.rundir import LOCK, RUN_FILES, holds_run

EXPORT_MARKER = "workbench_export.json"
#: in the <head> of every report ``ui/report.py`` writes: a file without it is not ours
REPORT_MARKER = "<meta name='generator' content='zo-workbench report'>"
SWEEP_MANIFEST = "sweep.json"  # ``sweep_folder.MANIFEST``
_HEAD_BYTES = 4096  # the marker is in the first line of the page


class OutputError(ConfigError):
    """An output that would destroy what is there (one line, exit status 2)."""

    def __init__(self, problem: str):
        super().__init__([problem])


def is_report(path: Path) -> bool:
    """``path`` is a report this tool wrote (its head carries the marker)."""
    try:
        with open(path, "rb") as fh:
            return REPORT_MARKER.encode() in fh.read(_HEAD_BYTES)
    except OSError:
        return False


def is_export(path: Path) -> bool:
    return (path / EXPORT_MARKER).is_file()


def describe(path: Path) -> str:
    """What ``path`` holds, in words: 'a run', 'an export', 'a sweep', 'other files', 'nothing'."""
    if not path.exists():
        return "nothing"
    if not path.is_dir():
        return "a report" if is_report(path) else "a file"
    if holds_run(path):
        return "a run"
    if is_export(path):
        return "an export"
    if (path / SWEEP_MANIFEST).is_file():
        return "a sweep"
    return "other files" if any(path.iterdir()) else "nothing"


def run_file_of(path: Path) -> Path | None:
    """The run directory ``path`` is one of the files of (run.json, history.jsonl, its
    checkpoints, weights, lock, ...), else None."""
    path = path.expanduser().absolute()
    for parent in path.parents:
        if holds_run(parent):
            top = path.relative_to(parent).parts[0]
            return parent if top in RUN_FILES or top == LOCK or top.endswith(".tmp") else None
    return None


def check_report_out(path: Path, overwrite: bool) -> None:
    """``report -o PATH``: a new file, or a report this tool wrote; anything else only with
    ``overwrite``, and a run's own files never.

    Raises:
        OutputError: what is at ``path`` and how to go on.
    """
    run = run_file_of(path)
    if run is not None:
        raise OutputError(f"-o: {path} is a file of the run in {run}; a report never replaces "
                          f"a run's files, not even with --overwrite; give another name such "
                          f"as {run / 'report.html'}")
    if path.is_dir():
        raise OutputError(f"-o: {path} is a folder; give a file name such as "
                          f"{path / 'report.html'}")
    if path.exists() and not is_report(path) and not overwrite:
        raise OutputError(f"-o: {path} exists and is not a report this tool wrote; give a new "
                          "name, or --overwrite to replace it")


def check_export_out(out: Path, run_dir: Path, overwrite: bool) -> None:
    """``export RUN --out OUT``: OUT is new (or empty), or holds an export, which is replaced
    only with ``overwrite``; never the run, one of a run's files (its ``weights/``) or a folder
    holding the run.

    Raises:
        OutputError: what is at ``out`` and how to go on.
    """
    out, run = out.expanduser().resolve(), Path(run_dir).expanduser().resolve()
    if out == run:
        raise OutputError("--out: give a folder of its own, not the run directory")
    owner = run_file_of(out)
    if owner is not None:  # its weights/, checkpoints/ ... (a folder of its own inside is fine)
        raise OutputError(f"--out: {out} is one of the files of the run in {owner}; give a "
                          "folder of its own (nothing there is deleted, not even with "
                          "--overwrite)")
    if out in run.parents:
        raise OutputError(f"--out: {out} holds the run directory {run}; give a folder of its "
                          "own (nothing there is deleted, not even with --overwrite)")
    if out.exists() and not out.is_dir():
        raise OutputError(f"--out: {out} is a file; give a folder to create")
    what = describe(out)
    if what == "nothing":
        return
    if what != "an export":
        raise OutputError(f"--out: {out} holds {what}, not an export; give a new or empty "
                          "folder (nothing there is deleted, not even with --overwrite)")
    if not overwrite:
        raise OutputError(f"--out: {out} already holds an export; give a new folder, or "
                          "--overwrite to replace it")


def export_files(out: Path) -> set[str]:
    """The names an export in ``out`` wrote: its marker's list; an export written before the
    marker listed them, the names an export writes."""
    try:
        listed = json.loads((out / EXPORT_MARKER).read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        listed = None
    if isinstance(listed, list):
        return {str(n) for n in listed} | {EXPORT_MARKER}
    return {p.name for p in out.iterdir() if p.name in _EXPORT_NAMES or p.name.startswith(
        ("model-", "model.safetensors", "adapter_model", "tokenizer", "special_tokens", "vocab",
         "merges"))}


_EXPORT_NAMES = {EXPORT_MARKER, "README.md", "config.json", "generation_config.json",
                 "adapter_config.json", "added_tokens.json", "chat_template.jinja"}


def carry_over(old: Path, new: Path) -> list[str]:
    """Move what ``old`` (an export about to be replaced by ``new``) holds beside the export's
    own files into ``new``: the user's files stay. Returns their names."""
    ours = export_files(old)
    kept = []
    for p in sorted(old.iterdir()):
        if p.name not in ours and not (new / p.name).exists():
            p.rename(new / p.name)
            kept.append(p.name)
    return kept


def check_sweep_out(out: Path, kind: str) -> None:
    """``sweep`` / ``tune --out``: a new or empty folder, or one holding a sweep (its own
    checks follow); never a run, an export or a folder of other files.

    Raises:
        OutputError: what is at ``out``.
    """
    if out.exists() and not out.is_dir():
        raise OutputError(f"--out: {out} is a file; give a folder for the {kind}")
    what = describe(out)
    if what in ("nothing", "a sweep") or (what == "other files" and _only_sweep_files(out)):
        return
    raise OutputError(f"--out: {out} holds {what}, not a {kind}; give a new or empty folder "
                      "(nothing there is deleted, not even with --overwrite)")


def _only_sweep_files(out: Path) -> bool:
    """A folder a sweep started in and left before its manifest (its lock, a point's run)."""
    return all(p.name == "sweep.lock" or p.name == "report.html" and is_report(p)
               or p.is_dir() and holds_run(p) for p in out.iterdir())


def remove_run(path: Path) -> None:
    """Remove a run directory's run files (``RUN_FILES``, the lock); the folder too when
    nothing else is in it: what the user put there stays."""
    from workbench.runs.rundir import _remove

    for name in (*RUN_FILES, LOCK):
        _remove(path / name)
    for tmp in path.glob("*.tmp"):
        tmp.unlink(missing_ok=True)
    try:
        path.rmdir()
    except OSError:
        pass  # the user's files are in it: they and the folder stay
