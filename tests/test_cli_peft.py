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
                        "--quiet", "--set", "model=tiny-opt", "--set", "steps=3", "--set",
                        "peft=lora", "--set", "base_codec=bf16", "--set", "lora_rank=4"],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    mezo, off = (json.loads((tmp_path / m / "run.json").read_text())
                 for m in ("mezo", "zo-offload"))
    for run in (mezo, off):
        assert run["config"]["peft"] == "lora" and run["config"]["lora_rank"] == 4
        assert run["config"]["base_codec"] == "bf16"
        assert len(run["base_digest"]) == 64 and run["base_digest"] != run["param_digest"]
        assert run["summary"]["digest_seconds"] >= 0  # both digests' time (minutes at 175b)
    assert mezo["param_digest"] == off["param_digest"]
    assert mezo["base_digest"] == off["base_digest"]
    assert "param_digest identical: zo-offload trained exactly what MeZO trained" in r.stdout


def test_every_method_trains_adapters_over_one_frozen_base(tmp_path):
    """A sweep over the other methods with adapters over an int8 base: each run.json holds the
    peft settings, its own adapters' digest and the same frozen-base digest (every engine
    computes with the same decoded base and never changes it)."""
    r = subprocess.run([sys.executable, "-m", "workbench", "sweep", "--out", str(tmp_path),
                        "--quiet", "--sweep", "method=mezo,forward-grad,fo,fo-offload",
                        *[a for kv in ("peft=lora", "base_codec=int8", "steps=3", "model=tiny-opt",
                                       "data=embedded", "batch_size=4", "seq_len=32",
                                       "eval_samples=8", "lr=1e-3") for a in ("--set", kv)]],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    runs = {m: json.loads((tmp_path / f"method-{m}" / "run.json").read_text())
            for m in ("mezo", "forward-grad", "fo", "fo-offload")}
    for method, run in runs.items():
        assert run["status"] == "done" and run["config"]["method"] == method
        assert run["config"]["peft"] == "lora" and run["config"]["base_codec"] == "int8"
        assert len(run["base_digest"]) == 64 and run["base_digest"] != run["param_digest"]
    assert len({run["base_digest"] for run in runs.values()}) == 1
    assert runs["forward-grad"]["summary"]["bytes_d2h"] == 0  # the base only comes up
    assert runs["forward-grad"]["summary"]["bytes_h2d"] > 0


def test_a_bad_peft_setting_is_one_line_before_any_work(tmp_path):
    r = subprocess.run([sys.executable, "-m", "workbench", "run", "--out", str(tmp_path / "r"),
                        "--set", "method=forward-grad", "--set", "peft=lora", "--set",
                        "codec=bf16"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "codec: with peft=lora the adapters stay on the GPU" in r.stderr
    assert not (tmp_path / "r" / "run.json").exists()
