"""Loading the optional Triton kernels: the module, or None with one warning saying what is lost."""
from __future__ import annotations

import importlib
import warnings
from functools import cache
from types import ModuleType


@cache
def load(module: str, knob: str) -> ModuleType | None:
    """``workbench.engine.<module>``, or None when Triton is missing or broken: said once, naming
    the ``knob`` whose fused path falls back to the slower torch implementation of the same
    numbers."""
    try:
        return importlib.import_module(f"workbench.engine.{module}")
    except Exception as e:  # Triton missing or broken: say so, then use the torch path
        warnings.warn(f"{knob}: the fused Triton kernel is unavailable ({e}); using the slower "
                      "torch implementation of the same numbers", stacklevel=3)
        return None


def load_compiled(kernel) -> None:
    """Load a compiled kernel's module onto the GPU now, as its first launch would (Triton's
    private loader; where a version lacks it the first launch loads it, milliseconds)."""
    init = getattr(kernel, "_init_handles", None)
    if init is not None:
        init()
