"""HTML report: self-contained, plotly.js once, every run's numbers in it; the CLI command."""
from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.config import RunConfig
from workbench.recipes.train import run
from workbench.telemetry.evals import BY_KEY
from workbench.telemetry.record import RunRecord
from workbench.ui.dashboard import Dashboard
from workbench.ui.report import write_report

TINY = dict(model="tiny-opt", steps=3, batch_size=4, seq_len=32, eval_samples=8)
PLOTLY_MARKER = "* plotly.js v"  # the bundle's licence header, once per copy
REMOTE_SCRIPT = re.compile(r"<script[^>]*\bsrc\s*=\s*['\"]?https?://", re.I)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ui-report")
    for method in ("mezo", "zo-offload"):
        run(RunConfig(method=method, **TINY), out_dir=root / method, progress=False)
    return [root / "mezo", root / "zo-offload"]


def test_report_is_self_contained_with_every_run(run_dirs, tmp_path):
    path = write_report(run_dirs, tmp_path / "r.html")
    text = path.read_text(encoding="utf-8")
    assert text.count(PLOTLY_MARKER) == 1
    assert not REMOTE_SCRIPT.search(text)
    recs = [RunRecord.load(d) for d in run_dirs]
    for rec in recs:
        assert rec.param_digest and rec.param_digest in text
    assert "id='comparison'" in text
    assert "param_digest identical across the runs" in text  # same seed, same engine math
    # one dashboard per run + the comparison's bars, losses, dev metric by steps, time and
    # forward passes, and timelines (CPU runs: no GPU memory figure), each drawn once
    assert text.count("Plotly.newPlot(") == len(recs) + 4
    assert text.count("dev accuracy by forward passes") == 1
    for label in ("tokens/s (steady)", "step time (s, steady median)", "tokens/s (all steps)",
                  "warm-up steps left out", "peak GPU memory (MB)", "final loss",
                  "dev accuracy start", "dev accuracy end", "<h3>settings that differ</h3>",
                  "settings every run shares</summary>", "environment (", "learning rate",
                  "<h2 id='story'>what happened</h2>", "step spread (IQR / median)"):
        assert label in text
    assert f"{recs[1].summary['tokens_per_s']:,.0f}" in text
    # each run's bound and next knob, once, in what happened
    from workbench.telemetry.advice import next_knob
    from workbench.telemetry.verdict import verdict

    for rec in recs:
        assert text.count(html.escape(verdict(rec).text)) == 1
        assert html.escape(next_knob(rec).text) in text
    assert verdict(recs[1]).kind == "compute-bound"  # tiny zo-offload on a CPU: block passes


def test_report_of_one_live_record_has_no_comparison(tmp_path):
    rec = RunRecord(config={"method": "mezo", "model": "tiny-opt", "lr": 1e-3},
                    steps=[{"step": 0, "loss": 0.7, "seconds": 0.1, "tokens": 50, "end": 0.1}],
                    param_digest="abc123", status="running")
    text = write_report([rec], tmp_path / "one.html").read_text(encoding="utf-8")
    assert text.count(PLOTLY_MARKER) == 1 and "abc123" in text
    assert "id='comparison'" not in text and text.count("Plotly.newPlot(") == 1


def test_report_errors(tmp_path):
    with pytest.raises(ValueError):
        write_report([], tmp_path / "x.html")
    with pytest.raises(FileNotFoundError):
        write_report([tmp_path], tmp_path / "x.html")
    proc = subprocess.run([sys.executable, "-m", "workbench", "report", str(tmp_path), "-o",
                           str(tmp_path / "x.html")], cwd=REPO, capture_output=True, text=True,
                          timeout=120)  # not a run folder: one line, exit 2, nothing written
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "x.html").exists()


def test_cli_report_command(run_dirs, tmp_path):
    out = tmp_path / "x.html"
    proc = subprocess.run([sys.executable, "-m", "workbench", "report", *map(str, run_dirs),
                           "-o", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.is_file() and out.read_text(encoding="utf-8").count(PLOTLY_MARKER) == 1
    assert proc.stdout.strip() == str(out.resolve())


def test_cli_compare_prints_the_verdicts(run_dirs):
    proc = subprocess.run([sys.executable, "-m", "workbench", "compare", *map(str, run_dirs)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    from workbench.telemetry.verdict import verdict

    for d in run_dirs:  # named by their folders ("mezo", "zo-offload"): what differs
        assert f"{d.name}: {verdict(RunRecord.load(d)).text}" in proc.stdout
    assert proc.stdout.count("next knob: ") == len(run_dirs)
    assert "settings that differ: method mezo / zo-offload" in proc.stdout


#: Per objective: its settings and the dev metrics its run records (``telemetry/evals.py``).
TOKEN_RUNS = {"completion": (["max_new_tokens=4"],
                             {"dev loss": "loss", "dev perplexity": "perplexity",
                              "dev exact match": "exact_match", "dev token F1": "token_f1"}),
              "lm": ([], {"dev loss": "loss", "dev perplexity": "perplexity"})}


def test_report_and_compare_show_completion_and_lm_dev_metrics(tmp_path):
    """A user trains a completion run and an lm run, then asks for a report and a comparison:
    both show every dev metric of each objective, start and end, as run.json has it; each run's
    dashboard plots its objective's main dev metric."""
    dirs = []
    for objective, (extra, _) in TOKEN_RUNS.items():
        sets = [f"objective={objective}", "data=embedded", "model=tiny-opt", "method=mezo",
                "steps=2", "batch_size=4", "seq_len=48", "eval_samples=5", "sample_hz=0",
                "lr=1e-3", *extra]
        dirs.append(tmp_path / objective)
        _cli("run", "--out", str(dirs[-1]), "--quiet", *(a for s in sets for a in ("--set", s)))
    _cli("report", *map(str, dirs), "-o", str(tmp_path / "r.html"))
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    shown = _table_rows(page)
    compared = _cli("compare", *map(str, dirs)).splitlines()
    for i, (objective, (_, metrics)) in enumerate(TOKEN_RUNS.items()):
        rec = json.loads((dirs[i] / "run.json").read_text())
        for label, key in metrics.items():
            for when, ev in (("start", rec["evals"][0]), ("end", rec["evals"][-1])):
                want = BY_KEY[key].fmt.format(ev["metrics"][key])
                row = f"{label} {when}"
                # the comparison table (a column per run)
                assert shown[row][0][i] == want, (row, shown[row])
                line = next(x for x in compared if x.startswith(row + " "))
                assert line.split()[-2 + i] == want, line
    # lm has no exact match: "-" beside completion's
    assert shown["dev exact match end"][0][1] == "-" and len(shown["dev exact match end"]) == 1
    # a saved run's dashboard plots the objective's main dev metric: exact match in %, lm's loss
    for d, name, key, scale in ((dirs[0], "dev exact match", "exact_match", 100),
                                (dirs[1], "dev loss", "loss", 1)):
        fig = Dashboard(RunRecord.load(d)).figure
        rec = json.loads((d / "run.json").read_text())
        trace = next(t for t in fig.data if t.name == name)
        assert list(trace.y) == pytest.approx([e["metrics"][key] * scale for e in rec["evals"]])


def _cli(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "workbench", *args], cwd=REPO, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def _table_rows(page: str) -> dict[str, list[list[str]]]:
    """Each table row's label -> the cells after it, one list per table holding that row, in
    page order."""
    rows: dict[str, list[list[str]]] = {}
    for tr in re.findall(r"<tr>(.*?)</tr>", page):
        cells = [html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", tr)]
        if cells:
            rows.setdefault(cells[0], []).append(cells[1:])
    return rows


def test_report_of_a_lora_zo_offload_run_says_frozen_stream(tmp_path):
    """An adapter run over the frozen stream, saved and reloaded: its section says the base
    went host -> GPU only, with the bytes it counted; the full-parameter run's does not."""
    from workbench.ui.report import stream_note

    lora = run(RunConfig(method="zo-offload", peft="lora", base_codec="int8", **TINY),
               out_dir=tmp_path / "lora", progress=False)
    full = run(RunConfig(method="zo-offload", **TINY), out_dir=tmp_path / "full", progress=False)
    text = write_report([tmp_path / "full", tmp_path / "lora"],
                        tmp_path / "r.html").read_text(encoding="utf-8")
    assert text.count("frozen stream: H2D only") == 1
    note = stream_note(RunRecord.load(tmp_path / "lora"))
    assert note.startswith("frozen stream: H2D only (base_codec int8, ")
    assert f"{lora.summary['bytes_h2d'] / 1e6:,.2f} MB up per step, none down" in note
    assert lora.base_digest in note and html.escape(note) in text
    assert stream_note(full) == "" and lora.summary["bytes_d2h"] == 0
