"""The knob panel's forecast line: the planner's peak GPU memory and step time for the settings
shown (a CPU run: the host memory of its buffers), or why there is none."""
from __future__ import annotations

import html
import importlib
import logging
from collections.abc import Mapping
from typing import Any, Callable

from workbench.config import RunConfig

log = logging.getLogger(__name__)


def load_planner() -> Callable[[RunConfig], Any] | None:
    """``workbench.plan.planner.plan`` if that module exists and works; None otherwise."""
    try:
        module = importlib.import_module("workbench.plan.planner")
    except ImportError:
        return None
    except Exception:  # a planner that fails to import must not take the panel down
        log.exception("workbench.plan.planner failed to import; predictions are off")
        return None
    plan = getattr(module, "plan", None)
    if not callable(plan):
        return None
    from workbench.models.shape import shape_of  # any model: its shape counted where needed

    return lambda cfg: plan(cfg, shape=shape_of(cfg.model))


def prediction_html(plan: Callable[[RunConfig], Any] | None, cfg: RunConfig) -> str:
    """The planner's forecast for ``cfg``; it may answer with a mapping or an object (``Plan``)
    holding ``peak_gpu_mem_bytes`` and ``step_seconds``."""
    if plan is None:
        return ""
    try:
        p = plan(cfg)
        get = p.get if isinstance(p, Mapping) else (lambda k, d=None: getattr(p, k, d))
        mem, step = float(get("peak_gpu_mem_bytes")), float(get("step_seconds"))
    except Exception as e:
        return (f"<i>planner: no prediction ({html.escape(type(e).__name__)}: "
                f"{html.escape(str(e))})</i>")
    if str(get("device", cfg.device)) == "cpu":  # no GPU memory to forecast: the host's
        n = float(get("host_mem_bytes", 0))  # (MB below a GB: no "0.00 GB" for a tiny run)
        fits = "" if get("fits_host", True) else " <b>(does not fit the host's memory)</b>"
        return (f"<i>planner predicts (CPU run, no GPU): host memory for its buffers "
                f"{f'{n / 1e9:.2f} GB' if n >= 1e9 else f'{n / 1e6:,.1f} MB'}, step "
                f"{step:.3f} s</i>{fits}")
    fits = "" if get("fits_gpu", True) else " <b>(does not fit the GPU)</b>"
    return (f"<i>planner predicts: peak GPU memory {mem / 1e9:.2f} GB, "
            f"step {step:.3f} s</i>{fits}")
