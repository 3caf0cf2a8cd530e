"""The run directory's lifecycle, in process: the lock, refusals, atomic run.json, history."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from workbench.runs.resume import found_checkpoints, newest_covered
from workbench.runs.rundir import RunDir, RunDirError, RunWarning, read_history
from workbench.telemetry.record import RunRecord


def test_the_lock_keeps_a_second_claim_out_and_is_gone_after_release(tmp_path):
    first = RunDir(tmp_path / "r", None)
    first.claim()
    assert (tmp_path / "r" / "run.lock").read_text().strip() == str(os.getpid())
    with pytest.raises(RunDirError, match=rf"being written by another run \(pid {os.getpid()}"):
        RunDir(tmp_path / "r", None).claim()
    with pytest.raises(RunDirError, match="being written by another run"):
        RunDir(tmp_path / "r", None).check_new(overwrite=True)  # not even with --overwrite
    first.release()
    assert not (tmp_path / "r" / "run.lock").exists()


def test_a_stale_lock_of_a_dead_process_is_taken_over_with_a_warning(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "run.lock").write_text(f"{dead.pid}\n")
    rd = RunDir(tmp_path, None)
    with pytest.warns(RunWarning, match=f"taking over the lock of pid {dead.pid}"):
        rd.claim()
    assert (tmp_path / "run.lock").read_text().strip() == str(os.getpid())
    rd.release()


def test_what_a_new_run_refuses(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunDirError, match="is a file, not a folder"):
        RunDir(tmp_path / "file", None).check_new(overwrite=False)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("x")
    with pytest.raises(RunDirError, match="holding other files"):
        RunDir(tmp_path / "mine", None).check_new(overwrite=True)
    (tmp_path / "ck" / "step-00000004").mkdir(parents=True)
    with pytest.raises(RunDirError, match="checkpoint_dir: .* already holds checkpoints"):
        RunDir(tmp_path / "new", tmp_path / "ck").check_new(overwrite=False)
    RunDir(tmp_path / "new", tmp_path / "ck").check_new(overwrite=True)  # allowed, asked for


def test_overwrite_removes_the_runs_files_and_nothing_else(tmp_path):
    run = tmp_path / "r"
    (run / "checkpoints" / "step-00000002").mkdir(parents=True)
    for name in ("run.json", "events.json.gz", "trace.json", "notes.txt", "run.json.tmp"):
        (run / name).write_text("{}")
    rd = RunDir(run, run / "checkpoints")
    rd.claim(overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt", "run.lock"]
    rd.release()


def test_run_json_is_written_atomically_with_nan_as_null(tmp_path):
    rd = RunDir(tmp_path, None)
    rd.claim()
    rec = RunRecord(config={"lr": 1.0}, status="running",
                    steps=[{"step": 0, "loss": math.nan, "projected_grad": math.inf}])
    rd.write(rec)
    data = json.loads((tmp_path / "run.json").read_text(), parse_constant=pytest.fail)
    assert data["steps"][0]["loss"] is None and data["steps"][0]["projected_grad"] is None
    assert not list(tmp_path.glob("*.tmp"))
    assert rd.write(rec, every_s=30.0) is False  # rate-limited between checkpoints
    rd.release()


def test_history_prefers_the_journal_and_ignores_a_torn_last_line(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps(
        {"steps": [{"step": 0, "loss": 1.0}], "evals": [{"step": 0, "accuracy": 0.5}]}))
    (tmp_path / "history.jsonl").write_text(
        '{"step": {"step": 0, "loss": 2.0}}\n{"step": {"step": 1, "loss": 3.0}}\n'
        '{"eval": {"step": 1, "accuracy": 0.6}}\n{"step": {"step": 2, "lo')
    steps, evals = read_history(tmp_path)
    assert [(s["step"], s["loss"]) for s in steps] == [(0, 2.0), (1, 3.0)]
    assert [e["step"] for e in evals] == [0, 1]


def test_resume_picks_the_newest_checkpoint_the_history_covers(tmp_path):
    for step in (2, 4, 6):
        (tmp_path / f"step-{step:08d}").mkdir()
        (tmp_path / f"step-{step:08d}" / "manifest.json").write_text("{}")
    history = [{"step": t} for t in range(5)]  # steps 0..4 recorded; 5 was in flight
    found = found_checkpoints([tmp_path])
    covered = newest_covered(found, history)
    assert [p.name for p in found][-1] == "step-00000006" and covered.name == "step-00000004"


def test_a_lock_that_cannot_be_written_is_not_left_behind(tmp_path, monkeypatch):
    import errno

    from workbench.runs import lockfile

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(lockfile.os, "pwrite", full)
    with pytest.raises(RunDirError, match="--out: cannot write the lock .*No space left"):
        RunDir(tmp_path / "r", None).claim()
    assert list((tmp_path / "r").iterdir()) == []  # no 0-byte run.lock for the next run


def test_an_empty_free_lock_is_no_run_and_is_taken_over(tmp_path):
    (tmp_path / "run.lock").write_bytes(b"")  # what a start on a full disk used to leave
    rd = RunDir(tmp_path, None)
    rd.check_new(overwrite=False)  # not "already holds a run"
    with pytest.warns(RunWarning, match="never wrote its pid"):
        rd.claim()
    rd.release()


def test_a_checkpoint_dir_outside_the_run_is_locked_while_it_runs(tmp_path):
    first = RunDir(tmp_path / "a", tmp_path / "ck")
    first.claim()
    assert (tmp_path / "ck" / "checkpoint.lock").read_text().strip() == str(os.getpid())
    for check in (lambda rd: rd.check_new(overwrite=True), lambda rd: rd.claim()):
        with pytest.raises(RunDirError, match=r"checkpoint_dir: .*ck is in use by another run"):
            check(RunDir(tmp_path / "b", tmp_path / "ck"))
    first.release()
    assert not (tmp_path / "ck" / "checkpoint.lock").exists()
    RunDir(tmp_path / "b", tmp_path / "ck").check_new(overwrite=False)


def _cli_run(out, *sets: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench", "run", "--out", str(out),
                           *(a for s in sets for a in ("--set", s))],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("refused, line", [
    # refused with the config, before the claim
    (("model=tiny-opt", "method=fo-offload", "checkpoint_every=2"), "error: checkpoint_every:"),
    # refused by the engine once it sees the model's blocks (after the claim)
    (("model=tiny:mixtral", "method=zo-offload", "slot_dtype=compute", "codec=bf16",
      "master=compressed-sr", "amp=bf16"), "error: slot_dtype: compute holds every block"),
    # the same, logging to a tracker: its folder goes with the run
    (("model=tiny:mixtral", "method=zo-offload", "slot_dtype=compute", "codec=bf16",
      "master=compressed-sr", "amp=bf16", "report_to=tensorboard"),
     "error: slot_dtype: compute holds every block")])
def test_a_refused_run_leaves_its_folder_as_it_was(tmp_path, refused, line):
    """Through the CLI: one line, no run.json, a folder the run made is gone and one that was
    there stays (empty); the next run there needs no --overwrite (a "failed, 0 steps" run.json
    blocked it before)."""
    new, kept = tmp_path / "new", tmp_path / "kept"
    kept.mkdir()
    for out in (new, kept):
        r = _cli_run(out, *refused, "steps=2")
        assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith(line), r.stderr
    assert not new.exists()
    assert kept.is_dir() and not any(kept.iterdir())
    r = _cli_run(kept, "model=tiny-opt", "method=mezo", "steps=1", "eval_every=0")
    assert r.returncode == 0, r.stderr
    assert json.loads((kept / "run.json").read_text())["status"] == "done"
