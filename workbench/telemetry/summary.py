"""The summary table of runs side by side: one set of rows for the CLI and the report.

``python -m workbench run / demo / compare`` print it as text (``text_table``), the report and
the notebook's ``compare`` as HTML (``ui.report``); both take the rows and cells from ``table``,
so the labels, units, ratios and noise marks are the same everywhere. No plotting and no torch
here: the CLI reads saved runs without loading either.

Ratios are to the first run: tokens/s with its noise (``telemetry.noise``: "0.98x, within
noise (±12%)" is no difference), peak GPU memory plainly (the allocator's peak does not
scatter from step to step).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from workbench.telemetry import noise as noise_mod
from workbench.telemetry.evals import eval_rows, metrics_of
from workbench.telemetry.health import Health, health
from workbench.telemetry.record import RunRecord
from workbench.telemetry.steady import STEADY_NOTE, throughput
from workbench.telemetry.values import finite, num

MB = 1e6
#: Hex digits of ``param_digest`` shown when runs sit side by side (the full 64 made every
#: column ~500 px wide); one run's own table shows it whole.
DIGEST_CHARS = 16
NOTE = f"{STEADY_NOTE} MB = 10^6 bytes."


def summary_metrics(rec: RunRecord) -> dict[str, Any]:
    """Headline numbers of a run, from ``rec.summary`` where the run was saved, else computed
    from its steps (a live run has no summary yet).

    Returns:
        ``tokens_per_s`` and ``step_seconds`` (s, median) over steady steps,
        ``wall_tokens_per_s`` over all steps, ``warmup_steps`` (``telemetry.steady``),
        ``peak_gpu_mem_bytes`` (the run's own), ``bytes_h2d`` and ``bytes_d2h`` (bytes per
        step), ``final_loss``, ``steps``, ``status``, ``param_digest``; NaN where unknown;
        ``dev``: the first and last evals' metrics, ``{"start": {...}, "end": {...}}``
        (``telemetry/evals.py``; empty without evals); ``health`` (a ``Health``) and
        ``noise`` (``telemetry.noise``).
    """
    s, steps = rec.summary, rec.steps
    speed = throughput(steps)
    tail = [num(r.get("loss")) for r in steps[-max(1, len(steps) // 10):]]
    tail = [x for x in tail if math.isfinite(x)]
    n = max(len(steps), 1)
    peak = num(s.get("peak_gpu_mem_bytes"))
    if not peak > 0:  # CPU run or no summary: the allocator's per-step peak, then NVML
        base = num(rec.environment.get("torch allocated before run (bytes)"), 0.0)
        peak = max((num(r.get("mem_peak"), 0.0) - base for r in steps), default=0.0)
    if not peak > 0:
        base = num(rec.environment.get("gpu mem used before run (bytes)"), 0.0)
        used = [num(x.get("gpu mem used (bytes)")) - base for x in rec.samples]
        peak = max((v for v in used if math.isfinite(v)), default=math.nan)
    saved = s.get("health")
    out = {
        **{k: s.get(k, v) for k, v in speed.items() if k != "steady_steps"},
        "peak_gpu_mem_bytes": peak,
        "bytes_h2d": s.get("bytes_h2d", sum(num(r.get("bytes_h2d"), 0.0) for r in steps) / n),
        "bytes_d2h": s.get("bytes_d2h", sum(num(r.get("bytes_d2h"), 0.0) for r in steps) / n),
        "final_loss": s.get("final_loss", sum(tail) / len(tail) if tail else math.nan),
    }
    out = {k: num(v) if k != "warmup_steps" else v for k, v in out.items()}
    out.update(dev={w: metrics_of(rec.evals[i]) if rec.evals else {}
                    for w, i in (("start", 0), ("end", -1))},
               steps=len(steps), status=rec.status, param_digest=rec.param_digest,
               health=Health.from_dict(saved) if isinstance(saved, dict) else health(rec),
               noise=noise_mod.of(rec), sizes=_sizes(rec))
    return out


def _sizes(rec: RunRecord) -> str | None:
    """"36 / 4" from the run's environment (None for data drawn without end, or older runs)."""
    env = rec.environment
    train, dev = env.get("train examples"), env.get("dev examples")
    if train is None and dev is None:
        return None
    return f"{fmt_value(train)} / {fmt_value(dev)}"


#: Rows: label (units in it), the value from ``summary_metrics``, its format, and the ratio
#: to the first run it carries: "speed" (with noise), "plain" or None.
Row = tuple[str, Callable[[dict[str, Any]], Any], "str | None", "str | None"]
ROWS: list[Row] = [
    ("health", lambda m: m["health"].state, None, None),
    ("status", lambda m: m["status"], None, None),
    ("steps", lambda m: m["steps"], "{:,}", None),
    ("train / dev examples", lambda m: m["sizes"], None, None),
    ("tokens/s (steady)", lambda m: m["tokens_per_s"], "{:,.0f}", "speed"),
    ("step time (s, steady median)", lambda m: m["step_seconds"], "{:.4f}", None),
    ("step spread (IQR / median)", lambda m: m["noise"].get("step_spread"), "{:.0%}", None),
    ("tokens/s (all steps)", lambda m: m["wall_tokens_per_s"], "{:,.0f}", None),
    ("warm-up steps left out", lambda m: m["warmup_steps"], "{:,}", None),
    ("other processes' CPU (%)", lambda m: m["noise"].get("other_cpu_pct"), "{:.0f}", None),
    ("peak GPU memory (MB)", lambda m: m["peak_gpu_mem_bytes"] / MB, "{:,.1f}", "plain"),
    ("H2D per step (MB)", lambda m: m["bytes_h2d"] / MB, "{:,.2f}", None),
    ("D2H per step (MB)", lambda m: m["bytes_d2h"] / MB, "{:,.2f}", None),
    ("final loss", lambda m: m["final_loss"], "{:.4f}", None),
    # here: the dev metrics the runs recorded, start and end (``rows``)
    ("param_digest", lambda m: m["param_digest"] or None, None, None),
]


def rows(recs: Sequence[RunRecord]) -> list[Row]:
    """``ROWS`` with, after the final loss, the start and end of each dev metric some run of
    ``recs`` recorded, and fo-offload's update schedule where some run has one."""
    dev: list[Row] = [(label, lambda m, k=key, w=when: m["dev"][w].get(k), fmt, None)
                      for label, key, when, fmt in eval_rows(recs)]
    at = [r[0] for r in ROWS].index("final loss") + 1
    sched: list[Row] = []
    if any("fo_stride" in r.info for r in recs):
        sched = [("fo-offload update schedule", lambda m: m["schedule"], None, None)]
    data: list[Row] = []  # what the dev metrics are over, and which word scores each label
    if any("examples" in r.info for r in recs):
        data.append(("examples (train / dev)", lambda m: m["examples"], None, None))
    if any("labels" in r.info for r in recs):
        data.append(("label words", lambda m: m["labels"], None, None))
    return ROWS[:at] + data + dev + sched + ROWS[at:]


def table(recs: Sequence[RunRecord], digest_chars: int = DIGEST_CHARS
          ) -> list[tuple[str, list[str]]]:
    """(label, one cell per run) for every row; "-" where a run has no value."""
    metrics = []
    for r in recs:
        m = summary_metrics(r)
        m["schedule"] = schedule_text(r.info)
        m["examples"], m["labels"] = data_text(r.info)
        metrics.append(m)
    out = []
    for label, get, fmt, ratio in rows(recs):
        base = get(metrics[0])
        cells = []
        for i, m in enumerate(metrics):
            v = get(m)
            text = fmt_value(v, fmt)
            if i and ratio and text != "-" and finite(v) and finite(base) and base > 0:
                text += (f" ({noise_mod.ratio_text(v / base, metrics[0]['noise'], m['noise'])})"
                         if ratio == "speed" else f" ({v / base:.2f}x)")
            if label == "param_digest" and len(text) > digest_chars:
                text = text[:digest_chars] + "…"
            cells.append(text)
        out.append((label, cells))
    return out


def data_text(info: dict[str, Any]) -> tuple[str | None, str | None]:
    """("train / dev" example counts, "label 'word', ...") of a run's ``info``, None where the
    run did not record them (synthetic data, runs from before they were kept)."""
    n = info.get("examples") or {}
    examples = (f"{n['train']:,} / {n['dev']:,}"
                if isinstance(n.get("train"), int) and isinstance(n.get("dev"), int) else None)
    labels = info.get("labels")
    words = (", ".join(f"{k} {v!r}" for k, v in labels.items())
             if isinstance(labels, dict) and labels else None)
    return examples, words


def text_table(recs: Sequence[RunRecord], labels: Sequence[str]) -> str:
    """The table as aligned text, the runs' labels on top, each run's health and the note
    under it (what the CLI prints)."""
    grid = [("run", list(labels)), *table(recs)]
    width = max(len(label) for label, _ in grid)
    cols = [max(len(c[i]) for _, c in grid) for i in range(len(recs))]
    lines = [f"{label:<{width}}  " + "  ".join(f"{c:>{w}}" for c, w in zip(cells, cols))
             for label, cells in grid]
    lines.append("health:")
    for rec, label in zip(recs, labels):
        h = summary_metrics(rec)["health"]
        lines.append(f"  {label}: {h.text}" + (f"; next: {h.advice}" if h.advice else ""))
    return "\n".join(lines + [f"note: {NOTE}"])


#: The keys that tell one fo-offload placement from another, in ``fo_trial``'s candidates and
#: in ``fo_stride`` + ``fo_perf_inputs``.
PLACEMENT = ("stride", "downcast", "subgroup_size", "gpu_resident_ratio")


def schedule_text(info: dict) -> str | None:
    """"stride 3, downcast on gpu, subgroups of 50,000,000, best of 5 tried" from a run's
    fo-offload records (None for other methods): the stride kept, where 16-bit weights are
    downcast, the subgroup size, and under "auto" how many placements were tried. Under "auto"
    the schedule is the trial's choice (``fo_trial``), also when the run ended with the trial,
    before the choice ran (the placement published last is then the last one tried): the text
    says so."""
    if "fo_stride" not in info:
        return None
    from workbench.plan.placement import NO_GPU  # fo-offload runs only

    shown = {**info.get("fo_perf_inputs", {}), "stride": info["fo_stride"]}  # placed last
    tried = info.get("fo_trial", {}).get("candidates", [])
    chosen = info.get("fo_trial", {}).get("chosen")
    ran = True
    if chosen is not None:
        kept = tried[chosen]
        # it ran if it is the placement published last (older records lack the resident share)
        ran = all(shown.get(k) in (None, kept.get(k)) for k in PLACEMENT)
        shown = {**shown, **kept}
    stride, downcast, size = shown["stride"], shown.get("downcast"), shown.get("subgroup_size")
    text = "all on the CPU" if stride == NO_GPU else f"stride {stride}"
    text += f", downcast on {downcast}" if downcast not in (None, "none") else ""
    text += f", subgroups of {size:,}" if isinstance(size, int) else ""
    text += f", best of {len(tried)} tried" if tried else ""
    return text + ("" if ran else " (the run ended before it ran)")


def fmt_value(v: Any, fmt: str | None = None) -> str:
    """A cell: "-" for missing or non-finite, ``fmt`` for numbers, else plain text."""
    if v is None or isinstance(v, float) and not math.isfinite(v):
        return "-"
    if fmt is not None and finite(v):
        return fmt.format(v)
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)