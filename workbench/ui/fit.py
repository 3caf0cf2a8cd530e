"""Make a plotly ``FigureWidget`` take its container's width.

plotly's FigureWidget (an anywidget since plotly 6) draws each view before JupyterLab attaches
it to the page, when its element is 0 px wide, so plotly.js falls back to its 700 px default;
and the resize hooks that would correct it are never called. Each view, once drawn, reports its
layout to Python (``_js2py_layoutDelta``); answering with a relayout of ``autosize`` makes
plotly.js measure the container again, now attached (checked in the browser test). The answer
is sent a few times at most per figure: every relayout makes each view report again.
"""
from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

#: Answers per figure: enough for a figure shown in a few outputs, bounded so the views' reports
#: and our relayouts cannot ping-pong.
MAX_FITS = 6


def fit_to_container(fig: go.FigureWidget) -> go.FigureWidget:
    """``fig``, its views refitted to their container's width once drawn (height unchanged)."""
    sent = [0]

    def on_layout_report(change: dict[str, Any]) -> None:
        if change["new"] and sent[0] < MAX_FITS:
            sent[0] += 1
            fig._send_relayout_msg({"autosize": True})  # plotly's own sender, no diffing

    fig.observe(on_layout_report, names="_js2py_layoutDelta")
    return fig


def figure_widget(fig: go.Figure) -> go.FigureWidget:
    """A ``FigureWidget`` of ``fig`` that fits its container."""
    return fit_to_container(go.FigureWidget(fig))
