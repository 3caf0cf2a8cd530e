"""Self-contained HTML report of one or more runs (opens offline, no server, no CDN).

The report reads run directories (or records) through ``RunRecord``, never live widgets, and
draws with the same ``figures`` builders as the dashboard. plotly.js is embedded once in the
page head; every figure after that is a ``<div>`` plus a ``Plotly.newPlot`` call.

    python -m workbench report RUN_DIR [RUN_DIR ...] -o report.html
"""
from __future__ import annotations

import datetime as _dt
import html
from pathlib import Path
from typing import Any, Iterable, Sequence

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from workbench.config import STREAMING_METHODS, knob_info
from workbench.telemetry import noise
from workbench.telemetry.advice import next_knob
from workbench.telemetry.exactness import exactness_note
from workbench.telemetry.naming import differing, run_labels, value_text
from workbench.telemetry.record import RunRecord
from workbench.telemetry.summary import (DIGEST_CHARS, MB, fmt_value, summary_metrics,  # noqa: F401
                                         table)
from workbench.telemetry.steady import STEADY_NOTE
from workbench.telemetry.values import finite
from workbench.telemetry.verdict import verdict
from workbench.runs.outputs import REPORT_MARKER, OutputError, check_report_out
from workbench.ui import figures

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1400px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 18px; border-bottom: 1px solid #ddd; padding-top: 12px; }
table { border-collapse: collapse; margin: 8px 0 16px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f6f6f6; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
code { font-size: 12px; } .tables { display: flex; gap: 24px; flex-wrap: wrap; }
.note { color: #666; } ul.why, ul.story { padding-left: 20px; } ul.story li { margin: 6px 0; }
details { margin: 6px 0 12px; } summary { cursor: pointer; color: #444; }
.health { font-weight: 600; padding: 0 4px; border-radius: 3px; }
.h-learning { background: #e3f4e3; } .h-not-learning, .h-too-short-to-tell { background: #f1f1f1; }
.h-diverging { background: #fdf0d5; } .h-diverged { background: #fbdcdc; }
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

    First what happened (per run: health, speed, memory, bound, next knob), then ``intro``
    (HTML parts, e.g. a sweep's table); with two runs or more, the comparison: one summary
    table, the settings that differ (the rest folded), the comparison figures; then a section
    per run: its figures (only panels with data; its timeline and its dev metric against
    steps, training time and forward passes are in the comparison when there is one), its
    settings and environment folded. The
    file embeds plotly.js once (about 5 MB) and loads nothing.

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
             "2<sup>30</sup> bytes where named); times in seconds since each run's start. "
             "Training time and forward passes (the dev metric's other x axes) count the "
             "training steps only, not the evals.</p>",
             "<h2 id='story'>what happened</h2>", story_html(recs, labels), *intro]
    toc = [f"<li><a href='#run-{i}'>{html.escape(label)}</a></li>"
           for i, label in enumerate(labels)]
    if len(recs) > 1:
        toc.insert(0, "<li><a href='#comparison'>comparison</a></li>")
    parts.append(f"<ul>{''.join(toc)}</ul>")
    if len(recs) > 1:
        parts += ["<h2 id='comparison'>comparison</h2>", summary_table_html(recs),
                  f"<p>{html.escape(digest_note(recs))}</p>", settings_html(recs)]
        parts += [_figure_html(f) for f in comparison_figures(recs)]
    for i, (rec, label) in enumerate(zip(recs, labels)):
        parts.append(f"<h2 id='run-{i}'>{html.escape(label)}</h2>")
        if stream_note(rec):
            parts.append(f"<p><b>{html.escape(stream_note(rec))}</b></p>")
        if len(recs) == 1:  # else its numbers are in the comparison's table
            parts.append(summary_table_html([rec], digest_chars=64))
        elif rec.param_digest:
            parts.append(f"<p class=note>param_digest <code>{rec.param_digest}</code></p>")
        # with a comparison, the stream timelines are drawn there, stacked: not twice
        parts.append(_figure_html(figures.dashboard_figure(rec, 0 if len(recs) > 1 else 3)))
        if len(recs) == 1 and rec.evals:  # else the comparison draws it, every run at once
            parts.append(_figure_html(figures.dev_by_cost([rec])))
        parts.append(_folded(f"settings ({len(rec.config)})", config_table_html(rec)))
        parts.append(_folded(f"environment ({len(rec.environment)})", _table(
            ["key", "value"], [[k, fmt_value(v)] for k, v in rec.environment.items()])))
    page = (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'>{REPORT_MARKER}"
            f"<title>{html.escape(title)}</title><style>{CSS}</style>"
            # plotly.js inline, once, so the file works offline and figures share it.
            f"<script type='text/javascript'>{get_plotlyjs()}</script></head>\n<body>"
            + "\n".join(parts) + "</body></html>\n")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


def comparison_figures(recs: Sequence[RunRecord], last_steps: int | None = 3
                       ) -> list[go.Figure]:
    """The comparison's figures that have data: speed (and memory) bars, the losses, the dev
    metric against steps, training time and forward passes (runs with evals), each run's own
    GPU memory (GPU runs), the stream timelines of the ``last_steps`` steps (runs with stream
    events)."""
    figs = [figures.compare_bars(recs), figures.compare_loss(recs)]
    if any(r.evals for r in recs):
        figs.append(figures.dev_by_cost(recs))
    if any(figures.run_memory(r) for r in recs):
        figs.append(figures.compare_memory(recs))
    if any(r.events for r in recs):
        figs.append(figures.compare_timelines(recs, last_steps))
    return figs


def story_html(recs: Sequence[RunRecord], labels: Sequence[str]) -> str:
    """Per run, a few lines: its learning health and what to try next; its speed (the ratio to
    the first run, or "within noise"), its memory, what bounds its step and the planner's next
    knob."""
    metrics = [summary_metrics(r) for r in recs]
    items = []
    for i, (rec, label, m) in enumerate(zip(recs, labels, metrics)):
        h = m["health"]
        state = (f"<span class='health h-{h.state.replace(' ', '-')}'>"
                 f"{html.escape(h.state)}</span>")
        why = html.escape(h.text.split(": ", 1)[1] if ": " in h.text else "")
        next_ = f" <i>Next:</i> {html.escape(h.advice)}." if h.advice else ""
        speed = f"{m['tokens_per_s']:,.0f} tokens/s steady" if finite(m["tokens_per_s"]) else ""
        if speed and i and finite(metrics[0]["tokens_per_s"]) and metrics[0]["tokens_per_s"] > 0:
            ratio = m["tokens_per_s"] / metrics[0]["tokens_per_s"]
            a, b = metrics[0]["noise"], m["noise"]
            within = noise.within(ratio, a, b)
            speed += (f" ({ratio:.2f}x {html.escape(labels[0])}'s"
                      + (f", {noise.within_text(a, b)}" if within else "") + ")")
        timing = noise.describe(m["noise"])
        peak = m["peak_gpu_mem_bytes"]
        memory = (f"peak GPU memory {peak / MB:,.1f} MB" if finite(peak) and peak > 0
                  else "no GPU memory (CPU run)")
        lines = [f"<b>{html.escape(label)}</b>: {state} {why}.{next_}",
                 "; ".join(x for x in (speed, memory) if x)
                 + f" <span class=note>({html.escape(timing)})</span>",
                 f"bound: {html.escape(verdict(rec).text)}; next knob: "
                 f"{html.escape(next_knob(rec).text)}"]
        items.append("<li>" + "<br>".join(lines) + "</li>")
    return f"<ul class=story>{''.join(items)}</ul>"


def summary_table_html(recs: Sequence[RunRecord], digest_chars: int = DIGEST_CHARS) -> str:
    """Runs side by side (one column per run): ``telemetry.summary``'s rows, the CLI's table;
    tokens/s and peak GPU memory with the ratio to the first run ("within noise" where the
    runs' timing noise covers it)."""
    return _table(["", *run_labels(recs)],
                  [[label, *cells] for label, cells in table(recs, digest_chars)])


def settings_html(recs: Sequence[RunRecord]) -> str:
    """One table of the settings that differ between the runs, the rest folded."""
    keys = differing([r.config for r in recs])
    labels = run_labels(recs)
    same = [k for k in recs[0].config if k not in keys]
    head = (_table(["setting", *labels], [[k, *(value_text(r.config.get(k, "-")) for r in recs)]
                                          for k in keys])
            if keys else "<p>Every setting is the same in every run.</p>")
    rest = _table(["setting", "value", "unit", "help"],
                  [_config_row(k, recs[0].config[k]) for k in same])
    return (f"<h3>settings that differ</h3>{head}"
            + _folded(f"the {len(same)} settings every run shares", rest))


def stream_note(rec: RunRecord) -> str:
    """How an adapter run's frozen base moved, from its record ('' for other runs): a streamed
    method with ``peft=lora`` sends the base host -> GPU only; the bytes are the ones counted."""
    cfg = rec.config
    if cfg.get("peft") != "lora" or cfg.get("method") not in STREAMING_METHODS:
        return ""
    m = summary_metrics(rec)
    up, down = m["bytes_h2d"], m["bytes_d2h"]
    codec = cfg.get("base_codec", "fp32")
    if finite(down) and down > 0:  # never expected: say what was counted, claim nothing
        return f"adapter run with base_codec {codec}: {down / MB:,.2f} MB per step went D2H"
    moved = f", {up / MB:,.2f} MB up per step, none down" if finite(up) else ""
    base = f"; base_digest {rec.base_digest}" if rec.base_digest else ""
    return (f"frozen stream: H2D only (base_codec {codec}{moved}; adapters stay on the "
            f"device){base}")


def digest_note(recs: Sequence[RunRecord]) -> str:
    """Whether the runs ended with the same parameters (same ``param_digest``)."""
    digests = [r.param_digest for r in recs]
    if not all(digests):
        return "param_digest: not recorded for every run (unsaved or failed runs)"
    same = len(set(digests)) == 1
    note = exactness_note([r.config for r in recs])
    return f"param_digest {'identical' if same else 'DIFFERENT'} across the runs" + (
        f" ({note})" if note else "")


def config_table_html(rec: RunRecord) -> str:
    """The run's settings with their units; fields unknown to this version are shown as is."""
    return _table(["field", "value", "unit", "help"],
                  [_config_row(k, v) for k, v in rec.config.items()])


def _config_row(key: str, value: Any) -> list[str]:
    try:
        info = knob_info(key)
        unit, help_ = info.get("unit") or "", info.get("help") or ""
    except KeyError:
        unit = help_ = ""
    return [key, fmt_value(value), unit, help_]


def _folded(summary: str, body: str) -> str:
    return f"<details><summary>{html.escape(summary)}</summary>{body}</details>"


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
