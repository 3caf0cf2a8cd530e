"""peft=lora runs: the adapter folder loads with peft on the base the run trained on and gives
the workbench's logits; ``--merge`` gives peft's own merge of that base and adapter. The base is
itself an exported folder (a short full-parameter run), so the LoRA run also fine-tunes an
export further (``model=DIR``)."""
from __future__ import annotations

import json

import pytest
import torch
from peft import PeftModel
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from export_helpers import SHORT, batch, hf_logits, train_live, workbench_logits
from workbench.config import RunConfig
from workbench.export.exporter import export_run
from workbench.export.source import ExportError


@pytest.fixture(scope="module")
def base_folder(tmp_path_factory):
    """tiny-llama after a short MeZO run, exported: a real model folder to put adapters on."""
    tmp = tmp_path_factory.mktemp("base")
    torch.set_num_threads(1)
    train_live(RunConfig(model="tiny-llama", method="mezo", **SHORT), tmp / "run")
    export_run(tmp / "run", tmp / "model")
    return tmp / "model"


def lora_run(tmp_path, base, method="mezo", **kw):
    cfg = RunConfig(model=str(base), method=method, peft="lora", lora_rank=4, lora_alpha=8.0,
                    **{**SHORT, "lr": 5e-2}, **kw)
    rec, flats = train_live(cfg, tmp_path / "run")
    assert rec.status == "done"
    return cfg, rec, flats


@pytest.mark.parametrize("method", ["mezo", "zo-offload"])
def test_adapter_folder_loads_with_peft_and_merge_equals_peft_merge(tmp_path, one_thread,
                                                                    base_folder, method):
    cfg, rec, flats = lora_run(tmp_path, base_folder, method)
    ids = batch()
    base = AutoModelForCausalLM.from_pretrained(base_folder)
    assert not torch.equal(hf_logits(base, ids), workbench_logits(cfg, flats, ids))  # trained
    res = export_run(tmp_path / "run", tmp_path / "adapter")
    assert res.kind == "adapter" and res.matches_run is True
    names = {p.name for p in (tmp_path / "adapter").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md"} <= names
    conf = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (conf["r"], conf["lora_alpha"], sorted(conf["target_modules"])) == (
        4, 8.0, ["q_proj", "v_proj"])
    # a local folder no Hub repository holds: exported beside the adapter, named relatively
    assert conf["base_model_name_or_path"] == "base"
    assert (tmp_path / "adapter" / "base" / "model.safetensors").is_file()
    with safe_open(str(tmp_path / "adapter" / "adapter_model.safetensors"), "pt") as fh:
        assert all(k.startswith("base_model.model.") and ".default." not in k for k in fh.keys())

    peft_model = PeftModel.from_pretrained(base, tmp_path / "adapter")
    assert torch.equal(hf_logits(peft_model, ids), workbench_logits(cfg, flats, ids))

    res = export_run(tmp_path / "run", tmp_path / "merged", merge=True)
    assert res.kind == "merged" and res.matches_run is True
    merged, info = AutoModelForCausalLM.from_pretrained(tmp_path / "merged",
                                                        output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    reference = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_folder),
                                          tmp_path / "adapter").merge_and_unload()
    want = reference.state_dict()
    assert all(torch.equal(v, want[k]) for k, v in merged.state_dict().items())
    assert torch.equal(hf_logits(merged, ids), hf_logits(reference, ids))
    # folded in, the adapter computes what the workbench's unmerged forward does (to rounding)
    torch.testing.assert_close(hf_logits(merged, ids), workbench_logits(cfg, flats, ids),
                               rtol=1e-5, atol=1e-5)


def test_merge_is_refused_for_a_full_parameter_run(tmp_path, one_thread):
    train_live(RunConfig(model="tiny-opt", method="mezo", **SHORT), tmp_path / "run")
    with pytest.raises(ExportError, match="--merge: only a peft=lora run"):
        export_run(tmp_path / "run", tmp_path / "out", merge=True)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_merge_of_a_compressed_base_computes_what_the_run_did(tmp_path, one_thread):
    """base_codec=int8: the run computed with the decoded base; the merged model is that base
    plus the adapter (``base_digest`` checked), not the fp32 folder's weights."""
    cfg = RunConfig(model="tiny-opt", method="mezo", peft="lora", base_codec="int8", **SHORT)
    rec, flats = train_live(cfg, tmp_path / "run")
    export_run(tmp_path / "run", tmp_path / "merged", merge=True)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    ids = batch()
    torch.testing.assert_close(hf_logits(merged, ids), workbench_logits(cfg, flats, ids),
                               rtol=1e-5, atol=1e-5)
