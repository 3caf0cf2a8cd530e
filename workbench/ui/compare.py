"""Side-by-side view of runs, and "MeZO vs offload is one call".

    from workbench.ui.compare import compare, mezo_vs_offload
    compare("runs/demo/mezo", "runs/demo/zo-offload")
    mezo_vs_offload(steps=40, lr=2e-3)   # runs both, same settings, then compares
"""
from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import ipywidgets as widgets

from workbench.config import RunConfig, load_config
from workbench.telemetry.record import RunRecord
from workbench.telemetry.naming import run_labels
from workbench.ui.fit import figure_widget
from workbench.ui.report import (comparison_figures, digest_note, load_runs, settings_html,
                                 story_html, summary_table_html)


def compare(*runs: RunRecord | str | Path, last_steps: int = 3) -> widgets.VBox:
    """What happened (health, speed, memory, bound per run), the summary table, the settings
    that differ and the comparison figures that have data, of ``runs`` (records or run
    directories): the report's comparison section, as widgets.

    Raises:
        ValueError: no runs.
        FileNotFoundError: a path that is not a run directory.
    """
    recs = load_runs(runs, "compare")
    figs = comparison_figures(recs, last_steps)  # those with data: no GPU memory on CPU runs
    table = widgets.HTML(story_html(recs, run_labels(recs)) + summary_table_html(recs)
                         + f"<p>{html.escape(digest_note(recs))}</p>" + settings_html(recs))
    box = widgets.VBox([table, *(figure_widget(f) for f in figs)])
    box.records = recs  # the snapshots drawn, for notebooks that want the numbers
    return box


def mezo_vs_offload(cfg: RunConfig | None = None, out_dir: str | Path = "runs/compare",
                    progress: bool = False, **overrides: Any) -> widgets.VBox:
    """Run MeZO and ZO-offload with the same settings, one after the other, and compare them.

    Args:
        cfg: base settings (default: ``RunConfig()`` on CUDA when there is a GPU).
        out_dir: the runs go to ``out_dir/mezo`` and ``out_dir/zo-offload``.
        progress: show a progress bar per run.
        **overrides: settings changed from ``cfg`` (strings are parsed as ``--set`` values).

    Raises:
        ConfigError: invalid or unknown overrides, all listed.
    """
    from workbench.recipes.train import run

    if cfg is None:
        import torch

        cfg = RunConfig(device="cuda" if torch.cuda.is_available() else "cpu")
    cfg = load_config(None, overrides, base=cfg)
    out = Path(out_dir)
    recs = [run(cfg.replace(method=m), out / m, progress=progress, overwrite=True)  # its own
            for m in ("mezo", "zo-offload")]  # folders: a second comparison replaces the first
    return compare(*recs)
