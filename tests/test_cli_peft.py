"""``--set peft=lora`` from the command line through to run.json, as a user runs it."""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_demo_with_lora_trains_the_same_adapters_on_both_engines(tmp_path):
    """The demo (MeZO then zo-offload) with adapters over a bf16 base: both run.json files
    record the peft settings, identical adapter digests and one frozen-base digest."""
    r = subprocess.run([sys.executable, "-m", "workbench", "demo", "--out", str(tmp_path),
                        "--quiet", "--set", "steps=3", "--set", "peft=lora", "--set",
                        "base_codec=bf16", "--set", "lora_rank=4"],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    mezo, off = (json.loads((tmp_path / m / "run.json").read_text())
                 for m in ("mezo", "zo-offload"))
    for run in (mezo, off):
        assert run["config"]["peft"] == "lora" and run["config"]["lora_rank"] == 4
        assert run["config"]["base_codec"] == "bf16"
        assert len(run["base_digest"]) == 64 and run["base_digest"] != run["param_digest"]
    assert mezo["param_digest"] == off["param_digest"]
    assert mezo["base_digest"] == off["base_digest"]
    assert "param_digest identical across the two engines" in r.stdout


def test_a_bad_peft_setting_is_one_line_before_any_work(tmp_path):
    r = subprocess.run([sys.executable, "-m", "workbench", "run", "--out", str(tmp_path / "r"),
                        "--set", "method=fo", "--set", "peft=lora"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "peft: lora is built for mezo, zo-offload" in r.stderr
    assert not (tmp_path / "r" / "run.json").exists()
