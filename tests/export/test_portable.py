"""Exports work on another machine, checked as a Hugging Face user meets them: each folder is
written by the command line (``python -m workbench export``), copied to another directory
(the run and the original folder deleted), and loaded there with transformers' and peft's own
loaders only. A full export's tokenizer and config agree (positions, special ids), its files
have the permissions of any file the user makes, and neither its card nor its provenance file
holds a local path; an adapter of a random preset carries its base and names it relatively."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from export_helpers import SHORT, batch, hf_logits, train_live, workbench_logits
from workbench.config import RunConfig
from workbench.export.base_ref import base_ref, portable

REPO = Path(__file__).resolve().parents[2]


def export_cli(run_dir: Path, out: Path) -> str:
    r = subprocess.run([sys.executable, "-m", "workbench", "export", str(run_dir), "--out",
                        str(out), "--quiet"], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def moved(folder: Path, elsewhere: Path, *gone: Path) -> Path:
    """``folder`` copied under ``elsewhere``; ``folder`` and ``gone`` deleted (nothing left
    for the copy to point back to)."""
    copy = Path(shutil.copytree(folder, elsewhere / "copied"))
    for path in (folder, *gone):
        shutil.rmtree(path)
    return copy


def no_local_paths(folder: Path, *local: Path) -> None:
    for name in ("README.md", "workbench_export.json"):
        text = (folder / name).read_text()
        for path in (*local, Path.home(), Path("/tmp")):
            assert str(path) not in text, (name, path)
        assert "/.cache/" not in text, name


@pytest.fixture(scope="module")
def full_export(tmp_path_factory):
    """tiny-opt after a short MeZO run, exported by the CLI: (cfg, final weights, folder)."""
    tmp = tmp_path_factory.mktemp("full")
    torch.set_num_threads(1)
    cfg = RunConfig(model="tiny-opt", method="mezo", **SHORT)
    _, flats = train_live(cfg, tmp / "run")
    export_cli(tmp / "run", tmp / "model")
    return cfg, flats, tmp


def test_a_full_export_has_normal_permissions_and_no_local_paths(full_export):
    _, _, tmp = full_export
    mask = os.umask(0)
    os.umask(mask)
    folder = tmp / "model"
    assert folder.stat().st_mode & 0o777 == 0o777 & ~mask  # 0755 under umask 022, not 0700
    for f in folder.iterdir():
        assert f.stat().st_mode & 0o777 == 0o666 & ~mask, f.name
    no_local_paths(folder, tmp)
    facts = json.loads((folder / "workbench_export.json").read_text())
    assert facts["run_dir"] == "run" and facts["base_beside"] is False


def test_tokenizer_and_config_agree_and_the_copy_computes_the_run(full_export, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    cfg, flats, tmp = full_export
    copy = Path(shutil.copytree(tmp / "model", tmp_path / "elsewhere"))
    config = json.loads((copy / "config.json").read_text())
    gen = GenerationConfig.from_pretrained(copy)
    tok = AutoTokenizer.from_pretrained(copy)
    # one set of special ids, as the run encoded (tiny-opt's OPT config said bos/pad 2/1)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        assert config[key] == getattr(gen, key) == getattr(tok, key), key
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 0)
    # the tokenizer cuts a text to the positions the model has (it claimed 163,840)
    assert tok.model_max_length == config["max_position_embeddings"] == 512
    ids = tok("x" * 700, truncation=True, return_tensors="pt").input_ids
    assert ids.shape == (1, 512)
    model = AutoModelForCausalLM.from_pretrained(copy)
    with torch.no_grad():
        assert model(input_ids=ids).logits.shape == (1, 512, 260)
    short = batch()
    assert torch.equal(hf_logits(model, short), workbench_logits(cfg, flats, short))


def test_an_adapter_of_a_random_preset_carries_its_base(tmp_path, one_thread, monkeypatch):
    """``peft=lora`` on tiny-llama (random weights no Hub repository holds): the adapter folder
    holds the base in ``base/``, adapter_config.json names it ``base``, and peft's loaders,
    run on a copy elsewhere, compute the workbench's logits."""
    from peft import AutoPeftModelForCausalLM, PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = RunConfig(model="tiny-llama", method="zo-offload", peft="lora", lora_rank=4,
                    lora_alpha=8.0, **{**SHORT, "lr": 5e-2})
    _, flats = train_live(cfg, tmp_path / "run")
    said = export_cli(tmp_path / "run", tmp_path / "adapter")
    assert "AutoPeftModelForCausalLM.from_pretrained('.') inside DIR" in said
    conf = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert conf["base_model_name_or_path"] == "base"
    no_local_paths(tmp_path / "adapter", tmp_path)
    (tmp_path / "far").mkdir()
    copy = moved(tmp_path / "adapter", tmp_path / "far", tmp_path / "run")
    ids = batch()
    want = workbench_logits(cfg, flats, ids)
    base = AutoModelForCausalLM.from_pretrained(copy / "base")
    assert torch.equal(hf_logits(PeftModel.from_pretrained(base, copy), ids), want)
    monkeypatch.chdir(copy)  # peft reads the base's name from the working directory
    assert torch.equal(hf_logits(AutoPeftModelForCausalLM.from_pretrained("."), ids), want)
    tok = AutoTokenizer.from_pretrained(copy)
    assert tok.model_max_length == 512 and tok.pad_token_id == 0


def test_base_names_are_hub_ids_where_the_hub_holds_the_weights():
    snapshot = ("/home/u/.cache/huggingface/hub/models--org--name/snapshots/"
                + "0123456789abcdef" * 2 + "01234567")
    ref = base_ref(snapshot, Path(snapshot))
    assert (ref.name, ref.revision, ref.hub_id, ref.beside) == (
        "org--name".replace("--", "/"), "0123456789abcdef" * 2 + "01234567", "org/name", False)
    assert base_ref("org/name", None).name == "org/name"
    smol = base_ref("smollm2-135m", Path("/home/u/.cache/zo-workbench/smollm2-135m"))
    assert (smol.name, smol.hub_id, smol.beside) == (
        "base", "HuggingFaceTB/SmolLM2-135M-Instruct", True)
    assert "dequantized" in smol.trained_on and "/home" not in smol.trained_on
    assert base_ref("/data/models/mine", Path("/data/models/mine")).name == "base"
    assert [portable(p) for p in ("/a/b/run-1", "~/runs/r", "file:/d/x.jsonl", "hf:a/b",
                                  "synthetic")] == ["run-1", "r", "file:x.jsonl", "hf:a/b",
                                                    "synthetic"]
