"""export and evaluate through the real CLI where the truth is awkward: weights rounded to bf16
are recorded and announced with their own digest (not the run's fp32 one); a damaged export
(a weights file cut short, an edited vocab_size) is one line, not a traceback; a live run that
rotates away the checkpoint being exported does not fail the export."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from export_helpers import SHORT, train_live
from workbench.config import RunConfig
from workbench.engine.groups import fingerprint
from workbench.export.exporter import export_run

REPO = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, OMP_NUM_THREADS="1",
           PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


def cli(*args: str, prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*(prefix or [sys.executable, "-m", "workbench"]), *args],
                          capture_output=True, text=True, env=ENV, timeout=300)


def one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [l for l in stderr.splitlines() if l.strip() and not l.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished tiny-opt run: (its directory, its record, its final weights)."""
    root = tmp_path_factory.mktemp("trained")
    rec, flats = train_live(RunConfig(model="tiny-opt", method="mezo", **SHORT), root / "R")
    return root / "R", rec, flats


def test_a_bf16_export_records_and_says_the_digest_of_what_it_holds(trained, tmp_path):
    run, rec, flats = trained
    r = cli("export", str(run), "--out", str(tmp_path / "bf16"), "--dtype", "bf16", "--quiet")
    assert r.returncode == 0, r.stderr
    rounded = fingerprint([f.to(torch.bfloat16).float() for f in flats])[0]  # the reference
    assert rounded != rec.param_digest
    assert "equals the run's" not in r.stdout
    assert (f"the run's fp32 weights were read back equal to its param_digest "
            f"{rec.param_digest[:16]} and rounded to bfloat16: the exported weights' digest is "
            f"{rounded[:16]} (read back, each group checked against the rounding of the run's "
            "weights)") in r.stdout.splitlines()
    info = json.loads((tmp_path / "bf16" / "workbench_export.json").read_text())
    assert info["weights_digest"] == rounded and info["source_digest"] == rec.param_digest
    assert info["param_digest"] == rec.param_digest and info["matches_run_digest"] is True
    card = (tmp_path / "bf16" / "README.md").read_text()
    assert (f"| weights digest | `{rounded}` (the run's fp32 weights, param_digest "
            f"`{rec.param_digest}`, rounded to bfloat16) |") in card
    r = cli("export", str(run), "--out", str(tmp_path / "fp32"), "--quiet")  # nothing rounded
    assert f"param_digest {rec.param_digest[:16]} equals the run's" in r.stdout.splitlines()
    info = json.loads((tmp_path / "fp32" / "workbench_export.json").read_text())
    assert info["weights_digest"] == info["source_digest"] == rec.param_digest


def test_a_damaged_export_is_evaluated_in_one_line(trained, tmp_path):
    run, _, _ = trained
    export_run(run, tmp_path / "E")
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "E", cut)
    weights = cut / "model.safetensors"
    full = weights.stat().st_size
    with open(weights, "r+b") as fh:
        fh.truncate(full // 2)  # a copy that stopped half way
    r = cli("evaluate", str(cut), "--set", "eval_samples=8")
    assert r.returncode == 2
    assert one_line(r.stderr) == (f"error: model: {weights} is cut short ({full // 2} of {full} "
                                  "bytes); copy or download it again")
    edited = tmp_path / "edited"
    shutil.copytree(tmp_path / "E", edited)
    config = json.loads((edited / "config.json").read_text())
    vocab, config["vocab_size"] = config["vocab_size"], config["vocab_size"] + 40
    (edited / "config.json").write_text(json.dumps(config))
    r = cli("evaluate", str(edited), "--set", "eval_samples=8")
    assert r.returncode == 2
    line = one_line(r.stderr)
    assert line.startswith(f"error: model: model.safetensors holds "
                           "model.decoder.embed_tokens.weight as ") and \
        f"({vocab}, " in line and f"config.json makes it ({vocab + 40}, " in line, line
    assert line.endswith(f"the config and the weights of {edited} disagree (an edited "
                         "config.json?)"), line


#: The CLI with a live run's rotation injected: the first tensor an export reads is the last
#: moment the checkpoint it picked exists (a run with keep_last=N removes it once it has written
#: N newer ones; here it goes at once).
ROTATE = """
import shutil, sys
from pathlib import Path
import workbench.export.source as source
real, root = source.read_fp32, Path(sys.argv.pop(1))
def rotated(*args, **kwargs):
    for step in sorted(root.glob("step-*"))[-1:]:
        shutil.rmtree(step)
    source.read_fp32 = real
    return real(*args, **kwargs)
source.read_fp32 = rotated
from workbench.cli import main
raise SystemExit(main())
"""


def test_export_force_survives_a_live_runs_rotation(tmp_path):
    run = tmp_path / "R"
    cfg = RunConfig(model="tiny-opt", method="mezo", **{**SHORT, "steps": 4},
                    checkpoint_every=1, keep_last=2, save_final=False)
    train_live(cfg, run)
    record = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**record, "status": "running"}))  # as it runs
    reference = export_run(run, tmp_path / "reference", force=True)
    assert reference.origin == "step-00000004"
    r = cli("export", str(run), "--out", str(tmp_path / "out"), "--force", "--quiet",
            prefix=[sys.executable, "-c", ROTATE, str(run / "checkpoints")])
    assert r.returncode == 0, r.stderr
    assert not (run / "checkpoints" / "step-00000004").exists()  # it went mid-read
    assert r.stdout.startswith("exported the model after 4 steps (step-00000004, float32)")
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == \
        (tmp_path / "reference" / "model.safetensors").read_bytes()
