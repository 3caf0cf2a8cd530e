"""Self-contained HTML report of one or more runs (opens offline, no server, no CDN).

The report reads run directories (or records) through ``RunRecord``, never live widgets, and
draws with the same ``figures`` builders as the dashboard. plotly.js is embedded once in the
page head; every figure after that is a ``<div>`` plus a ``Plotly.newPlot`` call.

    python -m workbench report RUN_DIR [RUN_DIR ...] -o report.html
"""
from __future__ import annotations

import argparse
import datetime as _dt
import html
import math
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from workbench.config import STREAMING_METHODS, knob_info
from workbench.telemetry.advice import next_knob
from workbench.telemetry.evals import eval_rows
from workbench.telemetry.record import RunRecord
from workbench.telemetry.steady import STEADY_NOTE
from workbench.telemetry.verdict import verdict
from workbench.ui import figures
from workbench.ui.figures import MB, run_labels, summary_metrics

#: Summary rows: label, value from ``summary_metrics``, format; units in the label.
SUMMARY_ROWS: list[tuple[str, Callable[[dict[str, Any]], Any], str | None]] = [
    ("status", lambda m: m["status"], None),
    ("steps", lambda m: m["steps"], "{:,}"),
    ("tokens/s (steady)", lambda m: m["tokens_per_s"], "{:,.0f}"),
    ("step time (s, steady median)", lambda m: m["step_seconds"], "{:.4f}"),
    ("tokens/s (all steps)", lambda m: m["wall_tokens_per_s"], "{:,.0f}"),
    ("warm-up steps left out", lambda m: m["warmup_steps"], "{:,}"),
    ("peak GPU memory (MB)", lambda m: m["peak_gpu_mem_bytes"] / MB, "{:,.1f}"),
    ("H2D per step (MB)", lambda m: m["bytes_h2d"] / MB, "{:,.2f}"),
    ("D2H per step (MB)", lambda m: m["bytes_d2h"] / MB, "{:,.2f}"),
    ("final loss", lambda m: m["final_loss"], "{:.4f}"),
    # here: the dev metrics the runs recorded, start and end (``summary_rows``)
    ("param_digest", lambda m: m["param_digest"] or None, None),
]
RATIO_ROWS = ("tokens/s (steady)", "peak GPU memory (MB)")
#: Hex digits of ``param_digest`` shown when runs sit side by side (the full 64 made every column
#: ~500 px wide, pushing a table of 3+ runs off the notebook); run sections show it whole.
DIGEST_CHARS = 16

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1400px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 18px; border-bottom: 1px solid #ddd; padding-top: 12px; }
table { border-collapse: collapse; margin: 8px 0 16px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f6f6f6; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
code { font-size: 12px; } .tables { display: flex; gap: 24px; flex-wrap: wrap; }
.note { color: #666; } ul.why { padding-left: 20px; }
"""


def load_runs(runs: Iterable[str | Path | RunRecord], caller: str) -> list[RunRecord]:
    """Records for run directories or records (records are snapshotted: safe while live).

    Raises:
        ValueError: no runs (the message names ``caller``).
        FileNotFoundError: a path that is not a run directory.
    """
    recs = [r.snapshot() if isinstance(r, RunRecord) else RunRecord.load(r) for r in runs]
    if not recs:
        raise ValueError(f"{caller} needs at least one run (a run directory or RunRecord)")
    return recs


def write_report(runs: Sequence[str | Path | RunRecord], path: str | Path,
                 title: str = "zo-workbench report", intro: Sequence[str] = ()) -> Path:
    """Write one HTML file describing ``runs``; returns its path.

    Per run: summary, dashboard charts, config and environment tables; with two runs or more, a
    comparison section first; ``intro`` (HTML parts, e.g. a sweep's table) before both. The file
    embeds plotly.js once (about 5 MB) and loads nothing.

    Raises:
        ValueError: no runs.
        FileNotFoundError: a path that is not a run directory.
    """
    recs = load_runs(runs, "write_report")
    labels = run_labels(recs)
    parts = [f"<h1>{html.escape(title)}</h1>",
             f"<p class=note>{len(recs)} run(s), written "
             f"{_dt.datetime.now().isoformat(timespec='seconds')}. {html.escape(STEADY_NOTE)} "
             "Memory in MB = 10<sup>6</sup> bytes, GB = 10<sup>9</sup> bytes (GiB = "
             "2<sup>30</sup> bytes where named); times in seconds since each run's start.</p>",
             *intro]
    toc = [f"<li><a href='#run-{i}'>{html.escape(label)}</a></li>"
           for i, label in enumerate(labels)]
    if len(recs) > 1:
        toc.insert(0, "<li><a href='#comparison'>comparison</a></li>")
    parts.append(f"<ul>{''.join(toc)}</ul>")
    if len(recs) > 1:
        parts.append("<h2 id='comparison'>comparison</h2>")
        parts.append(summary_table_html(recs))
        parts.append(f"<p>{html.escape(digest_note(recs))}</p>")
        parts.append(why_html(recs))
        for fig in (figures.compare_bars(recs), figures.compare_loss(recs),
                    figures.compare_memory(recs), figures.compare_timelines(recs)):
            parts.append(_figure_html(fig))
    for i, (rec, label) in enumerate(zip(recs, labels)):
        parts.append(f"<h2 id='run-{i}'>{html.escape(label)}</h2>")
        parts.append(why_html([rec], labels=False))
        metrics = summary_metrics(rec)
        if stream_note(rec):
            parts.append(f"<p><b>{html.escape(stream_note(rec))}</b></p>")
        parts.append(_table(["metric", "value"], [[lbl, _fmt(get(metrics), fmt)]
                                                  for lbl, get, fmt in summary_rows([rec])]))
        parts.append(_figure_html(figures.dashboard_figure(rec)))
        parts.append("<div class=tables><div><h3>config</h3>" + config_table_html(rec)
                     + "</div><div><h3>environment</h3>"
                     + _table(["key", "value"], [[k, _fmt(v)] for k, v in rec.environment.items()])
                     + "</div></div>")
    page = ("<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>{CSS}</style>"
            # plotly.js inline, once, so the file works offline and figures share it.
            f"<script type='text/javascript'>{get_plotlyjs()}</script></head>\n<body>"
            + "\n".join(parts) + "</body></html>\n")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


def summary_rows(recs: Sequence[RunRecord]) -> list[tuple[str, Callable, str | None]]:
    """``SUMMARY_ROWS`` with, after the final loss, the start and end of each dev metric some
    run of ``recs`` recorded (classify: accuracy, loss; completion: loss, perplexity, exact
    match, token F1; lm: loss, perplexity)."""
    dev = [(label, lambda m, k=key, w=when: m["dev"][w].get(k), fmt)
           for label, key, when, fmt in eval_rows(recs)]
    at = [label for label, _, _ in SUMMARY_ROWS].index("final loss") + 1
    return SUMMARY_ROWS[:at] + dev + SUMMARY_ROWS[at:]


def summary_table_html(recs: Sequence[RunRecord]) -> str:
    """Runs side by side (one column per run), with ratios to the first for tokens/s and peak
    GPU memory; digests shortened to their first ``DIGEST_CHARS`` hex digits."""
    metrics = [summary_metrics(r) for r in recs]
    rows = []
    for label, get, fmt in summary_rows(recs):
        cells, base = [label], get(metrics[0])
        for i, m in enumerate(metrics):
            v = get(m)
            text = _fmt(v, fmt)
            if (i and label in RATIO_ROWS and _finite(v) and _finite(base) and base > 0):
                text += f" ({v / base:.2f}x)"
            if label == "param_digest" and len(text) > DIGEST_CHARS:
                text = text[:DIGEST_CHARS] + "…"
            cells.append(text)
        rows.append(cells)
    return _table(["", *run_labels(recs)], rows)


def why_html(recs: Sequence[RunRecord], labels: bool = True) -> str:
    """Each run's bottleneck verdict and the planner's best next knob, one line per run."""
    items = []
    for rec, label in zip(recs, run_labels(recs)):
        who = f"{html.escape(label)}: " if labels else ""
        items.append(f"<li>{who}<b>{html.escape(verdict(rec).text)}</b> · next knob: "
                     f"{html.escape(next_knob(rec).text)}</li>")
    return f"<ul class=why>{''.join(items)}</ul>"


def stream_note(rec: RunRecord) -> str:
    """How an adapter run's frozen base moved, from its record ('' for other runs): a streamed
    method with ``peft=lora`` sends the base host -> GPU only; the bytes are the ones counted."""
    cfg = rec.config
    if cfg.get("peft") != "lora" or cfg.get("method") not in STREAMING_METHODS:
        return ""
    m = summary_metrics(rec)
    up, down = m["bytes_h2d"], m["bytes_d2h"]
    codec = cfg.get("base_codec", "fp32")
    if _finite(down) and down > 0:  # never expected: say what was counted, claim nothing
        return f"adapter run with base_codec {codec}: {down / MB:,.2f} MB per step went D2H"
    moved = f", {up / MB:,.2f} MB up per step, none down" if _finite(up) else ""
    base = f"; base_digest {rec.base_digest}" if rec.base_digest else ""
    return (f"frozen stream: H2D only (base_codec {codec}{moved}; adapters stay on the "
            f"device){base}")


def digest_note(recs: Sequence[RunRecord]) -> str:
    """Whether the runs ended with the same parameters (same ``param_digest``)."""
    digests = [r.param_digest for r in recs]
    if not all(digests):
        return "param_digest: not recorded for every run (unsaved or failed runs)"
    same = len(set(digests)) == 1
    return f"param_digest {'identical' if same else 'DIFFERENT'} across the runs"


def config_table_html(rec: RunRecord) -> str:
    """The run's settings with their units; fields unknown to this version are shown as is."""
    rows = []
    for key, value in rec.config.items():
        try:
            info = knob_info(key)
            unit, help_ = info.get("unit") or "", info.get("help") or ""
        except KeyError:
            unit = help_ = ""
        rows.append([key, _fmt(value), unit, help_])
    return _table(["field", "value", "unit", "help"], rows)


def _figure_html(fig: go.Figure) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False,
                       default_height=f"{fig.layout.height or 450}px",
                       config={"displaylogo": False, "responsive": True})


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(text: str) -> str:
    numeric = text[:1].isdigit() or text[:1] == "-" and text[1:2].isdigit()
    return f"<td{' class=num' if numeric else ''}>{html.escape(text)}</td>"


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _fmt(v: Any, fmt: str | None = None) -> str:
    if v is None or isinstance(v, float) and not math.isfinite(v):
        return "-"
    if fmt is not None and _finite(v):
        return fmt.format(v)
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def main(argv: list[str] | None = None) -> int:
    """``python -m workbench.ui.report RUN_DIR ... -o report.html``; prints the file's path."""
    p = argparse.ArgumentParser(prog="python -m workbench report",
                                description="Write a self-contained HTML report of saved runs.")
    p.add_argument("run_dirs", nargs="+", help="run directories (each holds run.json)")
    p.add_argument("-o", "--out", default="report.html", help="HTML file to write")
    p.add_argument("--title", default="zo-workbench report")
    args = p.parse_args(argv)
    try:
        path = write_report(args.run_dirs, args.out, args.title)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(path.resolve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
