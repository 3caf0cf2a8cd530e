"""report_to: TensorBoard event files, a W&B offline run and an MLflow folder each hold every
step's loss and the dev metrics the run record holds, and the run's settings; a tracker that is
not installed, unknown or named twice is refused in one line."""
from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

import numpy as np
import pytest

from workbench.cli import main
from workbench.config import ConfigError, RunConfig, check_environment
from workbench.recipes.train import run

CFG = dict(model="tiny-opt", method="mezo", data="embedded", eval_samples=8, steps=5,
           batch_size=4, seq_len=32, lr=5e-3, sample_hz=0.0, eval_every=2)


@pytest.fixture
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no netrc: W&B stays offline
    for var in ("WANDB_API_KEY", "WANDB_MODE", "MLFLOW_TRACKING_URI", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")


def wandb_history(run_dir: Path) -> list[dict]:
    """History rows of the W&B offline run in ``run_dir``."""
    import json

    return [{(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item}
            for rec in wandb_records(run_dir) if rec.WhichOneof("record_type") == "history"]


def wandb_records(run_dir: Path) -> list:
    """The protobuf ``Record``s of the W&B offline run in ``run_dir`` (its .wandb file is a
    LevelDB-style log: 32 KiB blocks of records, each a crc, a length, a type and a record)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data, rows, at, part = path.read_bytes(), [], 7, b""  # 7: ":W&B", magic, version
    while at + 7 <= len(data):
        block_left = 32768 - at % 32768
        if block_left < 7:  # a block's tail too short for a header is padding
            at += block_left
            continue
        length, kind = struct.unpack("<HB", data[at + 4:at + 7])
        if length == 0 and kind == 0:
            break
        part += data[at + 7:at + 7 + length]
        at += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            rec = pb.Record()
            rec.ParseFromString(part)
            part = b""
            rows.append(rec)
    return rows


def test_every_tracker_holds_the_record(tmp_path, one_thread, offline):
    for module in ("tensorboard", "wandb", "mlflow"):  # the test extra installs all three
        pytest.importorskip(module)
    rec = run(RunConfig(**CFG, report_to="tensorboard,wandb,mlflow"), tmp_path / "run",
              progress=False)
    assert rec.status == "done"
    losses = {s["step"]: s["loss"] for s in rec.steps}
    lrs = {s["step"]: s["lr"] for s in rec.steps}
    acc = {e["step"]: e["metrics"]["accuracy"] for e in rec.evals}
    assert sorted(acc) == [0, 2, 4, 5] and len(losses) == 5

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    tb.Reload()
    for tag, want in (("train/loss", losses), ("eval/accuracy", acc)):
        got = {e.step: e.value for e in tb.Scalars(tag)}
        assert got == {k: float(np.float32(v)) for k, v in want.items()}  # stored as fp32
    assert "settings" in "".join(tb.Tags()["tensors"])

    rows = wandb_history(tmp_path / "run")
    got = {r["_step"]: r["train/loss"] for r in rows if "train/loss" in r}
    assert got == losses
    assert {r["_step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r} == acc
    assert {r["_step"]: r["train/lr"] for r in rows if "train/lr" in r} == lrs

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(tmp_path / "run" / "mlruns").resolve().as_uri())
    (found,) = client.search_runs([client.get_experiment_by_name("zo-workbench").experiment_id])
    assert found.info.status == "FINISHED" and found.data.params["lr"] == "0.005"
    history = client.get_metric_history(found.info.run_id, "train/loss")
    assert {m.step: m.value for m in history} == losses
    assert {m.step: m.value for m in client.get_metric_history(found.info.run_id,
                                                               "eval/accuracy")} == acc
    assert "train/tokens_per_s" in found.data.metrics


def test_trackers_are_checked_before_anything_runs(tmp_path, monkeypatch, capsys):
    for value, line in [("tensorboard,foo", "report_to: 'foo' is not one of tensorboard, wandb, "
                                            "mlflow (comma-separated)"),
                        ("wandb,wandb", "report_to: 'wandb,wandb' names a tracker twice")]:
        with pytest.raises(ConfigError) as e:
            RunConfig(report_to=value)
        assert e.value.problems == [line]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(ConfigError) as e:
        check_environment(RunConfig(report_to="tensorboard,mlflow"))
    assert e.value.problems == ["report_to: mlflow is not installed; pip install "
                                "'zo-workbench[mlflow]'"]
    assert main(["run", "--set", "report_to=mlflow", "--set", "data=synthetic", "--out",
                 str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: report_to: mlflow is not installed; pip install 'zo-workbench[mlflow]'"]
    assert not (tmp_path / "out").exists()


def test_a_failing_tracker_is_dropped_with_a_warning_and_the_others_go_on(tmp_path,
                                                                          monkeypatch):
    from workbench.engine.events import StepEvent
    from workbench.telemetry import trackers

    class Broken:
        name = "wandb"

        def __init__(self, *args):
            self.logged, self.closed = [], None

        def log(self, step, metrics):
            raise OSError("No space left on device")

        def close(self, status, summary):
            self.closed = status

    class Fine(Broken):
        name = "mlflow"

        def log(self, step, metrics):
            self.logged.append((step, metrics["train/loss"]))

    monkeypatch.setattr(trackers, "SINKS", {"wandb": Broken, "mlflow": Fine})
    t = trackers.Trackers(["wandb", "mlflow"], {}, tmp_path, "x")
    broken, fine = t.sinks
    with pytest.warns(UserWarning, match=r"report_to: wandb stopped logging at step 0 "
                                         r"\(OSError: No space left on device\)"):
        for step in range(3):
            t(StepEvent(step, 1.0 + step, 0.1, 0.5, 10))
        t.close("done", {})
    assert fine.logged == [(0, 1.0), (1, 2.0), (2, 3.0)] and fine.closed == "done"
    assert broken.closed == "failed"  # closed as failed when it was dropped
