"""A CLI command whose reader leaves early (``python -m workbench compare A B | head -3``) stops
quietly, as CLI tools do: no BrokenPipeError traceback, the status of a process ended by
SIGPIPE."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from workbench.config import RunConfig
from workbench.recipes.train import run

REPO = Path(__file__).resolve().parents[1]


def test_compare_into_a_closed_pipe_exits_quietly(tmp_path, one_thread):
    for name in ("A", "B"):
        run(RunConfig(model="tiny-opt", data="synthetic", steps=2, batch_size=4, seq_len=16,
                      sample_hz=0.0, eval_every=0, save_final=False), tmp_path / name,
            progress=False)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "compare", str(tmp_path / "A"),
                             str(tmp_path / "B")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    proc.stdout.close()  # the reader is gone before the first line (head -3 after its lines)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 128 + signal.SIGPIPE
    assert err == ""
