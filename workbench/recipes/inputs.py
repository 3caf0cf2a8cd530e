"""What a run reads before anything is built: the model folder, the adapters' targets, whether
the run fits this machine, the data and its tokenizer, the objective."""
from __future__ import annotations

from workbench.calibrate.machine import check_fits_here
from workbench.config import RunConfig
from workbench.data.sources import sst2_folder
from workbench.data.task import build_task
from workbench.models.build import check_model_folder
from workbench.models.lora import check_lora_targets
from workbench.models.tokenizer import load_tokenizer
from workbench.plan.planner import preset_of


def read_inputs(cfg: RunConfig, force: bool = False):
    """(tokenizer, task) of ``cfg``, checked before the model is built (both None for
    synthetic data, whose task is made once the model says its vocabulary).

    Args:
        force: skip the check that the run fits this machine.
    Raises:
        ConfigError: a model folder, adapter target, fit, data folder or file refused.
    """
    check_model_folder(cfg.model)
    check_lora_targets(cfg)
    if not force:  # arithmetic only: before the tokenizer, which may need the Hub
        check_fits_here(cfg)
    if cfg.data == "sst2":  # named before the tokenizer, which may try the Hub for a while
        sst2_folder(cfg.resolved_data_dir)
    if cfg.data == "synthetic":
        return None, None
    tokenizer = load_tokenizer(cfg.model, cfg.resolved_data_dir)  # read and checked here
    # the run's one objective: its head chunk sized for the model's vocabulary
    return tokenizer, build_task(cfg, tokenizer, preset_of(cfg.model).vocab)
