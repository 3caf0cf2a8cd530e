"""The notebook UI: knob panel, live dashboard, comparisons and HTML reports.

Every figure is built from a ``RunRecord`` by the pure functions in ``figures``, so the live
view, a reloaded run directory and the exported report share one code path. This layer reads
config, engine events, telemetry and recipes; nothing below it imports it.

Entry points (imported on first use, so ``import workbench.ui`` loads no plotly or widgets):
    KnobPanel(method="mezo", **defaults).widget       knobs, Run / Stop, live dashboard
    Dashboard(record).widget                           live (or saved) view of one run
    compare(*runs)                                     runs side by side  (workbench.ui.compare)
    mezo_vs_offload(**overrides)                       both methods, same settings, compared
    write_report(runs, "report.html")                  self-contained offline HTML
    figures.dashboard_figure(rec), figures.timeline(rec), ...   plain plotly figures
"""
from __future__ import annotations

import importlib
from typing import Any

# ``compare`` is left out on purpose: it is also the submodule's name.
_LAZY = {"KnobPanel": "panel", "Dashboard": "dashboard", "mezo_vs_offload": "compare",
         "write_report": "report"}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"workbench.ui.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'workbench.ui' has no attribute {name!r}")
