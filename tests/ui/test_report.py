"""HTML report: self-contained, plotly.js once, every run's numbers in it; the CLI command."""
from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.config import RunConfig
from workbench.recipes.train import run
from workbench.telemetry.record import RunRecord
from workbench.ui.report import main, write_report

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
    # one dashboard per run + four comparison figures, each drawn once
    assert text.count("Plotly.newPlot(") == len(recs) + 4
    for label in ("tokens/s (steady)", "step time (s, steady median)", "tokens/s (all steps)",
                  "warm-up steps left out", "peak GPU memory (MB)", "final loss",
                  "dev accuracy start", "dev accuracy end", "<h3>config</h3>",
                  "<h3>environment</h3>", "learning rate"):
        assert label in text
    assert f"{recs[1].summary['tokens_per_s']:,.0f}" in text
    # each run's bound and next knob: in the comparison and in its own section
    from workbench.telemetry.advice import next_knob
    from workbench.telemetry.verdict import verdict

    for rec in recs:
        assert text.count(verdict(rec).text) == 2 and next_knob(rec).text in text
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
    assert main([str(tmp_path), "-o", str(tmp_path / "x.html")]) == 2


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

    for d in run_dirs:
        assert f"{d}: {verdict(RunRecord.load(d)).text}" in proc.stdout
    assert proc.stdout.count("next knob: ") == len(run_dirs)


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
