"""Tables and the report of a sweep or an auto-tune, read from its ``sweep.json`` points.

The CLI, the sweep widget and the HTML report show the same table: finished runs best first by
the sweep's ``rank_by`` (``telemetry.ranking``: the dev metric, the loss or tokens/s), each
with its steady tokens/s (ratio to the fastest, "within noise" where the step spreads cover
it), peak GPU memory, the planner's prediction, its final loss and dev metric, its health and
bound, and whether the noise can tell it from the first; refused, failed and skipped points
last, with the reason.
"""
from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any, Sequence

from workbench.recipes.sweep import FINISHED, load_manifest
from workbench.telemetry import noise, ranking
from workbench.telemetry.evals import main_metric
from workbench.telemetry.naming import value_text
from workbench.telemetry.record import RunRecord
from workbench.telemetry.values import num
from workbench.ui.report import write_report


def _cell(v: float, fmt: str) -> str:
    return fmt.format(v) if math.isfinite(v) else "-"


def rank_of(manifest: dict[str, Any]) -> ranking.RankBy:
    """The manifest's ranking (sweeps written before ``rank_by`` ranked by tokens/s)."""
    return ranking.parse_rank_by(manifest.get("rank_by") or ranking.SPEED)


def ranked(points: Sequence[dict[str, Any]], rank: ranking.RankBy | None = None
           ) -> list[dict[str, Any]]:
    """Finished points best first by ``rank`` (default tokens/s), then the others in order."""
    done = [p for p in points if p["status"] in FINISHED]
    done = ranking.ranked(done, rank or ranking.parse_rank_by(ranking.SPEED),
                          lambda p: p["measured"])
    return done + [p for p in points if p["status"] not in FINISHED]


def sweep_table_html(points: Sequence[dict[str, Any]], predicted_vs_measured: bool = False,
                     rank: ranking.RankBy | None = None, config: dict | None = None) -> str:
    """The sweep's points (``Point.to_json`` dicts) as an HTML table; one column per knob.
    ``predicted_vs_measured`` adds the ratio of measured to predicted tokens/s (auto-tune);
    ``rank``: the order (default tokens/s); ``config``: the base settings (names the dev
    metric shown)."""
    rank = rank or ranking.parse_rank_by(ranking.SPEED)
    main = main_metric(config or {})
    own = rank.own_column(main.key)  # ranked by a dev metric shown nowhere else
    knobs = list(dict.fromkeys(k for p in points for k in p["changes"]))
    head = ["#", *knobs, "status", "tokens/s", "step (s)", "peak GPU memory (GB)",
            "predicted tokens/s", *(["measured / predicted"] if predicted_vs_measured else []),
            "final loss", main.label, *([rank.label] if own else []), "health", "bound",
            "vs first"]
    rows = ranked(points, rank)
    done = [p for p in rows if p["status"] in FINISHED]
    fastest = max((p["measured"] for p in done), key=lambda m: num(m.get("tokens_per_s")),
                  default={})
    best = num(fastest.get("tokens_per_s"))
    body = []
    for i, p in enumerate(rows, start=1):
        m, pred = p["measured"], p["predicted"]
        cells = [str(i) if p["status"] in FINISHED else "",
                 *(html.escape(_text(p["changes"].get(k, ""))) for k in knobs),
                 html.escape(p["status"])]
        if p["status"] in FINISHED:
            tps, peak = num(m.get("tokens_per_s")), num(m.get("peak_gpu_mem_bytes"))
            ratio = ""  # to the fastest, "within noise" where the step spreads cover it
            if best > 0 and math.isfinite(tps) and m is fastest:
                ratio = " (1.00x)"  # the fastest itself: no noise to weigh
            elif best > 0 and math.isfinite(tps):
                ratio = " (" + noise.ratio_text(tps / best, fastest.get("noise") or {},
                                                m.get("noise") or {}) + ")"
            want = num(pred.get("tokens_per_s"))
            cells += [_cell(tps, "{:,.0f}") + html.escape(ratio),
                      _cell(num(m.get("step_seconds")), "{:.4f}"),
                      _cell(peak / 1e9 if peak > 0 else math.nan, "{:.2f}"),
                      _cell(want, "{:,.0f}")]
            if predicted_vs_measured:
                cells.append(_cell(tps / want if want > 0 else math.nan, "{:.2f}x"))
            dev = (m.get("dev") or {}).get(main.key, m.get("eval_accuracy")
                                           if main.key == "accuracy" else None)
            mark = ("best" if i == 1 else "within noise" if rank.within(done[0]["measured"], m)
                    else "")
            cells += [_cell(num(m.get("final_loss")), "{:.4f}"), _cell(num(dev), main.fmt),
                      *([_cell(rank.value(m), rank.fmt)] if own else []),
                      html.escape(str(m.get("health") or "-")),
                      f"<span title='{html.escape(m.get('verdict', ''))}'>"
                      f"{html.escape(str(m.get('bound', '-')))}</span>", mark]
        else:
            cells.append(f"<span class=note>{html.escape(p.get('reason', ''))}</span>")
        span = len(head) - len(cells) + 1
        tds = "".join(f"<td>{c}</td>" for c in cells[:-1])
        tds += f"<td colspan={span}>{cells[-1]}</td>" if span > 1 else f"<td>{cells[-1]}</td>"
        body.append(f"<tr>{tds}</tr>")
    heads = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    return (f"<p>ranked by <b>{html.escape(rank.label)}</b> "
            f"({'higher' if rank.higher else 'lower'} first); \"within noise\": the "
            "measurements cannot tell it from the first, so it is no loser</p>"
            f"<table class=sweep><thead><tr>{heads}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>")


def sweep_records(out_dir: str | Path, points: Sequence[dict[str, Any]],
                  rank: ranking.RankBy | None = None) -> list[RunRecord]:
    """The finished points' records, best first, each named after its point."""
    recs = []
    for p in ranked(points, rank):
        if p["status"] in FINISHED:
            rec = RunRecord.load(Path(out_dir) / p["dir"])
            rec.info["name"] = p["name"]
            recs.append(rec)
    return recs


def write_sweep_report(out_dir: str | Path, path: str | Path | None = None,
                       extra: Sequence[str] = ()) -> Path:
    """``out_dir/report.html`` (or ``path``): the sweep's table, then the comparison of its
    finished runs (best first by the sweep's ``rank_by``) and a section per run.

    Raises:
        FileNotFoundError: ``out_dir`` holds no ``sweep.json``.
        ValueError: no point finished.
    """
    out_dir = Path(out_dir)
    manifest = load_manifest(out_dir)
    points = manifest["points"]
    kind = manifest.get("kind", "sweep")
    rank = rank_of(manifest)
    recs = sweep_records(out_dir, points, rank)
    if not recs:
        raise ValueError(f"{out_dir}: no point of the {kind} finished; nothing to report")
    axes = ", ".join(f"{k} = {', '.join(map(_text, v))}" for k, v in manifest["axes"].items())
    best = manifest.get("extra", {}).get("best")
    if kind == "tune" and best:
        extra = [*extra, f"<p>Fastest measured: <b>{html.escape(best)}</b>, written to "
                 f"<code>{html.escape(str(out_dir / manifest['extra'].get('toml', '')))}</code> "
                 "(run it with <code>python -m workbench run --config FILE --out DIR</code>)."
                 "</p>"]
    title = f"zo-workbench {kind}: {out_dir.name}"
    intro = [f"<h2 id='{kind}'>{kind}</h2>",
             f"<p>{html.escape(axes or 'candidates proposed by the planner')}; status "
             f"{html.escape(manifest.get('status', '?'))}. Tokens/s are steady (warm-up step "
             "excluded); the planner's prediction beside each.</p>",
             *extra, sweep_table_html(points, predicted_vs_measured=kind == "tune", rank=rank,
                                      config=manifest.get("base"))]
    return write_report(recs, path or out_dir / "report.html", title, intro)


def _text(v: Any) -> str:
    return value_text(v)
