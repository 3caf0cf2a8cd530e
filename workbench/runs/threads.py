"""How many threads torch computes with in a command-line run: what the notebooks set, and no
more than the host's free cores.

The notebooks put torch on one thread for the tiny models (``torch.set_num_threads(1)``: a
64-wide model spends more on waking threads than on its matrix products, busy machine or not);
``python -m workbench run / demo / sweep`` do the same through ``choose_threads``. Wider models
get one thread per core that other processes leave free: torch's threads meet at a barrier
after every operation, so one thread sharing its core with another process holds all of them
up (SmolLM2 on a 2-core host under load 12-24: one thread ran 7.5-12x faster than two). The
free cores are measured when a run starts (``busy_cores``: /proc/stat over a fifth of a second,
while this process computes nothing), and every run records its thread count and why
(``environment["torch threads"]``, ``["torch threads (why)"]``), so a timing can be read with it.
``OMP_NUM_THREADS``, when set, is the user's choice and is kept.
"""
from __future__ import annotations

import math
import os
import time

import torch

from workbench.config import RunConfig
from workbench.presets import lookup

#: Models this narrow (hidden size) or narrower run fastest on one thread on a CPU.
ONE_THREAD_WIDTH = 256
#: Seconds over which the host's busy cores are sampled.
SAMPLE_SECONDS = 0.2
#: torch's own thread count when this module was imported (before any run changed it).
DEFAULT = torch.get_num_threads()
#: Why the threads are what they are, for the run record (None: nobody chose here).
REASON: str | None = None
#: One line for the user when the host is busy ("" when it is not).
NOTE: str = ""


def cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def busy_cores(seconds: float = SAMPLE_SECONDS) -> float:
    """Cores the host's processes kept busy over ``seconds`` (0..all cores), from /proc/stat's
    idle and busy jiffies; where it cannot be read, the 1-minute load average (NaN without)."""
    def read() -> tuple[int, int] | None:
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
        return sum(v[:8]) - idle, sum(v[:8])

    a = read()
    time.sleep(seconds)
    b = read()
    if a is None or b is None or b[1] <= a[1]:
        try:
            return float(os.getloadavg()[0])
        except (AttributeError, OSError):
            return math.nan
    return (b[0] - a[0]) / (b[1] - a[1]) * (os.cpu_count() or 1)


def pick(n_cores: int, busy: float, default: int) -> int:
    """Threads for a wide model: the cores that ``busy`` (cores in use by other processes)
    leaves free, rounded to the nearest, at least 1 and at most torch's ``default``."""
    if not math.isfinite(busy):
        return default
    return max(1, min(default, math.floor(n_cores - busy + 0.5)))


def choose_threads(cfg: RunConfig, busy: float | None = None) -> str:
    """Set torch's intra-op threads for ``cfg``'s run in this process; returns (and keeps in
    ``REASON``) why, and keeps in ``NOTE`` a line for the user when the host is busy.

    Args:
        busy: cores other processes keep busy; None: measure it now (``busy_cores``).
    """
    global REASON, NOTE
    preset = lookup(cfg.model)
    NOTE = ""
    if os.environ.get("OMP_NUM_THREADS"):
        REASON = f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} (set by the user)"
        return REASON
    if cfg.device != "cpu":
        torch.set_num_threads(DEFAULT)
        REASON = f"torch's default ({DEFAULT})"
        return REASON
    n_cores = cores()
    busy = busy_cores() if busy is None else busy
    free = pick(n_cores, busy, DEFAULT)
    load = (f"other processes kept {busy:.1f} of its {n_cores} cores busy when the run started"
            if math.isfinite(busy) else "its load unknown")
    wide = preset is None or preset.hidden > ONE_THREAD_WIDTH
    n = free if wide else 1
    if not wide:
        why = (f"1: a {preset.hidden}-wide model runs fastest on one thread on a CPU (as the "
               f"notebooks set it); {load}")
    elif n < DEFAULT:
        why = f"{n}: the cores the host left free ({load}); torch's default is {DEFAULT}"
    else:
        why = f"torch's default ({DEFAULT}): {load}"
    torch.set_num_threads(n)
    if free < DEFAULT:  # busy: the run is slower than on a quiet host, whatever its threads
        fewer = f" (not {DEFAULT}) so it does not wait on them" if wide else ""
        NOTE = (f"note: host busy: other processes use {busy:.1f} of {n_cores} CPU cores; torch "
                f"computes on {n} thread{'s' if n > 1 else ''}{fewer}; expect slower steps "
                "than on a quiet host (OMP_NUM_THREADS=N sets the threads yourself)")
    REASON = why
    return why
