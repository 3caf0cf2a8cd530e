"""``model=org/name`` resolves through the Hugging Face cache offline, or is refused in one line."""
import json

import pytest
import torch

from workbench.config import ConfigError, RunConfig
from workbench.models.build import build_skeleton
from workbench.models.hub import model_folder


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An offline Hugging Face cache in tmp_path; returns a function that adds a snapshot."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))

    def add(repo: str, files: dict) -> object:
        root = tmp_path / "hub" / f"models--{repo.replace('/', '--')}"
        snap = root / "snapshots" / "0123abcd"
        snap.mkdir(parents=True)
        (root / "refs").mkdir()
        (root / "refs" / "main").write_text("0123abcd")
        for name, write in files.items():
            write(snap / name) if callable(write) else (snap / name).write_text(write)
        return snap

    return add


def _one_line(call) -> str:
    with pytest.raises(ConfigError) as e:
        call()
    (line,) = e.value.problems
    assert "\n" not in line and line.startswith("model: ")
    return line


def test_cached_hub_model_builds_offline_with_its_weights(hub_cache, tiny_model, tmp_path):
    model = tiny_model("tiny-llama")
    model.save_pretrained(tmp_path / "saved")
    files = {p.name: p.read_bytes() for p in (tmp_path / "saved").iterdir()}
    snap = hub_cache("acme/tiny-llama", {n: (lambda path, b=b: path.write_bytes(b))
                                         for n, b in files.items()})
    assert RunConfig(model="acme/tiny-llama").model == "acme/tiny-llama"
    assert model_folder("acme/tiny-llama") == snap
    skeleton, source = build_skeleton("acme/tiny-llama")
    assert skeleton.config.model_type == "llama" and skeleton.lm_head.weight.is_meta
    w = torch.empty(260, 64)
    source.fill("head", [("lm_head.weight", w)], 0)
    assert torch.equal(w, model.lm_head.weight)
    from workbench.models.shape import shape_of

    assert shape_of("acme/tiny-llama").total_params() == sum(p.numel() for p in model.parameters())


def test_uncached_hub_model_is_refused_offline(hub_cache):
    line = _one_line(lambda: build_skeleton("acme/not-cached"))
    assert line == ("model: acme/not-cached is not in the local Hugging Face cache and "
                    "HF_HUB_OFFLINE is set; run once online to cache it")


def test_hub_model_without_safetensors_or_needing_custom_code(hub_cache):
    config = {"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
              "num_attention_heads": 1, "intermediate_size": 8}
    hub_cache("acme/pickled", {"config.json": json.dumps(config), "pytorch_model.bin": "x"})
    assert "has no *.safetensors weights" in _one_line(lambda: build_skeleton("acme/pickled"))
    custom = {**config, "model_type": "acme-net", "auto_map": {"AutoConfig": "net.NetConfig"}}
    hub_cache("acme/custom", {"config.json": json.dumps(custom), "model.safetensors": "x"})
    assert "needs custom code" in _one_line(lambda: build_skeleton("acme/custom"))


def test_model_setting_shapes():
    with pytest.raises(ConfigError, match="neither a preset .* nor a hub id org/name"):
        RunConfig(model="./no/such/folder")


def test_cli_run_on_a_cached_hub_model_offline(tmp_path, tiny_model, data_dir):
    """As a user runs it: HF_HUB_OFFLINE=1 and a model id in the Hugging Face cache."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    snap = tmp_path / "hf" / "hub" / "models--acme--tiny-opt" / "snapshots" / "0123abcd"
    tiny_model("tiny-opt", vocab=50272).save_pretrained(snap)  # OPT's vocabulary, tiny blocks
    for f in (data_dir / "opt-tokenizer").iterdir():
        shutil.copy(f, snap / f.name)
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("0123abcd")
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1", PYTHONPATH=str(repo))
    r = subprocess.run([sys.executable, "-m", "workbench", "run", "--set", "model=acme/tiny-opt",
                        "--set", "steps=2", "--set", "eval_samples=8", "--set", "sample_hz=0",
                        "--out", str(tmp_path / "run"), "--quiet"],
                       cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["config"]["model"] == "acme/tiny-opt" and len(record["steps"]) == 2
