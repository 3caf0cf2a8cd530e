"""What each notebook of ``notebooks/`` sets up first: where its runs go, how its figures
render, and torch's threads on a CPU."""
from __future__ import annotations

from pathlib import Path


def runs_dir(name: str, cwd: Path | None = None) -> Path:
    """``runs/<name>`` where the command line puts runs: at the checkout's root when the
    notebook runs from the checkout's ``notebooks/`` folder (JupyterLab's working directory for
    it), else under the working directory ``cwd`` (default: the current one)."""
    cwd = Path.cwd() if cwd is None else cwd
    checkout = cwd.parent
    if cwd.name == "notebooks" and (checkout / "workbench" / "__init__.py").is_file():
        return checkout / "runs" / name
    return cwd / "runs" / name


def setup(name: str, device: str) -> Path:
    """Prepare a notebook's kernel and return its runs folder (``runs_dir(name)``).

    Figures carry their data inside the notebook (plotly's own mime type for JupyterLab, and
    plotly.js inline for other viewers), so they survive headless runs and exports, offline.
    On ``device="cpu"`` torch runs on one thread: the notebooks' small models run fastest so,
    even on a busy machine.
    """
    import plotly.io as pio
    import torch

    pio.renderers.default = "plotly_mimetype+notebook"
    if device == "cpu":
        torch.set_num_threads(1)
    return runs_dir(name)


class StepLines:
    """Progress of a run in a notebook as plain lines on stdout ("MeZO: step 12 of 48, loss
    0.713, 9 s"): at most one every ``every_s`` seconds, and the last step; subscribe it to the
    run's bus. Plain prints, not a progress bar: they survive a headless run and an export, and
    say something during a CPU run of minutes (a widget bar shows nothing there).

    Args:
        name: what the lines start with; steps: the run's planned steps.
    """

    def __init__(self, name: str, steps: int, every_s: float = 10.0) -> None:
        import time

        self.name, self.steps, self.every_s = name, steps, every_s
        self._clock = time.perf_counter
        self.t0 = self._clock()
        self._last = -float("inf")
        self.lines = 0

    def __call__(self, event) -> None:
        from workbench.engine.events import StepEvent

        if not isinstance(event, StepEvent):
            return
        now = self._clock()
        done = event.step + 1
        if now - self._last < self.every_s and done < self.steps:
            return
        self._last = now
        self.lines += 1
        print(f"{self.name}: step {done} of {self.steps}, loss {event.loss:.4g}, "
              f"{now - self.t0:.0f} s", flush=True)


def run_with_lines(cfg, out_dir: Path, name: str, every_s: float = 10.0, **kwargs):
    """``recipes.train.run`` with ``StepLines`` printing its progress; returns its record."""
    from workbench.engine.events import EventBus
    from workbench.recipes.train import run

    bus = EventBus()
    print(f"{name}: training {cfg.steps} steps of {cfg.method} on {cfg.model} ...", flush=True)
    bus.subscribe(StepLines(name, cfg.steps, every_s))
    return run(cfg, out_dir, bus=bus, progress=False, **kwargs)
