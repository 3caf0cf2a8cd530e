"""``evaluate FOLDER`` of an exported run scores the task the run learned (recorded in the
export), not the built-in sentiment set."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "workbench", *args], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r


def test_evaluate_of_an_export_scores_the_runs_own_task(tmp_path):
    data = tmp_path / "reviews.csv"
    data.write_text("review,stars\n" + "".join(f"item {i} was {'good' if i % 2 else 'bad'},"
                                               f"{i % 2}\n" for i in range(60)))
    run, out = tmp_path / "run", tmp_path / "export"
    _cli("run", "--quiet", "--out", str(run), "--set", f"data={data}", "--set",
         "text_field=review", "--set", "label_field=stars", "--set",
         "template=Review: {text} Verdict:", "--set", "label_words= no, yes", "--set",
         "steps=2", "--set", "batch_size=2")
    _cli("export", str(run), "--out", str(out), "--quiet")
    task = json.loads((out / "workbench_export.json").read_text())["task"]
    # named relative to the export (no local path in what is shared), found from it
    assert task["data"] == "../reviews.csv" and task["label_words"] == " no, yes"
    r = _cli("evaluate", str(out), "--json")
    got = json.loads(r.stdout)
    end = json.loads((run / "run.json").read_text())["evals"][-1]["metrics"]
    assert got["loss"] == end["loss"] and got["accuracy"] == end["accuracy"]  # the run's numbers
    r = _cli("evaluate", str(out))
    assert r.stdout.startswith(f"{out} on {data.resolve()} (classify")
    assert "note: evaluating on the task the run learned" in r.stderr
