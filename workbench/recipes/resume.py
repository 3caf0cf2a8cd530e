"""Resuming a run: the rules checked before anything is built, then the checkpoint loaded.

Rules: every knob outside ``config.RESUMABLE`` stays as the run started; ``steps`` is not below
the newest checkpoint. The checkpoint used is the newest whose earlier steps are all in the
run's history (so the resumed history has no gap and no step twice); a corrupted one is
reported and an older one tried; with none yet, the run starts again from step 0.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

from workbench.config import ConfigError, RunConfig, check_resume
from workbench.engine.checkpoint import (CheckpointError, Snapshot, checkpoint_step,
                                         complete_checkpoints, read_checkpoint)
from workbench.recipes.rundir import RunWarning, newest_covered
from workbench.telemetry.record import RunRecord


def plan_resume(cfg: RunConfig, root: Path | None, previous: RunRecord | None,
                dist=None) -> list[str]:
    """Checkpoint names to try, newest first (empty: start from step 0).

    Args:
        previous: the run's record (None: no run directory, only ``root``).
        dist: under torchrun, rank 0 decides and every rank gets its answer.
    Raises:
        ConfigError: a fixed knob changed, or ``steps`` below the newest checkpoint.
        CheckpointError: no run directory and no checkpoint to resume from.
    """
    if dist is not None and not dist.main:
        return dist.gather([])[0]
    if previous is not None:
        found, covered = newest_covered(root, previous.steps)
        reference = previous.config
    else:
        found = complete_checkpoints(root) if root is not None else []
        if not found:
            raise CheckpointError(f"resume: no complete checkpoint under {root}")
        covered = found[-1]
        reference = json.loads((covered / "manifest.json").read_text()).get("config", {})
    problems = check_resume(reference, cfg)
    newest = max((checkpoint_step(p) for p in found), default=0)
    if cfg.steps < newest:
        problems.append(f"steps: {cfg.steps} is below the newest checkpoint of this run (step "
                        f"{newest}); give steps={newest} or more")
    if problems:
        raise ConfigError(problems)
    if covered is not None and covered != found[-1]:
        warnings.warn(f"resume: {found[-1].name} is newer than the recorded history (a kill "
                      f"while its steps were in flight); resuming from {covered.name}",
                      RunWarning)
    last = checkpoint_step(covered) if covered is not None else -1
    names = [p.name for p in found if checkpoint_step(p) <= last][::-1]
    return dist.gather(names)[0] if dist is not None else names


def load_resume_checkpoint(engine, cfg: RunConfig, root: Path | None,
                           names: list[str]) -> Snapshot | None:
    """Load the first usable checkpoint of ``names`` into ``engine`` (None: there is none yet,
    start from step 0).

    Raises:
        CheckpointError: every checkpoint is corrupted, or one belongs to another model.
    """
    layouts = engine.group_layouts()
    errors = []
    for name in names:
        try:
            snap = read_checkpoint(root / name, [l.name for l in layouts],
                                   [l.numel for l in layouts])
        except CheckpointError as e:
            errors.append(str(e))
            warnings.warn(f"{e}; trying an older checkpoint", RunWarning)
            continue
        for key in ("model", "method"):
            if snap.config.get(key) != getattr(cfg, key):
                raise CheckpointError(f"resume: checkpoint {name} is for {key}="
                                      f"{snap.config.get(key)!r}, this run has "
                                      f"{getattr(cfg, key)!r}")
        engine.restore(snap)  # weights and the pending update it carries
        return snap
    if errors:
        raise CheckpointError(f"resume: no usable checkpoint in {root} ({errors[-1]}); start "
                              "over with --overwrite")
    warnings.warn(f"resume: no complete checkpoint yet in {root}; starting again from step 0",
                  RunWarning)
    return None
