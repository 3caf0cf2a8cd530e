"""Run configuration: one frozen, validated dataclass shared by the CLI, the recipes and the UI.

Every knob has one name everywhere (config field, ``--set`` key, widget label, report). Field
metadata carries the help text, the unit and the valid range, so the knob panel can build the
right control and the validator can say what is allowed.

The room, lowest first: ``kinds`` (each knob's allowed values, which knobs apply where, which
a resume may change, ``ConfigError``), ``knobs`` (every field, its help, unit and range),
``task`` (the data source, objective and model checks), ``checks`` (every other check, all
problems at once), ``run`` (``RunConfig``: the knobs checked when made), ``load`` (TOML files,
``--set`` values and resumed runs into a config). Import from here.
"""
from workbench.config.checks import (check_environment, checkpoint_problem, compute_slots,
                                     min_block_slots, trackers)
from workbench.config.kinds import (ONE_START, PEFT_METHODS, REPO_ROOT, RESUMABLE,
                                    STREAMING_METHODS, TRACKERS, ZO_METHODS, ZO_STATE_SLOTS,
                                    ConfigError, Stride, default_data_dir, zo_passes)
from workbench.config.knobs import knob_info, range_text
from workbench.config.load import (check_resume, load_config, parse_sets, parse_value,
                                   read_settings, resume_base, unknown_setting)
from workbench.config.run import RunConfig
from workbench.config.task import DATA_SUFFIXES, HUB_ID, split_words

__all__ = ["ConfigError", "DATA_SUFFIXES", "HUB_ID", "ONE_START", "PEFT_METHODS", "REPO_ROOT",
           "RESUMABLE", "RunConfig", "STREAMING_METHODS", "Stride", "TRACKERS", "ZO_METHODS",
           "ZO_STATE_SLOTS", "check_environment", "check_resume", "checkpoint_problem",
           "compute_slots", "default_data_dir", "knob_info", "load_config", "min_block_slots",
           "parse_sets", "parse_value", "range_text", "read_settings", "resume_base",
           "split_words", "trackers", "unknown_setting", "zo_passes"]
