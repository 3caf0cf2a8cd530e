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
