"""``python -m workbench evaluate``: the dev metrics of a run directory equal the run's final
eval, of a preset equal a run's step-0 eval, of an exported folder equal the run it came from;
and an exported folder is fine-tuned further (``model=DIR``) from exactly where the run ended."""
from __future__ import annotations

import json

import pytest

from workbench.cli import main
from workbench.config import RunConfig
from workbench.export.exporter import export_run
from workbench.recipes.evaluate import evaluate
from workbench.recipes.train import run

TASK = dict(data="embedded", eval_samples=16, batch_size=4, seq_len=32, steps=3, lr=5e-3,
            sample_hz=0.0)


def cli_metrics(capsys, *args: str) -> dict:
    assert main(["evaluate", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("kw", [{"method": "mezo"}, {"method": "zo-offload", "codec": "bf16"}],
                         ids=["mezo", "zo-offload-mirror"])
def test_evaluate_of_a_run_directory_equals_its_final_eval(tmp_path, one_thread, capsys, kw):
    rec = run(RunConfig(model="tiny-opt", **TASK, **kw), tmp_path / "run", progress=False)
    final = rec.evals[-1]
    assert final["step"] == 3
    assert cli_metrics(capsys, str(tmp_path / "run")) == final["metrics"]
    start = rec.evals[0]["metrics"]  # and the zero-shot row of the same settings, from a preset
    assert cli_metrics(capsys, "tiny-opt", *sum((["--set", f"{k}={v}"] for k, v in
                                                 {**TASK, **kw}.items()), [])) == start
    assert start != final["metrics"]  # the run moved the metrics: the equalities can fail


def test_an_exported_model_evaluates_and_trains_on_from_where_the_run_ended(tmp_path,
                                                                           one_thread):
    cfg = RunConfig(model="tiny-llama", method="mezo", **TASK)
    first = run(cfg, tmp_path / "run", progress=False)
    export_run(tmp_path / "run", tmp_path / "model")
    folder = cfg.replace(model=str(tmp_path / "model"))
    assert evaluate(folder) == first.evals[-1]["metrics"]  # its tokenizer files give the same ids
    more = run(folder.replace(steps=2), tmp_path / "more", progress=False)
    assert more.status == "done"
    assert more.evals[0]["metrics"] == first.evals[-1]["metrics"]
    res = export_run(tmp_path / "more", tmp_path / "model2")
    assert res.matches_run is True and res.digest != first.param_digest


def test_evaluate_refuses_a_task_without_dev_split_in_one_line(capsys):
    assert main(["evaluate", "tiny-opt", "--set", "data=synthetic"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: data: synthetic has no dev split to evaluate on; give a data set"]
