"""Under torchrun (2 CPU ranks over gloo) a refused run says its one line on every rank and
every rank exits 2 at once: a refusal only rank 0 can see (the run directory) used to leave
the other rank waiting in a collective forever."""
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

TINY = ["model=tiny-opt", "data=synthetic", "steps=2", "batch_size=2", "seq_len=8",
        "sample_hz=0", "eval_samples=0", "method=mezo"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sets(*items: str) -> list[str]:
    return [x for kv in items for x in ("--set", kv)]


def _torchrun(*args) -> subprocess.CompletedProcess:
    """torchrun in a session of its own: a hang (the bug) fails the test and leaves no rank
    behind."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           f"--master_port={_free_port()}", "-m", "workbench", "run", *map(str, args), "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError("the ranks hung (no exit within 240 s)") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("held") / "r"
    r = subprocess.run([sys.executable, "-m", "workbench", "run", *_sets(*TINY), "--out",
                        str(out), "--quiet"], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def _refused_on_every_rank(r: subprocess.CompletedProcess, start: str) -> None:
    ours = [l for l in r.stderr.splitlines() if l.startswith("error: ")]
    assert r.returncode != 0 and len(ours) == 2 and len(set(ours)) == 1, r.stderr[-4000:]
    assert ours[0].startswith(start), ours[0]
    # no worker dumps a stack (torchrun's launcher prints its own for any failed worker)
    assert not [l for l in r.stderr.splitlines() if l.lstrip().startswith("File ")
                and "workbench" in l], r.stderr[-4000:]
    # torchrun's summary: the first rank to end exited 2 (it may stop the other before its
    # own exit is seen; both said the line)
    assert "exitcode  : 2" in r.stderr and "exitcode  : 1 " not in r.stderr


def test_out_holding_a_run_is_refused_on_every_rank(run_dir):
    before = _tree(run_dir)
    r = _torchrun(*_sets(*TINY), "--out", run_dir)
    _refused_on_every_rank(r, f"error: --out: {run_dir} already holds a run")
    assert _tree(run_dir) == before


def test_a_refused_resume_is_refused_on_every_rank(run_dir, tmp_path):
    before = _tree(run_dir)
    r = _torchrun("--resume", run_dir, *_sets("seed=7"))  # a knob fixed at the start
    _refused_on_every_rank(r, "error: seed")
    assert _tree(run_dir) == before
    r = _torchrun("--resume", tmp_path)
    _refused_on_every_rank(r, "error: ")
