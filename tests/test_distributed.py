"""Data parallel over torch.distributed (gloo on CPU): 2 ranks vs one process."""
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from workbench.engine.checkpoint import latest_checkpoint, read_checkpoint

SETTINGS = ["model=tiny-opt", "data=synthetic", "batch_size=8", "seq_len=16", "steps=10",
            "lr=2e-3", "weight_decay=0.01", "checkpoint_every=10", "sample_hz=0",
            "digest_check_every=5", "eval_samples=0"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(out: Path, method: str, ranks: int) -> None:
    sets = [x for kv in SETTINGS + [f"method={method}"] for x in ("--set", kv)]
    if ranks == 1:
        cmd = [sys.executable, "-m", "workbench", "run", *sets, "--out", str(out), "--quiet"]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}",
               f"--master_port={_free_port()}", "-m", "workbench", "run", *sets, "--out",
               str(out), "--quiet"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


def _weights(run_dir: Path):
    path = latest_checkpoint(run_dir / "checkpoints")
    manifest = json.loads((path / "manifest.json").read_text())
    names = [g[0] for g in manifest["groups"]]
    return read_checkpoint(path, names, [g[1] for g in manifest["groups"]]).flats


@pytest.mark.parametrize("method", ["mezo", "zo-offload", "forward-grad"])
def test_two_ranks_stay_identical_and_match_one_process(method, tmp_path):
    _run(tmp_path / "two", method, ranks=2)
    _run(tmp_path / "one", method, ranks=1)
    info = json.loads((tmp_path / "two" / "run.json").read_text())["info"]
    ranks = info["ranks"]
    assert info["world_size"] == 2 and len(ranks) == 2
    assert ranks[0]["param_digest"] == ranks[1]["param_digest"]  # identical on both ranks
    two, one = _weights(tmp_path / "two"), _weights(tmp_path / "one")
    # Same as one process on the full batch up to fp32 summation order: the loss is a mean of
    # two shard means instead of one mean; 1/(2 eps) amplifies that ~1e-7 into g, and ten
    # steps of lr * dg * z move weights (scale 0.02) by well under 1e-5.
    diff = max(float((a - b).abs().max()) for a, b in zip(two, one))
    moved = max(float((a - b).abs().max()) for a, b in zip(one, _start(tmp_path, method)))
    assert diff <= 1e-5 and moved > 100 * diff


def _start(tmp_path: Path, method: str):
    """The weights before training (a zero-step-like run is not possible: use steps=... 0 lr)."""
    out = tmp_path / "start"
    if not out.exists():
        sets = [x for kv in SETTINGS + [f"method={method}", "lr=0", "weight_decay=0"]
                for x in ("--set", kv)]
        subprocess.run([sys.executable, "-m", "workbench", "run", *sets, "--out", str(out),
                        "--quiet"], check=True, capture_output=True, timeout=600)
    return _weights(out)


def test_batch_that_does_not_divide_is_refused(tmp_path):
    sets = [x for kv in SETTINGS + ["method=mezo", "batch_size=7"] for x in ("--set", kv)]
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                        f"--master_port={_free_port()}", "-m", "workbench", "run", *sets,
                        "--out", str(tmp_path / "x"), "--quiet"], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode != 0 and "batch_size: 7 does not divide evenly among 2 ranks" in r.stderr



EVAL = ["model=tiny-opt", "data=embedded", "eval_every=3", "eval_samples=40", "batch_size=4",
        "seq_len=32", "sample_hz=0", "lr=2e-3", "checkpoint_every=2"]


def _torchrun(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                             f"--master_port={_free_port()}", "-m", "workbench", "run", *args,
                             "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _finish(proc: subprocess.Popen, run_dir: Path) -> dict:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-8000:]
    return json.loads((run_dir / "run.json").read_text())


def _sets(*items: str) -> list[str]:
    return [x for kv in items for x in ("--set", kv)]


def test_eval_every_under_two_ranks_with_a_rounding_master(tmp_path):
    """Every rank evaluates its share of dev and the totals are summed; the eval's flush of
    master=compressed-sr (a rounding pass) runs on every rank, so they never diverge."""
    rec = _finish(_torchrun(*_sets(*EVAL, "method=zo-offload", "codec=bf16",
                                   "master=compressed-sr", "steps=7"),
                            "--out", str(tmp_path / "r")), tmp_path / "r")
    assert [e["step"] for e in rec["evals"]] == [0, 3, 6, 7]
    assert all(e["examples"] == 40 for e in rec["evals"])  # both ranks' shares
    assert {r["param_digest"] for r in rec["info"]["ranks"]} == {rec["param_digest"]}


def test_sigterm_stops_both_ranks_after_the_same_step_and_resume_is_exact(tmp_path):
    """SIGTERM to torchrun reaches both ranks at their own moments; the stop is voted on with
    the step's all-reduce, so both stop after the same step, checkpoint, and a resume ends
    where a straight run does (evals included: each comes before its step's checkpoint)."""
    straight = _finish(_torchrun(*_sets(*EVAL, "method=zo-offload", "steps=12"), "--out",
                                 str(tmp_path / "straight")), tmp_path / "straight")
    out = tmp_path / "stopped"
    proc = _torchrun(*_sets(*EVAL, "method=zo-offload", "steps=400"), "--out", str(out))
    deadline = time.monotonic() + 300
    while not (out / "history.jsonl").is_file() or \
            (out / "history.jsonl").read_text().count('{"step"') < 4:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)  # torchrun's agent passes it on to both ranks
    proc.communicate(timeout=300)
    part = json.loads((out / "run.json").read_text())
    assert part["status"] == "stopped" and len(part["steps"]) < 12
    assert len({r["param_digest"] for r in part["info"]["ranks"]}) == 1
    end = _finish(_torchrun("--resume", str(out), "--set", "steps=12"), out)
    assert [s["step"] for s in end["steps"]] == list(range(12))
    assert [e["step"] for e in end["evals"]] == [e["step"] for e in straight["evals"]]
    assert end["param_digest"] == straight["param_digest"]
