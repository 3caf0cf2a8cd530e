"""What a run does before anything is built: every check that needs no model, then the claim of
the run directory (``TrainRecipe.prepare``). Under torchrun every rank checks what it can, then
all agree before any other collective (``distributed.agree``): a refusal is the same one line on
every rank, and no rank waits in a collective another never reaches."""
from __future__ import annotations

import warnings
from typing import Any

from workbench import distributed
from workbench.config import ConfigError, check_environment
from workbench.engine.checkpoint import CheckpointError
from workbench.recipes.inputs import check_inputs
from workbench.runs.identity import (adopt_copy, data_fingerprint, identity, lineage_info,
                                     new_run_id)
from workbench.runs.resumption import Resumption
from workbench.runs.rundir import RunWarning
from workbench.runs.session import RunSession, check_run_dir, checkpoint_root
from workbench.runs.tracking import Tracking
from workbench.telemetry.record import RecordError, RunRecord

#: the ``TrainRecipe`` being prepared (its run state: this module fills it, the recipe owns it)
Recipe = Any

#: what a refusal before the start is (one line, exit status 2): bad settings, a missing file,
#: an unusable checkpoint or run record
REFUSALS = (ConfigError, FileNotFoundError, CheckpointError, RecordError)


def prepare_run(recipe: Recipe, resume: bool = False) -> None:
    """Every check that needs no model, then the claim of the run directory. Bad settings,
    data or model folders, trackers that would not start, a run that cannot fit, a
    directory holding another run or in use are refused here (ConfigError), before anything
    big is allocated or anything on disk changes; then the trackers start and run.json says
    ``running``. Under torchrun every rank checks what it can, then all agree before any
    other collective (``distributed.agree``), so a refusal is the same line on every rank."""
    check_environment(recipe.cfg)
    recipe.dist = distributed.data_parallel(recipe.cfg)
    recipe._held.callback(recipe.dist.shutdown)
    ctx = recipe.dist if recipe.dist.parallel else None
    try:
        previous, copy_note, failed = *_check(recipe, resume), None
    except Exception as e:
        previous, copy_note, failed = None, None, e
    folders = recipe.resumption.folders if recipe.resumption is not None else None
    folders = distributed.agree(ctx, failed, folders, REFUSALS)  # rank 0's resume plan
    if recipe.resumption is not None:
        recipe.resumption.folders = folders
    try:
        _claim(recipe, previous, copy_note)
        failed = None
    except Exception as e:
        failed = e
    distributed.agree(ctx, failed, None, REFUSALS)  # rank 0's claim, said to all

def _check(recipe: Recipe, resume: bool) -> tuple[RunRecord | None, str | None]:
    """``prepare``'s checks: the run directory, the resume's checkpoints, the trackers, the
    model, fit and data; returns the record of the run to continue and the line saying it
    is a copy (None: it is none)."""
    cfg = recipe.cfg
    recipe.checkpoint_root = checkpoint_root(cfg, recipe.out_dir)
    if not recipe.dist.main:
        recipe.out_dir = None  # rank 0 writes the run directory and the checkpoints
    recipe.rundir, previous = check_run_dir(recipe.out_dir, recipe.checkpoint_root, resume,
                                          recipe.overwrite)
    copy_note = None
    if previous is not None:  # a copy of a run that is still there goes on as a new run
        copy_note = adopt_copy(recipe.out_dir, previous.info, previous.config,
                               len(previous.steps), recipe.checkpoint_root)
    if cfg.data_changed_ok and not resume:
        raise ConfigError(["data_changed_ok: applies to a resumed run only (--resume)"])
    run_id = previous.info.get("run_id") if previous is not None else None
    if resume:
        recipe.resumption = Resumption(cfg, recipe.checkpoint_root, recipe.out_dir, previous,
                                     recipe.dist.main)
    recipe.tracking = Tracking(cfg, recipe.out_dir, recipe.record, recipe.bus)
    recipe.tracking.check(recipe.dist.main)  # before the run directory is touched
    read = check_inputs(cfg, recipe.force)  # what validate checks too
    recipe.tokenizer, recipe.task = read.tokenizer, read.task
    # the plan goes into the record: what is drawn of it later is read, never re-planned
    recipe.record.info["plan"] = read.plan.to_dict()
    found = data_fingerprint(cfg, recipe.task, recipe.tokenizer)
    info = {"run_id": run_id or new_run_id(), "data_fingerprint": found,
            **lineage_info(previous.info if previous is not None else {}, recipe.out_dir)}
    if recipe.task is not None and recipe.task.dev is not None:
        # how many examples each split holds, and which word each label is scored by
        info["examples"] = recipe.task.examples()
        if recipe.task.labels:
            info["labels"] = recipe.task.labels
    recipe.record.info.update(info)
    recipe.identity = identity(info["run_id"], recipe.out_dir, cfg, found,
                             info["sessions"][-1], info.get("lineage"))
    return previous, copy_note

def _claim(recipe: Recipe, previous: RunRecord | None, copy_note: str | None) -> None:
    """Rank 0 takes the run directory (after the data check the resume plan allows) and
    starts the trackers: run.json says ``running``."""
    if recipe.resumption is not None:
        recipe.record.info.update(recipe.resumption.accept(recipe.record.info["data_fingerprint"]))
    if recipe.rundir is None:
        return
    recipe.session = recipe._held.enter_context(RunSession(
        recipe.rundir, recipe.record, recipe.bus, overwrite=recipe.overwrite, previous=previous))
    try:
        recipe._held.enter_context(recipe.tracking)
        recipe.session.start()
    except BaseException:  # a tracker that would not start after all: as found
        recipe.tracking.discard()
        recipe.session.refuse()
        raise
    if copy_note:  # said once the copy's run.json is the new run's
        warnings.warn(copy_note, RunWarning)
