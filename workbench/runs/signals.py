"""Ctrl-C (SIGINT) and SIGTERM end a run cleanly: the step in progress finishes, a checkpoint
is taken if checkpointing is on, run.json says ``stopped``, and the process exits 130 / 143.

Only the main thread may install signal handlers, so the CLI does it around ``TrainRecipe.run``;
the panel stops its runs with ``recipe.stop_event`` instead.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A signal that arrived where no clean stop is possible (setup, saving), or a second one:
    the run ends at once, recorded as stopped."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


def exit_status(signum: int) -> int:
    """What a shell reports for a process ended by ``signum`` (130 for SIGINT, 143 SIGTERM)."""
    return 128 + signum


@contextmanager
def graceful_stop(recipe) -> Iterator[dict]:
    """While the step loop runs, the first SIGINT / SIGTERM asks ``recipe`` to stop after the
    current step (under torchrun: after a step all ranks agree on); otherwise (or a second time,
    in one process) it raises ``Interrupted``. Yields a dict whose
    ``signum`` is the signal that stopped the run (None if none did)."""
    got: dict = {"signum": None}

    def handler(signum: int, frame) -> None:
        got["signum"] = got["signum"] or signum
        if recipe.training and not recipe.stop_event.is_set():
            recipe.stop_reason = signal.Signals(signum).name
            recipe.stop_event.set()
            return
        if recipe.training and recipe.dist.parallel:
            return  # torchrun's agent sends SIGTERM right after the terminal's SIGINT: a stop
            # all ranks agreed on is under way, and a rank leaving now would strand the others
        raise Interrupted(signum)

    if threading.current_thread() is not threading.main_thread():
        yield got  # signals are the main thread's: nothing to install
        return
    old = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield got
    finally:
        for s, h in old.items():
            signal.signal(s, h)
