"""Where exactness holds and where it does not is said where runs are compared: MeZO beside
zo-offload with master=fp32 end with one param_digest and the comparison says that is
expected; with a compressed master they differ by design (MeZO's half mode rounds every
weight, zo-offload keeps the embedding, positions and final norm in fp32), and ``compare`` and
the report say so instead of leaving a bare DIFFERENT."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from workbench.config import RunConfig
from workbench.recipes.train import run
from workbench.telemetry.exactness import exactness_note
from workbench.ui.report import write_report

REPO = Path(__file__).resolve().parents[2]
SHORT = dict(model="tiny-opt", data="synthetic", steps=2, batch_size=2, seq_len=16, lr=1e-3,
             sample_hz=0.0, eval_every=0)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """MeZO and zo-offload, with master=fp32 and with master=compressed (bf16 weights)."""
    tmp = tmp_path_factory.mktemp("pairs")
    out = {}
    for master in ("fp32", "compressed"):
        out[master] = []
        for method in ("mezo", "zo-offload"):
            half = {} if master == "fp32" else {"codec": "bf16", "amp": "bf16"}
            cfg = RunConfig(method=method, master=master, **half, **SHORT)
            run(cfg, tmp / f"{master}-{method}", progress=False)
            out[master].append(tmp / f"{master}-{method}")
    return out


def compare(dirs) -> str:
    r = subprocess.run([sys.executable, "-m", "workbench", "compare", *map(str, dirs)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_compare_says_a_compressed_master_differs_from_mezo_by_design(pairs, tmp_path):
    said = compare(pairs["compressed"])
    assert "param_digest DIFFERENT across the runs" in said
    assert "not expected identical (master=compressed): MeZO's half mode rounds every " \
           "weight" in said and "keeps those in fp32" in said
    same = compare(pairs["fp32"])
    assert "param_digest identical across the runs" in same
    assert "expected identical: with master=fp32" in same
    html = Path(write_report(pairs["compressed"], tmp_path / "report.html")).read_text()
    assert "not expected identical (master=compressed)" in html


def test_the_note_is_for_mezo_beside_zo_offload_only():
    mezo = RunConfig(model="tiny-opt", method="mezo").to_dict()
    fo = RunConfig(model="tiny-opt", method="fo").to_dict()
    assert exactness_note([mezo]) == "" and exactness_note([mezo, fo]) == ""
    sr = RunConfig(model="tiny-opt", method="zo-offload", master="compressed-sr",
                   codec="bf16", amp="bf16").to_dict()
    assert exactness_note([mezo, sr]).startswith(
        "not expected identical (master=compressed-sr)")
