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


RESUMED = {"zo-offload-sr": dict(method="zo-offload", master="compressed-sr", codec="bf16"),
           "zo-offload-q3": dict(method="zo-offload", queries=3),  # q coefficients pending
           "zo-offload-fzoo": dict(method="zo-offload", queries=3, estimator="one-sided",
                                   directions="rademacher", lr=1e-6),
           # optimizer state in the checkpoint: on the device, and streamed in the master's form
           "mezo-momentum": dict(method="mezo", zo_optimizer="momentum"),
           "zo-offload-hizoo": dict(method="zo-offload", zo_optimizer="hizoo",
                                    hessian_smooth=1e-2),
           "zo-offload-adam-sr": dict(method="zo-offload", zo_optimizer="adam",
                                      master="compressed-sr", codec="bf16", resident_blocks=1)}


@pytest.mark.parametrize("method", ["mezo", "zo-offload", "forward-grad", *RESUMED])
def test_resume_is_exact(method, tmp_path):
    cfg = RunConfig(**{**BASE, **RESUMED.get(method, {"method": method})}, steps=10)
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
    assert_replay_exact(RunConfig(**{**BASE, **REPLAYED[variant]}), tmp_path)


def _snapshot(step, value=0.5):
    flats = [torch.full((1000,), value), torch.full((2000,), value), torch.full((10,), value)]
    return Snapshot(step, flats, ["embed", "block.0", "head"], None, {"model": "x"}, [1000, 0, 0])


WRITER = r"""
import sys, time, torch
from pathlib import Path
import workbench.engine.checkpoint as ck
from workbench.engine.checkpoint import Snapshot, write_checkpoint
save = ck._save_shard
def slow(tensors, path):  # the writer stalls after its first shard: killed there
    save(tensors, path)
    time.sleep(30)
ck._save_shard = slow
flats = [torch.full((1000,), 9.0), torch.full((2000,), 9.0), torch.full((10,), 9.0)]
snap = Snapshot(8, flats, ["embed", "block.0", "head"], None, {"model": "x"}, [1000, 0, 0])
print("writing", flush=True)
write_checkpoint(Path(sys.argv[1]), snap)
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


def test_a_failed_write_leaves_nothing_and_is_reported_not_raised(tmp_path, monkeypatch):
    import errno

    from workbench.engine import checkpoint
    from workbench.engine.checkpoint import AsyncCheckpointer

    real = checkpoint._save_shard
    calls = []

    def full(tensors, path):
        calls.append(path.name)
        if len(calls) == 2:  # the second shard: the disk fills up half-way through
            path.write_bytes(b"\0" * 100)
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(tensors, path)
    monkeypatch.setattr(checkpoint, "_save_shard", full)
    writer = AsyncCheckpointer(tmp_path, keep_last=2)
    writer.submit(lambda: _snapshot(2))
    writer.wait()
    error = writer.failure()
    assert isinstance(error, OSError) and error.errno == errno.ENOSPC and writer.failures == 1
    assert writer.failure() is None  # reported once
    assert list(tmp_path.iterdir()) == []  # no partial folder left behind
    writer.submit(lambda: _snapshot(4))
    writer.close()
    assert writer.failures == 0 and [p.name for p in complete_checkpoints(tmp_path)] == [
        "step-00000004"]


def test_keep_last_counts_only_checkpoints_known_to_be_good(tmp_path):
    from workbench.engine.checkpoint import AsyncCheckpointer

    writer = AsyncCheckpointer(tmp_path, keep_last=1)
    writer.verified = 4  # steps after 4 not seen yet: newer checkpoints might hold a divergence
    for step in (2, 4, 6, 8):
        writer.submit(lambda s=step: _snapshot(s))
        writer.wait()
    assert [p.name for p in complete_checkpoints(tmp_path)] == [
        "step-00000004", "step-00000006", "step-00000008"]
    assert [p.name for p in writer.discard_after(4)] == ["step-00000006", "step-00000008"]
    writer.close()
