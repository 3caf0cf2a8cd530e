"""Which weights of a run directory an export takes, read one group at a time.

A run keeps its weights in two places, both in the checkpoint format
(``engine/checkpoint.py``): ``RUN_DIR/weights`` (``save_final=true``: the end-of-run weights,
pending update applied) and its checkpoints ``step-NNNNNNNN`` (a ZO checkpoint holds the
update of its last step still pending; ``pending.py`` applies it as the run's flush would).
The export takes the newest of them the run vouches for:
    done / stopped   the newest (``RUN_DIR/weights`` when it is as new as any checkpoint);
    diverged         the newest at or before the diverged step (checkpoints after it were
                     deleted by the run; ``weights`` is never written for it);
    running / failed / new   refused unless ``force`` (then the newest there is);
or the one of ``step`` steps. Reading, nothing is ever written into the run directory.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from workbench.config import ZO_METHODS, ConfigError, RunConfig
from workbench.engine.checkpoint import (CheckpointError, Snapshot, checkpoint_step,
                                         complete_checkpoints, read_checkpoint)
from workbench.engine.groups import LazyFlats
from workbench.export.pending import PendingFlush
from workbench.export.safetensors_stream import read_fp32, read_header
from workbench.runs.final_weights import FOLDER
from workbench.runs.rundir import read_history
from workbench.telemetry.record import RecordError, RunRecord

WEIGHTS = FOLDER  # the end-of-run weights' folder in a run directory
ATTEMPTS = 5  # checkpoints picked in turn while a live run rotates them away
EXPORTABLE = ("done", "stopped", "diverged")


class ExportError(ConfigError):
    """An export that cannot be made as asked: one line, nothing written."""

    def __init__(self, problem: str):
        super().__init__([problem])


@dataclass
class RunWeights:
    """The weights an export takes. ``groups``: fp32 (n,) CPU tensors in canonical order, made
    one at a time when indexed or iterated (read, pending update applied)."""

    run_dir: Path
    record: RunRecord
    step: int  # training steps the weights have seen
    origin: str  # "weights" or the checkpoint's folder name
    names: list[str]
    numels: list[int]
    groups: LazyFlats
    expected_digest: str  # the run's param_digest when these are its final weights, else ""
    flush: PendingFlush | None  # a checkpoint's pending update, applied as groups are read
    held: list[int] = field(default_factory=list)  # open descriptors of its files (``_read``)

    @property
    def config(self) -> dict[str, Any]:
        return self.record.config

    @property
    def pending(self) -> bool:
        return self.flush is not None

    def close(self) -> None:
        if self.flush is not None:
            self.flush.close()
        for fd in self.held:
            os.close(fd)
        self.held.clear()


def load_record(run_dir: Path) -> RunRecord:
    """The run's record (run.json, telemetry left out)."""
    if not (run_dir / "run.json").is_file():
        raise ExportError(f"RUN_DIR: {run_dir} is not a run directory (no run.json)")
    try:
        rec = RunRecord.load(run_dir, telemetry=False)
    except RecordError as e:
        raise ExportError(f"RUN_DIR: {e}") from None
    rec.steps, rec.evals = read_history(run_dir)  # a live run's newer steps too
    return rec


def run_weights(run_dir: str | Path, step: int | None = None, force: bool = False,
                device: str = "cpu") -> RunWeights:
    """The weights of ``run_dir`` an export takes (see the module doc).

    Args:
        step: the weights after this many steps (a checkpoint, or ``weights``), else the newest.
        force: export a run that is running, failed or never started (its newest weights).
        device: where a checkpoint's pending update is applied (the run's device type gives
            the run's own bits; see ``pending.py``).
    Raises:
        ExportError: one line: the run's status, no weights kept, no such step.
    """
    run_dir = Path(run_dir)
    rec = load_record(run_dir)
    status = rec.status
    if status not in EXPORTABLE and not force:
        raise ExportError(_status_line(run_dir, rec))
    limit = diverged_step(rec) if status == "diverged" else math.inf
    for _ in range(ATTEMPTS):  # a live run rotates checkpoints away: list them again
        candidates = _candidates(run_dir, rec.config)
        if step is not None:
            picked = [c for c in candidates if c[0] == step]
            if not picked:
                have = ", ".join(str(s) for s in sorted({s for s, _ in candidates})) or "none"
                raise ExportError(f"--step: {run_dir} has no weights after {step} steps (it has "
                                  f"weights after: {have})")
        else:
            picked = [c for c in candidates if c[0] <= limit]
            if not picked:
                raise ExportError(_nothing_line(run_dir, rec, limit))
        found_step, path = max(picked, key=lambda c: (c[0], c[1].name == WEIGHTS))
        try:
            snap, manifest, held = _read(path)
            break
        except _Gone:
            continue
    else:
        raise ExportError(f"RUN_DIR: {run_dir}'s checkpoints were rotated away {ATTEMPTS} times "
                          "while being opened (keep_last is small for how often it "
                          "checkpoints); export it once it has ended")
    numels = [g[1] for g in manifest["groups"]]
    flush = None
    if snap.pending is not None:
        flush = PendingFlush(snap.pending, _engine_config(snap.config), snap.names, numels,
                             snap.n_decay,
                             torch.device(device))
    groups = (snap.flats if flush is None else
              LazyFlats(len(snap.names), lambda k: flush(k, snap.flats[k])))
    final = status in ("done", "stopped") and found_step == len(rec.steps)
    return RunWeights(run_dir, rec, found_step, path.name, snap.names, numels, groups,
                      rec.param_digest if final else "", flush, held)


def diverged_step(rec: RunRecord) -> int:
    """The step whose loss or projected gradient was not finite (weights before it are good)."""
    has_g = rec.config.get("method") in ZO_METHODS
    bad = [r["step"] for r in rec.steps
           if r.get("loss") is None or (has_g and r.get("projected_grad") is None)]
    return min(bad) if bad else len(rec.steps)


def _candidates(run_dir: Path, config: dict[str, Any]) -> list[tuple[int, Path]]:
    """(steps, folder) of every complete set of weights the run kept."""
    root = (Path(config["checkpoint_dir"]).expanduser() if config.get("checkpoint_dir")
            else run_dir / "checkpoints")
    found = [(checkpoint_step(p), p) for p in complete_checkpoints(root)]
    weights = run_dir / WEIGHTS
    if (weights / "manifest.json").is_file():
        found.append((int(_manifest(weights)["step"]), weights))
    return sorted(found, key=lambda c: c[0])


def _engine_config(saved: dict[str, Any]) -> RunConfig:
    """A checkpoint's config for the engine's arithmetic only: its data source is not read (it
    may be gone), so it is checked as synthetic."""
    try:
        return RunConfig.from_saved(saved, data="synthetic", eval_every=0)
    except ConfigError as e:
        raise ExportError(f"the run's settings no longer check out ({e.problems[0]})") from None


def _manifest(path: Path) -> dict:
    try:
        return json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError) as e:
        raise ExportError(f"{path}: unreadable manifest ({e})") from None


class _Gone(Exception):
    """The checkpoint picked was removed (rotated away by its live run) before it was held."""


def _read(path: Path) -> tuple[Snapshot, dict, list[int]]:
    """The checkpoint at ``path``, its manifest and the open descriptors that hold its files.
    Every shard is opened first and read through its descriptor from then on (on Linux, through
    /proc/self/fd), so a live run that rotates the checkpoint away mid-export takes nothing the
    export still reads; then it is verified (shard digests, groups) by ``read_checkpoint``,
    its groups read by plain reads rather than through a memory map (``read_fp32``).

    Raises:
        _Gone: the checkpoint went before it was held or while it was verified.
    """
    held: list[int] = []
    try:
        try:
            manifest = json.loads((path / "manifest.json").read_text())
            files = {}
            for shard in manifest["shards"]:
                held.append(os.open(path / shard, os.O_RDONLY))
                files[shard] = _through(held[-1], path / shard)
        except FileNotFoundError:
            raise _Gone() from None
        except (OSError, ValueError) as e:
            raise ExportError(f"{path}: unreadable manifest ({e})") from None
        names = [g[0] for g in manifest["groups"]]
        try:
            snap = read_checkpoint(path, names, [g[1] for g in manifest["groups"]])
        except CheckpointError as e:
            if not path.exists():
                raise _Gone() from None
            raise ExportError(str(e)) from None
    except BaseException:
        for fd in held:
            os.close(fd)
        raise
    where: dict[str, tuple[Path, tuple[int, dict]]] = {}
    for shard, file in files.items():
        header = read_header(file)
        where.update((name, (file, header)) for name in header[1] if name in names)

    def load(k: int) -> torch.Tensor:
        file, header = where[names[k]]
        return read_fp32(file, names[k], header)

    snap.flats = LazyFlats(len(names), load)
    return snap, manifest, held


def _through(fd: int, path: Path) -> Path:
    """A path that opens the file ``fd`` holds, even once ``path`` is removed (Linux); else
    ``path`` itself."""
    proc = Path(f"/proc/self/fd/{fd}")
    return proc if proc.exists() else path


def _status_line(run_dir: Path, rec: RunRecord) -> str:
    if rec.status == "running":
        return (f"RUN_DIR: {run_dir} is running (or its process was killed before it recorded "
                "an end); export it once it has ended, or --force to export the newest weights "
                "it has kept")
    return (f"RUN_DIR: {run_dir} ended {rec.status}" + (f" ({rec.error})" if rec.error else "")
            + "; only done, stopped and diverged runs are exported (--force takes the newest "
            "weights it kept)")


def _nothing_line(run_dir: Path, rec: RunRecord, limit: float) -> str:
    cfg = rec.config
    if rec.status == "diverged":
        return (f"RUN_DIR: {run_dir} diverged at step {int(limit)} and kept no checkpoint "
                f"before it (checkpoint_every={cfg.get('checkpoint_every', 0)}): its last good "
                "weights are gone; run it again with checkpoint_every=N to keep them")
    if not cfg.get("save_final", True):
        return (f"RUN_DIR: {run_dir} kept no weights (save_final=false, checkpoint_every="
                f"{cfg.get('checkpoint_every', 0)}); run it again with save_final=true (the "
                "default)")
    failed = (rec.info.get("final_weights") or {}).get("error")
    if failed:
        return (f"RUN_DIR: {run_dir} holds no weights: its end-of-run write failed ({failed}) "
                "and no checkpoint was kept; free space and run it again")
    return (f"RUN_DIR: {run_dir} holds no weights ({WEIGHTS}/ and checkpoints are missing: "
            "deleted?)")
