"""``RunConfig``: the knobs of ``knobs.py``, checked when made (``checks.py``: every problem at
once, as ``ConfigError``), frozen. The one config class the CLI, the recipes and the UI make."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

from workbench.config.checks import check_types, check_values
from workbench.config.kinds import ConfigError, read_stride
from workbench.config.knobs import Knobs


@dataclass(frozen=True)
class RunConfig(Knobs):
    """A training run (fields and units: ``Knobs``); made only when every check passes."""

    def __post_init__(self) -> None:
        # A stride spelled as text ("3": a text box, a run.json of an older version) is read
        # here, once; everything downstream sees "auto" or an int.
        object.__setattr__(self, "update_stride", read_stride(self.update_stride))
        object.__setattr__(self, "subgroup_size", read_stride(self.subgroup_size))
        object.__setattr__(self, "block_slots", read_stride(self.block_slots))
        problems = check_types(self) or check_values(self)
        if problems:
            raise ConfigError(problems)

    @classmethod
    def from_saved(cls, saved: Mapping[str, Any], **changes: Any) -> RunConfig:
        """The config a run recorded (run.json's ``config``, a checkpoint manifest's), read
        once, as this version spells it: keys this version does not know are dropped, knobs
        the record lacks take their defaults, a stride spelled as text is read
        (``__post_init__``). ``changes`` are applied on top. Raises ``ConfigError`` (every
        problem) where the record does not make a valid config."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{**{k: v for k, v in saved.items() if k in known}, **changes})

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with ``changes`` applied (checked)."""
        return dataclasses.replace(self, **changes)
