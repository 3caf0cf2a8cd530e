"""How many threads torch computes with in a command-line run: what the notebooks set.

The notebooks put torch on one thread for the tiny models (``torch.set_num_threads(1)``: a
64-wide model spends more on waking threads than on its matrix products, busy machine or not);
``python -m workbench run / demo / sweep`` do the same through ``choose_threads``, and every
run records its thread count and why (``environment["torch threads"]``, ``["torch threads
(why)"]``), so a timing can be read with it. ``OMP_NUM_THREADS``, when set, is the user's
choice and is kept.
"""
from __future__ import annotations

import os

import torch

from workbench.config import RunConfig
from workbench.presets import lookup

#: Models this narrow (hidden size) or narrower run fastest on one thread on a CPU.
ONE_THREAD_WIDTH = 256
#: Why the threads are what they are, for the run record (None: nobody chose here).
REASON: str | None = None


def choose_threads(cfg: RunConfig) -> str:
    """Set torch's intra-op threads for ``cfg``'s run in this process; returns (and keeps in
    ``REASON``) why."""
    global REASON
    preset = lookup(cfg.model)
    if os.environ.get("OMP_NUM_THREADS"):
        why = f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} (set by the user)"
    elif cfg.device == "cpu" and preset is not None and preset.hidden <= ONE_THREAD_WIDTH:
        torch.set_num_threads(1)
        why = (f"1: a {preset.hidden}-wide model runs fastest on one thread on a CPU (as the "
               "notebooks set it)")
    else:
        why = f"torch's default ({torch.get_num_threads()})"
    REASON = why
    return why
