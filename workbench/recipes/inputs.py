"""The checks of a run's inputs that need no model and no run directory: its model folder, LoRA
targets, whether it fits this machine, and its data read and checked with the model's tokenizer.
``python -m workbench run`` makes them before building anything, and ``validate`` makes the
same ones, so a setting or a data file that one refuses the other refuses too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.calibrate.machine import check_fits_here
from workbench.config import RunConfig
from workbench.data.sources import sst2_folder
from workbench.data.task import build_task
from workbench.models.build import check_model_folder
from workbench.models.lora import check_lora_targets
from workbench.models.tokenizer import load_tokenizer
from workbench.models.shape import shape_of
from workbench.plan.planner import Plan, plan


@dataclass(frozen=True)
class Inputs:
    """What the checks read: the run's plan, and its tokenizer and task (None for synthetic
    data, drawn per step)."""

    plan: Plan
    tokenizer: Any = None
    task: Any = None


def check_inputs(cfg: RunConfig, force: bool = False) -> Inputs:
    """Check ``cfg``'s inputs (``force``: plan without refusing what does not fit, as ``run
    --force`` does); returns the plan and what was read from the data.

    Raises:
        ConfigError: a model folder, LoRA target or data file that cannot be used, or a run
            that cannot fit (one line each).
    """
    check_model_folder(cfg.model)
    check_lora_targets(cfg)
    # arithmetic only: before the tokenizer, which may need the Hub
    planned = plan(cfg, shape=shape_of(cfg.model)) if force else check_fits_here(cfg)
    if cfg.data == "sst2":  # named before the tokenizer, which may try the Hub for a while
        sst2_folder(cfg.resolved_data_dir)
    if cfg.data == "synthetic":
        return Inputs(planned)
    tokenizer = load_tokenizer(cfg.model, cfg.resolved_data_dir)
    # the run's one objective: its head chunk sized for the model's vocabulary
    return Inputs(planned, tokenizer, build_task(cfg, tokenizer, shape_of(cfg.model).vocab))
