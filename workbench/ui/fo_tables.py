"""fo-offload's update schedule of a run as tables a reader can take in (notebook 05): what was
placed where and why, the rates the engine measured to decide it, and the placements its trial
timed, instead of the raw ``fo_*`` dictionaries of ``run.json``."""
from __future__ import annotations

import html
import math
from typing import Any

from workbench.plan.placement import NO_GPU
from workbench.telemetry.record import RunRecord
from workbench.telemetry.summary import schedule_text
from workbench.telemetry.values import num

#: The measured parts of an update (``calibrate/fo.py``), as the tables name them.
RATES = {"B": "fp32 masters up the link", "Bd": "gradients down the link",
         "Ug": "update on the GPU", "Uc": "update on the CPU (AdamW)",
         "Dc": "16-bit downcast on the CPU", "Ucd": "CPU update beside the link's copies"}


def fo_tables_html(rec: RunRecord) -> str:
    """Three small tables of ``rec``'s fo-offload schedule (an empty string for other runs):
    the schedule kept, the rates it was placed by (parameters/s), and the placements tried."""
    info = rec.info
    if "fo_stride" not in info:
        return ""
    inputs = info.get("fo_perf_inputs", {})
    pred, meas = num(info.get("fo_update_predicted_s")), num(info.get("fo_update_measured_s"))
    where = (f"{inputs.get('gpu_subgroups', '?')} on the GPU, {inputs.get('cpu_subgroups', '?')} "
             f"on the CPU, {inputs.get('resident_subgroups', 0)} kept on the GPU")
    rows = [["schedule kept", schedule_text(info) or "-"],
            ["subgroups", f"{inputs.get('subgroups', '?')} of {_int(inputs.get('subgroup_size'))} "
                          f"parameters: {where}"],
            ["update per step", f"predicted {_ms(pred)}, measured {_ms(meas)}"
             + (f" ({meas / pred:.1f}x the prediction)" if pred > 0 and meas > 0 else "")],
            ["k", f"{num(inputs.get('k')):.3g} (the performance model's ratio; below 1 the "
                  "GPU updates faster than the CPU, the link included)"],
            ["CPU AdamW", f"{inputs.get('cpu_adamw', '?')}, {inputs.get('update_threads', '?')} "
                          "thread(s)"]]
    if info.get("fo_contention", {}).get("note"):
        rows.append(["note", str(info["fo_contention"]["note"])])
    parts = ["<h4>fo-offload's update schedule</h4>", _table(["", ""], rows)]
    calib = info.get("fo_calibration", {})
    rate_rows = [[key, RATES.get(key, key), f"{num(c.get('per_s')) / 1e6:,.0f}",
                  f"{num(c.get('median_s')) * 1e6:,.1f}", f"{num(c.get('spread')):.0%}"]
                 for key, c in calib.items() if isinstance(c, dict) and "per_s" in c]
    if rate_rows:
        parts += ["<h4>what the engine measured to place them (one subgroup)</h4>",
                  _table(["part", "what", "M parameters/s", "median µs", "spread"], rate_rows)]
    trial = info.get("fo_trial", {})
    if trial.get("candidates"):
        chosen = trial.get("chosen")
        cand = [[("all on the CPU" if c.get("stride") == NO_GPU else f"stride {c.get('stride')}"),
                 str(c.get("downcast", "-")), f"{num(c.get('gpu_share')):.0%}",
                 "out of memory" if c.get("out_of_memory") else "over the cap"
                 if c.get("over_cap") else _ms(num(c.get("step_s"))),
                 _ms(num(c.get("update_s_predicted"))), _ms(num(c.get("update_s_measured"))),
                 "kept" if i == chosen else ""]
                for i, c in enumerate(trial["candidates"])]
        parts += ["<h4>placements the trial timed (a step each)</h4>",
                  _table(["placement", "downcast", "on the GPU", "step", "update predicted",
                          "update measured", ""], cand)]
    return "<div>" + "".join(parts) + "</div>"


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th style='text-align:left'>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{html.escape(c)}</td>"
                                    for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.3g} ms" if math.isfinite(seconds) else "-"


def _int(v: Any) -> str:
    return f"{v:,}" if isinstance(v, int) else str(v)
