"""report_to through the real CLI: a tracker that cannot start is refused in one line, in
seconds, before the run directory is touched. A refused resume leaves the finished run's record
byte for byte as it was (and the run exportable); a refused fresh run leaves no folder; an MLflow
server where nothing listens is found out in seconds, not after MLflow's minutes of retries; a
read-only TensorBoard folder gives the one line and no writer-thread traceback."""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUN = ["model=tiny-opt", "method=mezo", "data=synthetic", "batch_size=4", "seq_len=16",
       "steps=3", "lr=2e-3", "sample_hz=0", "eval_every=0"]


def sets(*items: str) -> list[str]:
    return [x for kv in items for x in ("--set", kv)]


def env(home: Path, **extra: str) -> dict[str, str]:
    """No W&B key anywhere (an empty HOME: no netrc), no tracker settings but ``extra``."""
    out = {k: v for k, v in os.environ.items()
           if not k.startswith(("WANDB_", "MLFLOW_"))}
    home.mkdir(exist_ok=True)
    out.update(HOME=str(home), OMP_NUM_THREADS="1", WANDB_SILENT="true",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               **extra)
    return out


def cli(*args: str, environ: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench", *args, "--quiet"],
                          capture_output=True, text=True, env=environ, timeout=timeout)


def one_line(stderr: str) -> str:
    """The one line of a refusal (warnings aside); no traceback anywhere."""
    assert "Traceback" not in stderr and "Exception in thread" not in stderr, stderr
    lines = [l for l in stderr.splitlines() if l.strip() and not l.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished run that logged to TensorBoard (so it has RUN_DIR/tensorboard)."""
    root = tmp_path_factory.mktemp("finished")
    r = cli("run", "--out", str(root / "R"), *sets(*RUN, "report_to=tensorboard"),
            environ=env(root / "home"))
    assert r.returncode == 0, r.stderr
    return root / "R"


def copy_of(finished: Path, tmp_path: Path) -> Path:
    run = tmp_path / "R"
    shutil.copytree(finished, run)
    return run


def test_a_refused_resume_leaves_the_finished_run_as_it_was(finished, tmp_path):
    run = copy_of(finished, tmp_path)
    before = snapshot(run)
    r = cli("run", "--resume", str(run), *sets("report_to=wandb"),
            environ=env(tmp_path / "home", WANDB_MODE="online"))
    assert r.returncode == 2 and one_line(r.stderr).startswith("error: report_to: wandb")
    assert snapshot(run) == before  # run.json still done, its param_digest kept; no wandb/
    assert one_line(r.stderr) == (
        "error: report_to: wandb: WANDB_MODE=online but no W&B API key is set (WANDB_API_KEY or "
        "wandb login); log in, or unset WANDB_MODE to log offline into RUN_DIR/wandb")
    shutil.rmtree(run / "tensorboard")
    (run / "tensorboard").write_text("not a folder")  # where TensorBoard would write
    before = snapshot(run)
    r = cli("run", "--resume", str(run), environ=env(tmp_path / "home"))
    assert r.returncode == 2 and one_line(r.stderr).startswith("error: report_to: tensorboard")
    assert snapshot(run) == before
    assert one_line(r.stderr) == (f"error: report_to: tensorboard writes into {run / 'tensorboard'}"
                                  ", which is a file; move it away")
    r = cli("export", str(run), "--out", str(tmp_path / "export"), environ=env(tmp_path / "home"))
    assert r.returncode == 0, r.stderr


def test_a_read_only_tensorboard_folder_is_one_line(finished, tmp_path):
    run = copy_of(finished, tmp_path)
    board = run / "tensorboard"
    with read_only(board):
        before = snapshot(run)
        r = cli("run", "--resume", str(run), environ=env(tmp_path / "home"))
        assert r.returncode == 2
        assert one_line(r.stderr) == (f"error: report_to: tensorboard's folder {board} cannot be "
                                      "written; make it writable, or leave tensorboard out of "
                                      "report_to")
        assert snapshot(run) == before


@contextlib.contextmanager
def read_only(folder: Path):
    """``folder`` made read-only: a read-only tmpfs mounted on it when this process may mount
    (root, whom permissions do not stop), else its mode bits."""
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(folder)],
        capture_output=True).returncode == 0
    if os.geteuid() == 0 and not mounted:
        pytest.skip("root without mount: nothing is read-only to this process")
    if not mounted:
        folder.chmod(0o555)
    try:
        yield
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(folder)], check=True)
        else:
            folder.chmod(0o755)


def test_trackers_that_cannot_start_leave_no_run_folder(tmp_path):
    with socket.socket() as s:  # a port where nothing listens (bound, never listening)
        s.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{s.getsockname()[1]}"
        began = time.monotonic()
        r = cli("run", "--out", str(tmp_path / "m"), *sets(*RUN, "report_to=mlflow"),
                environ=env(tmp_path / "home", MLFLOW_TRACKING_URI=uri), timeout=90)
    assert time.monotonic() - began < 60  # MLflow's own retries take minutes
    assert r.returncode == 2
    line = one_line(r.stderr)
    assert line.startswith(f"error: report_to: mlflow: nothing answers at {uri} "
                           "(MLFLOW_TRACKING_URI: "), line
    assert line.endswith("start the tracking server, or unset MLFLOW_TRACKING_URI to log into "
                         "RUN_DIR/mlruns"), line
    assert not (tmp_path / "m").exists()
    r = cli("run", "--out", str(tmp_path / "w"), *sets(*RUN, "report_to=wandb"),
            environ=env(tmp_path / "home", WANDB_MODE="online"))
    assert r.returncode == 2
    assert one_line(r.stderr).startswith("error: report_to: wandb: WANDB_MODE=online but no W&B "
                                         "API key is set")
    assert not (tmp_path / "w").exists()


def test_a_tracker_failing_after_its_check_still_leaves_the_run_as_found(finished, tmp_path,
                                                                         monkeypatch):
    """The check cannot foresee everything (a tracker's own error as it starts): the resume is
    refused all the same, its run.json put back and what the tracker made removed."""
    from workbench.config import ConfigError, RunConfig, resume_base
    from workbench.recipes.train import TrainRecipe
    from workbench.runs.resume import started_config
    from workbench.telemetry import trackers

    class Failing(trackers.TensorBoardSink):
        def __init__(self, config, run_dir, name):
            (run_dir / "wandb").mkdir()  # as a tracker's library might, before failing
            raise OSError("the tracker's own failure")

    monkeypatch.setitem(trackers.SINKS, "tensorboard", Failing)
    run = copy_of(finished, tmp_path)
    before = snapshot(run)
    entries = sorted(p.name for p in run.iterdir())
    cfg = RunConfig(**resume_base(started_config(run)))
    with pytest.raises(ConfigError, match=r"report_to: tensorboard did not start \(the tracker's "
                                          r"own failure\)"):
        TrainRecipe(cfg, run, progress=False).run(resume=True)
    assert snapshot(run) == before and sorted(p.name for p in run.iterdir()) == entries
