"""What a measurement of fo-offload's rates runs: the engine's parts, between steps."""
from __future__ import annotations

from typing import Callable, NamedTuple

from workbench.config import RunConfig
from workbench.engine.fo.flat import FlatParams
from workbench.engine.fo.grads import GradFlush
from workbench.engine.fo.host import HostUpdates
from workbench.engine.device.streams import Streams
from workbench.plan.placement import Rate


class FOParts(NamedTuple):
    """The parts of an fo-offload engine that a measurement of its rates runs, between steps
    (``calibrate/fo.py``): the flat parameters, the gradient flush, the host side, the streams
    and the run's config."""

    flat: FlatParams
    grads: GradFlush
    host: HostUpdates
    streams: Streams
    cfg: RunConfig


#: How an engine gets its placement model's inputs: measured rates by name (B, Bd, Ug, Uc, and
#: Dc for 16-bit compute weights) from its own parts.
Measure = Callable[[FOParts], dict[str, Rate]]
