"""Resuming a run: the rules checked before anything is built, then the checkpoint loaded.

Rules: every knob outside ``config.RESUMABLE`` stays as the run started; ``steps`` is not below
the newest checkpoint; every checkpoint found is the run's own (its manifest's identity carries
the run id: a folder another run wrote into is refused, never read). The checkpoint used is the
newest whose earlier steps are all in the run's history (so the resumed history has no gap and
no step twice); a corrupted one is reported and an older one tried; with none yet, the run
starts again from step 0. A resume may move ``checkpoint_dir``: the checkpoints are then looked
for in the new folder and the old one, and new ones are written to the new one.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

from workbench.config import ConfigError, RunConfig, check_resume
from workbench.engine.checkpoint import (CheckpointError, Snapshot, checkpoint_step,
                                         complete_checkpoints, read_checkpoint)
from workbench.runs.identity import foreign_checkpoints, owner, owner_text, related
from workbench.runs.rundir import RunWarning
from workbench.telemetry.record import RunRecord


def resume_roots(cfg: RunConfig, root: Path | None, out_dir: Path | None,
                 previous: RunRecord | None) -> list[Path]:
    """Where a resumed run's checkpoints may be: ``root`` (where it writes now), then the folder
    its record names, when ``checkpoint_dir`` moved."""
    roots = [root] if root is not None else []
    if previous is not None:
        old = previous.config.get("checkpoint_dir") or ""
        before = Path(old).expanduser() if old else (out_dir / "checkpoints" if out_dir else None)
        if before is not None and (root is None or before.resolve() != root.resolve()):
            roots.append(before)
    return roots


def found_checkpoints(roots: list[Path]) -> list[Path]:
    """Complete checkpoints under ``roots``, oldest first; of one step in two folders, the
    first root's (the folder the run writes to now)."""
    by_step: dict[int, Path] = {}
    for root in reversed(roots):
        by_step.update((checkpoint_step(p), p) for p in complete_checkpoints(root))
    return [by_step[k] for k in sorted(by_step)]


def newest_covered(found: list[Path], steps: list[dict]) -> Path | None:
    """The newest of ``found`` whose earlier steps are all in ``steps`` (the history), so a
    resumed history has no gap."""
    done = {r["step"] for r in steps}
    return next((p for p in reversed(found)
                 if all(t in done for t in range(checkpoint_step(p)))), None)


def started_config(run_dir: Path) -> dict:
    """The resolved settings ``run_dir``'s run started with (its run.json's ``config``).

    Raises:
        ConfigError: run.json has none (null or missing): defaults in their place would
            resume a different run, silently.
    """
    config = RunRecord.load(run_dir, telemetry=False).config
    if not config:
        raise ConfigError([f"--resume: {run_dir / 'run.json'} has no config (null or "
                           "missing): the settings this run started with are unknown, so it "
                           "cannot be resumed exactly"])
    return config


def plan_resume(cfg: RunConfig, roots: list[Path], previous: RunRecord | None,
                dist=None) -> list[str]:
    """Checkpoint folders to try, newest first (empty: start from step 0).

    Args:
        roots: where the run's checkpoints may be: the folder it writes to, then (a moved
            ``checkpoint_dir``) the one it wrote to before.
        previous: the run's record (None: no run directory, only ``roots``).
        dist: under torchrun, rank 0 decides and every rank gets its answer.
    Raises:
        ConfigError: a fixed knob changed, ``steps`` below the newest checkpoint, or a
            checkpoint of another run among the run's.
        CheckpointError: no run directory and no checkpoint to resume from.
    """
    if dist is not None and not dist.main:
        return dist.gather([])[0]
    me = owner(previous.info if previous is not None else {})
    found = found_checkpoints(roots)
    foreign = foreign_checkpoints(found, me)
    copies = [(p, i) for p, i in foreign if i is not None and related(i, me)]
    if len(copies) < len(foreign):
        path, ident = [f for f in foreign if f not in copies][-1]
        raise ConfigError([f"checkpoint_dir: {path.parent} holds checkpoints of another run "
                           f"({path.name}: {owner_text(ident)}), not of this one (run id "
                           f"{me['run_id']}); a resume never loads another run's weights. Give "
                           "each run its own checkpoint_dir; to start this run over, "
                           "--overwrite it with another checkpoint_dir"])
    if copies:  # a copy of this run (or its original) shares the folder: theirs stay theirs
        warnings.warn(f"resume: {len(copies)} checkpoint(s) in {copies[-1][0].parent} belong "
                      f"to a copy of this run ({owner_text(copies[-1][1])}); this run resumes "
                      "from its own only", RunWarning)
        found = [p for p in found if all(p != c for c, _ in copies)]
    if previous is not None and previous.config:
        covered = newest_covered(found, previous.steps)
        reference = previous.config
    else:  # no record, or one without its config: the checkpoint's manifest says what ran
        if not found:
            raise CheckpointError(f"resume: no complete checkpoint under "
                                  f"{' or '.join(map(str, roots))}")
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
    names = [str(p) for p in found if checkpoint_step(p) <= last][::-1]
    return dist.gather(names)[0] if dist is not None else names


def load_resume_checkpoint(engine, cfg: RunConfig, paths: list[str],
                           where: str) -> Snapshot | None:
    """Load the first usable checkpoint of ``paths`` into ``engine`` (None: there is none yet,
    start from step 0); ``where`` names the folder(s) for the messages.

    Raises:
        CheckpointError: every checkpoint is corrupted, or one belongs to another model.
    """
    layouts = engine.group_layouts()
    errors = []
    for path in map(Path, paths):
        try:
            snap = read_checkpoint(path, [l.name for l in layouts], [l.numel for l in layouts])
        except CheckpointError as e:
            errors.append(str(e))
            warnings.warn(f"{e}; trying an older checkpoint", RunWarning)
            continue
        for key in ("model", "method"):
            if snap.config.get(key) != getattr(cfg, key):
                raise CheckpointError(f"resume: checkpoint {path.name} is for {key}="
                                      f"{snap.config.get(key)!r}, this run has "
                                      f"{getattr(cfg, key)!r}")
        engine.restore(snap)  # weights and the pending update it carries
        return snap
    if errors:
        raise CheckpointError(f"resume: no usable checkpoint in {where} ({errors[-1]}); start "
                              "over with --overwrite")
    warnings.warn(f"resume: no complete checkpoint yet in {where}; starting again from step 0",
                  RunWarning)
    return None
