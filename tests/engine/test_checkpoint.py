"""Asynchronous checkpoints: exact resume, replay between snapshots, crash safety."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from workbench.config import RunConfig
from workbench.engine.checkpoint import (CheckpointError, Snapshot, complete_checkpoints,
                                         latest_checkpoint, read_checkpoint, write_checkpoint)
from workbench.recipes.train import run

from zo_helpers import BASE, REPLAYED, assert_replay_exact


@pytest.mark.parametrize("method", ["mezo", "zo-offload", "forward-grad", "zo-offload-sr"])
def test_resume_is_exact(method, tmp_path):
    sr = dict(method="zo-offload", master="compressed-sr", codec="bf16")  # bf16 host master
    cfg = RunConfig(**(sr if method == "zo-offload-sr" else {"method": method}), steps=10, **BASE)
    straight = run(cfg, tmp_path / "straight", progress=False)
    part = run(cfg.replace(steps=6, checkpoint_every=3), tmp_path / "resumed", progress=False)
    assert part.param_digest != straight.param_digest
    resumed = run(cfg.replace(steps=10, checkpoint_every=3), tmp_path / "resumed",
                  progress=False, resume=True)
    assert resumed.param_digest == straight.param_digest
    assert [s["step"] for s in resumed.steps] == list(range(10))
    assert resumed.info["resumed_from"] == "step-00000006"


@pytest.mark.parametrize("variant", list(REPLAYED))
def test_restore_between_snapshots_from_the_step_log(variant, tmp_path):
    """The replay (``replay.py``) is bit-identical to a straight run, for every way of applying
    an update and every host format (an SR master's roundings are seeded per offload)."""
    assert_replay_exact(RunConfig(**REPLAYED[variant], **BASE), tmp_path)


def _snapshot(step, value=0.5):
    flats = [torch.full((1000,), value), torch.full((2000,), value), torch.full((10,), value)]
    return Snapshot(step, flats, ["embed", "block.0", "head"], None, {"model": "x"}, [1000, 0, 0])


WRITER = r"""
import sys, torch
from pathlib import Path
from workbench.engine.checkpoint import Snapshot, write_checkpoint
flats = [torch.full((1000,), 9.0), torch.full((2000,), 9.0), torch.full((10,), 9.0)]
snap = Snapshot(8, flats, ["embed", "block.0", "head"], None, {"model": "x"}, [1000, 0, 0])
print("writing", flush=True)
write_checkpoint(Path(sys.argv[1]), snap, pause_s=30)
"""


def test_writer_killed_mid_write_loses_nothing(tmp_path):
    root = tmp_path / "ck"
    write_checkpoint(root, _snapshot(4))
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(root)], env=env,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    deadline = time.time() + 60
    while not (root / "step-00000008.partial" / "p1.safetensors").exists():
        assert time.time() < deadline
        time.sleep(0.05)
    time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with pytest.warns(UserWarning, match="incomplete"):
        latest = latest_checkpoint(root)
    assert latest.name == "step-00000004"
    snap = read_checkpoint(latest, ["embed", "block.0", "head"], [1000, 2000, 10])
    assert all(torch.equal(f, torch.full_like(f, 0.5)) for f in snap.flats)


def test_corrupted_or_mismatched_checkpoint_is_refused(tmp_path):
    path = write_checkpoint(tmp_path, _snapshot(4))
    with pytest.raises(CheckpointError, match="another model"):
        read_checkpoint(path, ["embed", "block.0", "head"], [1000, 2001, 10])
    shard = path / "p2.safetensors"
    data = bytearray(shard.read_bytes())
    data[-5] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupted"):
        read_checkpoint(path, ["embed", "block.0", "head"], [1000, 2000, 10])


def test_keep_last_deletes_only_older_complete_checkpoints(tmp_path):
    cfg = RunConfig(method="zo-offload", steps=9, checkpoint_every=2, keep_last=2, **BASE)
    run(cfg, tmp_path / "r", progress=False)
    names = [p.name for p in complete_checkpoints(tmp_path / "r" / "checkpoints")]
    assert names == ["step-00000008", "step-00000009"]
    manifest = json.loads((tmp_path / "r" / "checkpoints" / names[0] / "manifest.json").read_text())
    assert manifest["pending"] is not None and manifest["config"]["method"] == "zo-offload"


def test_cli_resume_refuses_other_model(tmp_path):
    cfg = RunConfig(method="mezo", steps=3, checkpoint_every=3, **BASE)
    run(cfg, tmp_path / "r", progress=False)
    r = subprocess.run([sys.executable, "-m", "workbench", "run", "--resume", str(tmp_path / "r"),
                        "--set", "model=tiny-llama", "--quiet"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "error:" in r.stderr and "model" in r.stderr
