"""The evaluate recipe: a model's dev metrics on a task, without training.

The model is a preset, a hub id, a local folder (an exported one included) or a run directory;
a run is evaluated with its own settings (method, formats, task), its weights taken as an
export takes them (``export/source.py``: ``RUN_DIR/weights`` or a checkpoint, its pending
update applied). Everything else is the training recipe's own path: ``TrainRecipe`` builds the
task, the model and the engine as for a run, loads the weights, and its ``evaluate`` scores the
dev split, so a run directory evaluated here gives its final eval's numbers, and a model
evaluated here gives the step-0 row a run of it would record.
"""
from __future__ import annotations

from pathlib import Path

from workbench.config import ConfigError, RunConfig, check_environment
from workbench.export.source import run_weights
from workbench.recipes.train import TrainRecipe


def is_run_dir(path: str | Path) -> bool:
    return (Path(path).expanduser() / "run.json").is_file()


def evaluate(cfg: RunConfig, run_dir: str | Path | None = None, *, step: int | None = None,
             force: bool = False) -> dict[str, float]:
    """The objective's dev metrics (``objective.metric_names``) of ``cfg.model``, or of
    ``run_dir``'s weights (``cfg`` then being the run's settings, overrides applied).

    Args:
        step: a run's weights after this many steps (a checkpoint) instead of its newest.
        force: a run directory whose run is running or failed (its newest weights).
    Raises:
        ConfigError: bad settings, no dev split, a run without weights (one line each).
    """
    # nothing is written: no checkpoints, no final weights, no trackers
    cfg = cfg.replace(checkpoint_every=0, checkpoint_dir="", save_final=False, report_to="")
    check_environment(cfg)
    if cfg.data == "synthetic":
        raise ConfigError(["data: synthetic has no dev split to evaluate on; give a data set"])
    weights = run_weights(run_dir, step, force, cfg.device) if run_dir is not None else None
    recipe = TrainRecipe(cfg, None, progress=False, force=force)
    try:
        recipe.setup()
        if weights is not None:
            if [lay.name for lay in recipe.engine.group_layouts()] != weights.names:
                raise ConfigError([f"model: {run_dir}'s weights do not fit {cfg.model} with "
                                   "these settings (peft, lora_* must stay as the run had them)"])
            recipe.engine.load_state_flats(weights.groups)  # one group read at a time
            recipe.step = weights.step
        return recipe.evaluate()
    finally:
        if weights is not None:
            weights.close()
        recipe.cleanup()


def run_config(run_dir: str | Path, overrides: dict[str, str],
               config_file: str | None = None) -> RunConfig:
    """A run directory's settings with ``overrides`` (and a TOML file) on top."""
    from workbench.config import load_config
    from workbench.export.source import load_record

    previous = load_record(Path(run_dir).expanduser()).config
    return load_config(config_file, overrides, base=RunConfig.from_saved(previous))
