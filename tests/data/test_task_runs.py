"""The recipe reads any data format with named fields, and trains every objective through the
CLI, its dev metrics in run.json and the printed summary."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.config import RunConfig
from workbench.recipes.train import run

REPO = Path(__file__).resolve().parents[2]


def test_a_run_on_a_csv_with_its_own_field_names(tmp_path):
    rows = [("the soup was " + w, y) for w, y in (("cold", 0), ("lovely", 1), ("bland", 0),
                                                   ("perfect", 1))] * 5
    (tmp_path / "train.csv").write_text("stars,review\n" + "".join(f"{y},{t}\n" for t, y in rows))
    cfg = RunConfig(data=str(tmp_path / "train.csv"), text_field="review", label_field="stars",
                    steps=2, batch_size=4, telemetry=False, sample_hz=0)
    rec = run(cfg, progress=False)
    assert rec.status == "done" and len(rec.steps) == 2
    assert [e["examples"] for e in rec.evals] == [2, 2]  # rows 10 and 20 are the dev split


#: Per objective: a method to run it with, its dev metrics and the summary rows the CLI prints.
CLI_CASES = {
    "classify": ("fo", ["label_words= bad, fine, great"], {"accuracy", "loss"},
                 ["dev accuracy start", "dev accuracy end", "dev loss end"]),
    "completion": ("zo-offload", ["max_new_tokens=6"],
                   {"loss", "perplexity", "exact_match", "token_f1"},
                   ["dev perplexity end", "dev exact match end", "dev token F1 end"]),
    "lm": ("mezo", [], {"loss", "perplexity"}, ["dev loss start", "dev perplexity end"]),
}


@pytest.mark.parametrize("objective", CLI_CASES)
def test_each_objective_runs_through_the_cli_on_its_embedded_set(objective, tmp_path):
    method, extra, metrics, rows = CLI_CASES[objective]
    sets = [f"objective={objective}", "data=embedded", f"method={method}", "steps=3",
            "batch_size=4", "seq_len=48", "eval_samples=6", "sample_hz=0", "lr=1e-3", *extra]
    r = subprocess.run([sys.executable, "-m", "workbench", "run", "--out", str(tmp_path / "run"),
                        "--quiet", *(a for s in sets for a in ("--set", s))], cwd=REPO,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rec = json.loads((tmp_path / "run" / "run.json").read_text())
    assert rec["status"] == "done" and len(rec["steps"]) == 3
    assert [e["step"] for e in rec["evals"]] == [0, 3]
    for e in rec["evals"]:
        assert set(e["metrics"]) == metrics and e["loss"] == e["metrics"]["loss"]
        assert e["accuracy"] == e["metrics"].get("accuracy")  # None unless classify
        if "perplexity" in metrics:
            assert e["metrics"]["perplexity"] == pytest.approx(math.exp(e["metrics"]["loss"]))
        assert all(0 <= e["metrics"].get(k, 0) <= 1 for k in ("accuracy", "exact_match",
                                                              "token_f1"))
    examples = rec["evals"][0]["examples"]  # lm: packed rows of the six texts
    assert examples == 6 if objective != "lm" else 0 < examples < 6 * 48
    assert rec["summary"]["eval"] == rec["evals"][-1]["metrics"]
    assert rec["evals"][0]["metrics"] != rec["evals"][-1]["metrics"]  # the weights moved
    for row in rows:
        assert row in r.stdout, r.stdout
