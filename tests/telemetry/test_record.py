"""Run records: what a CPU zo-offload run writes, and the save -> load round trip."""
import json

import pytest

from workbench.config import RunConfig
from workbench.engine.events import EMBED, HEAD, OpEvent
from workbench.presets import PRESETS
from workbench.recipes.train import run
from workbench.telemetry.collector import Collector
from workbench.telemetry.record import RunRecord


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "offload"
    # 200 Hz: a sampler still running while the record is written shows in every run (at 50 Hz
    # it lost the last sample about one run in four)
    cfg = RunConfig(model="tiny-opt", method="zo-offload", data="synthetic", steps=4,
                    batch_size=4, seq_len=16, sample_hz=200.0, eval_samples=0)
    return out, run(cfg, out, progress=False)


def test_run_writes_every_block_event_and_valid_chrome_trace(run_dir):
    out, rec = run_dir
    n = PRESETS["tiny-opt"].num_layers
    for step in range(4):
        for block in range(n):
            ops = [e.op for e in rec.events if e.step == step and e.block == block]
            assert ops.count("upload") == 1 and ops.count("compute") == 1 and ops.count("offload") == 1
        assert {e.block for e in rec.events if e.step == step and e.op == "compute"} >= {EMBED, HEAD}
    trace = json.loads((out / "trace.json").read_text())
    events = trace["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == len([e for e in rec.events])
    assert all({"name", "ts", "dur", "pid", "tid"} <= set(e) and e["dur"] >= 0 for e in slices)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"upload", "compute", "offload"} <= names  # one track per stream
    assert any(e["ph"] == "C" and e["name"] == "loss" for e in events)  # counter tracks


def test_save_load_round_trip_gives_an_equal_record(run_dir, tmp_path):
    out, rec = run_dir
    loaded = RunRecord.load(out)
    assert loaded.events == rec.events
    assert loaded.steps == json.loads(json.dumps(rec.steps))
    assert loaded.summary == json.loads(json.dumps(rec.summary))
    assert loaded.param_digest == rec.param_digest and loaded.config == rec.config
    assert len(loaded.samples) == len(rec.samples) > 0
    loaded.save(tmp_path / "again")
    again = RunRecord.load(tmp_path / "again")
    assert again.events == loaded.events and again.samples.__len__() == loaded.samples.__len__()


def test_retention_keeps_recent_steps_in_full_and_totals_for_all():
    rec = RunRecord()
    collector = Collector(rec, keep_steps=3)
    for step in range(10):
        for block in range(4):
            collector(OpEvent("upload", "upload", step, block, 100, step + block * 0.1,
                              step + block * 0.1 + 0.05))
    collector.flush()
    assert {e.step for e in rec.events} == {7, 8, 9}
    assert [r["step"] for r in rec.step_ops] == list(range(10))
    assert all(r["upload (bytes)"] == 400 for r in rec.step_ops)


def test_non_finite_numbers_are_saved_as_null_and_a_damaged_file_is_one_error(tmp_path):
    import math

    from workbench.telemetry.record import RecordError

    rec = RunRecord(config={"lr": 1.0}, steps=[{"step": 0, "loss": math.nan}],
                    evals=[{"step": 0, "accuracy": 0.5, "loss": math.inf}],
                    summary={"tokens_per_s": math.nan}, status="diverged", error="why")
    rec.save(tmp_path)
    data = json.loads((tmp_path / "run.json").read_text(), parse_constant=pytest.fail)
    assert data["steps"][0]["loss"] is None and data["evals"][0]["loss"] is None
    assert data["summary"]["tokens_per_s"] is None and data["error"] == "why"
    assert RunRecord.load(tmp_path).status == "diverged"
    for name in ("events.json.gz", "run.json"):
        blob = (tmp_path / name).read_bytes()
        (tmp_path / name).write_bytes(blob[:len(blob) // 2])
        with pytest.raises(RecordError, match=f"{name} cannot be read: truncated or damaged"):
            RunRecord.load(tmp_path)


def test_a_failing_artefact_after_run_json_is_reported_not_fatal(tmp_path, monkeypatch):
    import errno

    from workbench.telemetry import record as record_module

    real = record_module._write_gz

    def full(path, obj):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    monkeypatch.setattr(record_module, "_write_gz", full)
    failed = []
    RunRecord(config={"a": 1}, status="done").save(tmp_path, on_error=lambda n, e: failed.append(n))
    assert failed == ["events.json.gz", "samples.json.gz"]
    assert RunRecord.load(tmp_path).status == "done"
    monkeypatch.setattr(record_module, "_write_gz", real)


@pytest.mark.parametrize("hole", ["summary", "config", "steps", "evals", "info", "environment",
                                  "status", "param_digest", "param_norm", "error"])
def test_a_record_with_a_null_field_loads_with_what_is_there(tmp_path, hole):
    data = RunRecord(config={"method": "mezo"}, steps=[{"step": 0, "loss": 1.0}],
                     summary={"tokens_per_s": 5.0, "eval": {"accuracy": 0.5}}).run_json()
    data[hole] = None
    (tmp_path / "run.json").write_text(json.dumps(data))
    rec = RunRecord.load(tmp_path)
    empty = {"summary": {}, "config": {}, "steps": [], "evals": [], "info": {},
             "environment": {}, "status": "done", "param_digest": "", "error": ""}
    if hole == "param_norm":
        assert rec.param_norm != rec.param_norm  # NaN: no norm recorded
    else:
        assert getattr(rec, hole) == empty[hole]


@pytest.mark.parametrize("change, said", [
    ({"summary": []}, "'summary' is list, not an object"),
    ({"steps": "many"}, "'steps' is str, not a list"),
    ({"steps": [1, 2]}, "steps[0] is not a row with a whole-number step"),
    ({"evals": [{"accuracy": 1}]}, "evals[0] is not a row with a whole-number step"),
    ({"status": 3}, "'status' is int, not text"),
    ({"param_norm": "x"}, "'param_norm' is str, not a number")])
def test_a_record_of_the_wrong_shape_is_one_error(tmp_path, change, said):
    from workbench.telemetry.record import RecordError

    (tmp_path / "run.json").write_text(json.dumps({**RunRecord().run_json(), **change}))
    with pytest.raises(RecordError) as err:
        RunRecord.load(tmp_path)
    assert str(err.value) == f"{tmp_path / 'run.json'} is not a run record ({said})"


def test_summary_figures_that_are_not_numbers_are_holes(tmp_path):
    data = {**RunRecord().run_json(), "summary": {"tokens_per_s": "fast", "final_loss": 2.0,
                                                  "eval": {"accuracy": 1.0}, "steps": True}}
    (tmp_path / "run.json").write_text(json.dumps(data))
    assert RunRecord.load(tmp_path).summary == {"final_loss": 2.0, "eval": {"accuracy": 1.0}}
