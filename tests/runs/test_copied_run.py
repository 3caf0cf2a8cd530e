"""A copied run is its own run (``runs/identity.py``): through the CLI, ``cp -r A C`` then
``--resume C`` gives C a new run id and never touches A's checkpoints, and ``--resume A`` then
goes on from A's own, ending where a straight run does. Rotation (keep_last) deletes only the
writing run's checkpoints."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from workbench.engine.checkpoint import AsyncCheckpointer, Snapshot, write_checkpoint

TINY = ["model=tiny-opt", "data=synthetic", "batch_size=2", "seq_len=8", "sample_hz=0",
        "eval_samples=0", "lr=1e-3", "checkpoint_every=2", "keep_last=2"]


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench", *map(str, args), "--quiet"],
                          capture_output=True, text=True, timeout=300)


def _sets(*items: str) -> list[str]:
    return [x for kv in items for x in ("--set", kv)]


def _record(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def _manifests(root: Path) -> dict[str, str]:
    """Checkpoint name -> the run id that wrote it."""
    return {p.name: json.loads((p / "manifest.json").read_text())["identity"]["run_id"]
            for p in sorted(root.glob("step-*"))}


def test_a_copy_is_a_new_run_and_the_original_resumes_from_its_own(tmp_path):
    x, a, c = tmp_path / "x", tmp_path / "a", tmp_path / "c"
    straight = tmp_path / "straight"
    r = _cli("run", *_sets(*TINY, "steps=10", f"checkpoint_dir={tmp_path / 'xs'}"),
             "--out", straight)
    assert r.returncode == 0, r.stderr[-3000:]
    r = _cli("run", *_sets(*TINY, "steps=6", f"checkpoint_dir={x}"), "--out", a)
    assert r.returncode == 0, r.stderr[-3000:]
    a_id = _record(a)["info"]["run_id"]
    assert _record(a)["info"]["run_dir"] == str(a.resolve())
    before = _manifests(x)
    assert set(before.values()) == {a_id} and list(before) == ["step-00000004", "step-00000006"]
    shutil.copytree(a, c)  # cp -r A C: the README's way to branch a run

    # the copy would write into A's checkpoint_dir: refused, nothing changed
    r = _cli("run", "--resume", c, *_sets("lr=5e-3", "steps=10"))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("error: checkpoint_dir:") and str(a) in lines[0]
    assert _record(c) == _record(a) and _manifests(x) == before

    # with its own checkpoint_dir: a new run, from A's checkpoint at the copy, said in one line
    y = tmp_path / "y"
    r = _cli("run", "--resume", c, *_sets("lr=5e-3", "steps=10", f"checkpoint_dir={y}"))
    assert r.returncode == 0, r.stderr[-3000:]
    notes = [l for l in r.stderr.splitlines() if "is a copy of the run in" in l]
    assert len(notes) == 1 and a_id in notes[0], r.stderr
    info = _record(c)["info"]
    assert info["run_id"] != a_id and info["lineage"] == [a_id]
    assert info["copied_from"] == {"run_id": a_id, "run_dir": str(a.resolve()), "steps": 6}
    assert info["run_dir"] == str(c.resolve())
    assert [s["step"] for s in _record(c)["steps"]] == list(range(10))
    assert _manifests(x) == before  # A's checkpoints: untouched
    assert set(_manifests(y).values()) == {info["run_id"]}

    # A goes on from its own checkpoint and ends where a straight run does
    r = _cli("run", "--resume", a, *_sets("steps=10"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "copy" not in r.stderr
    end = _record(a)
    assert end["info"]["run_id"] == a_id
    assert end["param_digest"] == _record(straight)["param_digest"]
    assert end["param_digest"] != _record(c)["param_digest"]  # C trained with another lr
    assert set(_manifests(y).values()) == {info["run_id"]}  # C's, untouched by A


def test_a_moved_run_stays_the_same_run(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    r = _cli("run", *_sets(*TINY, "steps=4"), "--out", a)
    assert r.returncode == 0, r.stderr[-3000:]
    run_id = _record(a)["info"]["run_id"]
    a.rename(b)
    r = _cli("run", "--resume", b, *_sets("steps=6"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "copy" not in r.stderr
    assert _record(b)["info"]["run_id"] == run_id
    assert _record(b)["info"]["run_dir"] == str(b.resolve())


def _snap(step: int) -> Snapshot:
    return Snapshot(step, [torch.zeros(3), torch.ones(2), torch.zeros(1)], ["a", "b", "c"],
                    None, {"model": "m"})


def test_rotation_deletes_only_the_writing_runs_checkpoints(tmp_path):
    """keep_last rotated every complete checkpoint in the folder, another run's too."""
    for step in (1, 2):
        write_checkpoint(tmp_path, _snap(step), identity={"run_id": "other"})
    ck = AsyncCheckpointer(tmp_path, keep_last=1, identity={"run_id": "mine"})
    for step in (3, 4, 5):
        ck.submit(lambda step=step: _snap(step))
        ck.wait()
    ck.close()
    assert sorted(p.name for p in tmp_path.glob("step-*")) == [
        "step-00000001", "step-00000002", "step-00000005"]
