"""Which weights an export takes: the end of a done run, a checkpoint's step (equal to the run
stopped there), a diverged run's last good checkpoint; runs that are running, failed or kept
nothing are refused in one line."""
from __future__ import annotations

import json
import shutil

import pytest

from export_helpers import SHORT, train_live
from workbench.cli import main
from workbench.config import RunConfig
from workbench.export.exporter import export_run
from workbench.export.source import ExportError, run_weights
from workbench.recipes.train import run


@pytest.mark.parametrize("kw", [{"method": "mezo"},
                                {"method": "zo-offload", "codec": "bf16",
                                 "master": "compressed-sr"},
                                {"method": "zo-offload", "codec": "bf16"}],
                         ids=["mezo", "zo-offload-sr", "zo-offload-mirror"])
def test_export_at_a_checkpoint_step_equals_the_run_resumed_to_it(tmp_path, one_thread, kw):
    """A checkpoint holds the update of its last step still pending; the export applies it as
    the run's end does: the weights equal a run of that many steps, and a resume of the run
    to that step (its newest checkpoint), bit for bit."""
    cfg = RunConfig(model="tiny-llama", **{**SHORT, "steps": 4}, checkpoint_every=2, **kw)
    run(cfg, tmp_path / "long", progress=False)
    res = export_run(tmp_path / "long", tmp_path / "at2", step=2)
    assert res.origin == "step-00000002" and res.matches_run is None
    straight = run(cfg.replace(steps=2, checkpoint_every=0), tmp_path / "two", progress=False)
    assert res.digest == straight.param_digest
    # the run resumed to step 2: a copy keeping only that checkpoint, continued with steps=2
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "long", copy, ignore=shutil.ignore_patterns("step-00000004",
                                                                            "weights"))
    data = json.loads((copy / "run.json").read_text())
    data["steps"] = data["steps"][:2]
    (copy / "run.json").write_text(json.dumps(data))
    resumed = run(cfg.replace(steps=2), copy, progress=False, resume=True)
    assert resumed.param_digest == res.digest
    final = export_run(tmp_path / "long", tmp_path / "end")
    assert final.origin == "weights" and final.step == 4 and final.matches_run is True
    assert final.digest != res.digest


def test_a_step_the_run_did_not_keep_is_refused_with_the_steps_it_has(tmp_path, one_thread):
    cfg = RunConfig(model="tiny-opt", method="mezo", **{**SHORT, "steps": 4}, checkpoint_every=2)
    run(cfg, tmp_path / "run", progress=False)
    with pytest.raises(ExportError, match=r"--step: .* no weights after 3 steps \(it has weights "
                                          r"after: 2, 4\)"):
        run_weights(tmp_path / "run", step=3)


def test_a_diverged_run_exports_its_last_good_checkpoint(tmp_path, one_thread):
    cfg = RunConfig(model="tiny-opt", method="mezo", **{**SHORT, "steps": 12, "lr": 10.0},
                    checkpoint_every=2)
    rec = run(cfg, tmp_path / "run", progress=False)
    assert rec.status == "diverged", rec.error
    bad = int(rec.error.split("diverged at step ")[1].split(" ")[0])
    assert not (tmp_path / "run" / "weights").exists()  # never written for a diverged run
    res = export_run(tmp_path / "run", tmp_path / "out")
    good = bad - bad % 2  # the newest checkpoint at or before the diverged step
    assert res.origin == f"step-{good:08d}" and res.step == good
    straight = run(cfg.replace(steps=good, checkpoint_every=0), tmp_path / "straight",
                   progress=False)
    assert straight.status == "done" and res.digest == straight.param_digest


def test_a_diverged_run_without_checkpoints_says_how_to_keep_them(tmp_path, one_thread):
    cfg = RunConfig(model="tiny-opt", method="mezo", **{**SHORT, "steps": 12, "lr": 10.0})
    assert run(cfg, tmp_path / "run", progress=False).status == "diverged"
    with pytest.raises(ExportError, match="diverged at step .* kept no checkpoint before it "
                                          r"\(checkpoint_every=0\).*checkpoint_every=N"):
        export_run(tmp_path / "run", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_running_failed_and_weightless_runs_are_refused_in_one_line(tmp_path, one_thread,
                                                                    capsys):
    cfg = RunConfig(model="tiny-opt", method="mezo", **SHORT)
    train_live(cfg, tmp_path / "run")
    record = tmp_path / "run" / "run.json"
    data = json.loads(record.read_text())
    for status, line in [("running", "is running (or its process was killed"),
                         ("failed", "ended failed")]:
        record.write_text(json.dumps({**data, "status": status}))
        assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and line in err[0] and "--force" in err[0], err
        assert not (tmp_path / "out").exists()
        res = export_run(tmp_path / "run", tmp_path / status, force=True)
        assert res.step == 3
    record.write_text(json.dumps({**data, "status": "done"}))
    shutil.rmtree(tmp_path / "run" / "weights")
    shutil.rmtree(tmp_path / "run" / "checkpoints")
    with pytest.raises(ExportError, match="holds no weights"):
        run_weights(tmp_path / "run")
    failed = {"step": 3, "error": "No space left on device: weights.partial"}
    record.write_text(json.dumps({**data, "info": {**data.get("info", {}),
                                                   "final_weights": failed}}))
    with pytest.raises(ExportError, match=r"end-of-run write failed \(No space left on device"):
        run_weights(tmp_path / "run")
    record.write_text(json.dumps({**data, "config": {**data["config"], "save_final": False}}))
    with pytest.raises(ExportError, match=r"save_final=false.*run it again with save_final=true"):
        run_weights(tmp_path / "run")


def test_save_final_false_writes_no_weights(tmp_path, one_thread):
    cfg = RunConfig(model="tiny-opt", method="fo", **SHORT, save_final=False)
    rec = run(cfg, tmp_path / "run", progress=False)
    assert rec.status == "done" and not (tmp_path / "run" / "weights").exists()
    assert "final_weights" not in rec.info


@pytest.mark.parametrize("master", ["fp32", "compressed", "compressed-sr"])
@pytest.mark.parametrize("stream_embeddings", [False, True], ids=["embed-resident",
                                                                 "embed-streamed"])
def test_export_of_a_checkpoint_equals_the_run_for_every_master_and_embedding_stream(
        tmp_path, one_thread, master, stream_embeddings):
    """The stream layout an export applies a checkpoint's pending update through (which groups
    stream, through which transfer) is the engine's own: with the embedding and head streamed
    too, a compressed master rounds them on their way back as it rounds the blocks. The export
    at a checkpoint equals a straight run of that many steps, bit for bit."""
    cfg = RunConfig(model="tiny-llama", **{**SHORT, "steps": 4}, checkpoint_every=2,
                    method="zo-offload", codec="bf16", master=master,
                    stream_embeddings=stream_embeddings)
    run(cfg, tmp_path / "long", progress=False)
    res = export_run(tmp_path / "long", tmp_path / "at2", step=2)
    straight = run(cfg.replace(steps=2, checkpoint_every=0), tmp_path / "two", progress=False)
    assert res.digest == straight.param_digest
