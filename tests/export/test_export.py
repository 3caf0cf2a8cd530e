"""Export -> transformers: the folder loads with no missing or unexpected key, and its logits on
a fixed batch equal the workbench's own forward of the run's final weights: bit for bit in fp32,
and in bf16 bit for bit against the same forward of the weights rounded to bf16. A fast set of
(model, method, formats) runs in CI; the whole grid is marked slow."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from export_helpers import SHORT, batch, hf_logits, train_live, workbench_greedy, workbench_logits
from workbench.config import RunConfig
from workbench.export.exporter import export_run

ZO_OFFLOAD = [{"codec": "fp32"}, {"codec": "bf16"}, {"codec": "bf16", "master": "compressed-sr"},
              {"codec": "fp16", "master": "compressed-sr"}, {"codec": "fp8-e4m3"},
              {"codec": "fp8-e5m2"}, {"resident_blocks": 2}]
METHODS = ([("mezo", {})] + [("zo-offload", kw) for kw in ZO_OFFLOAD]
           + [("forward-grad", {}), ("fo", {}), ("fo-offload", {})])
CI = [("tiny-opt", "mezo", {}),
      ("tiny-llama", "zo-offload", {"codec": "bf16", "master": "compressed-sr"}),
      ("tiny-opt", "zo-offload", {"codec": "fp8-e4m3"}),
      ("tiny-llama", "fo-offload", {})]
FULL = [(m, method, kw) for m in ("tiny-opt", "tiny-llama") for method, kw in METHODS
        if (m, method, kw) not in CI]


def _id(case) -> str:
    model, method, kw = case
    return "-".join([model, method, *(f"{k}={v}" for k, v in kw.items())])


def check_round_trip(tmp_path, model: str, method: str, kw: dict) -> None:
    cfg = RunConfig(model=model, method=method, **SHORT, **kw)
    rec, flats = train_live(cfg, tmp_path / "run")
    assert rec.status == "done" and (tmp_path / "run" / "weights").is_dir()
    ids = batch()

    res = export_run(tmp_path / "run", tmp_path / "fp32", dtype="fp32")
    assert res.kind == "model" and res.step == 3 and res.origin == "weights"
    assert res.digest == rec.param_digest and res.matches_run is True
    hf, info = AutoModelForCausalLM.from_pretrained(tmp_path / "fp32", output_loading_info=True)
    assert info == {"missing_keys": set(), "unexpected_keys": set(), "mismatched_keys": set(),
                    "error_msgs": []}
    assert hf.dtype == torch.float32
    assert torch.equal(hf_logits(hf, ids), workbench_logits(cfg, flats, ids))
    with safe_open(str(tmp_path / "fp32" / "model.safetensors"), "pt") as fh:
        keys = set(fh.keys())
    tied = hf.config.tie_word_embeddings
    assert ("lm_head.weight" in keys) == (not tied)  # a tied head is written once, as the embedding
    assert keys == set(hf.state_dict()) - ({"lm_head.weight"} if tied else set())
    # generation: the folder's tokenizer and generation config, transformers' own generate
    tok = AutoTokenizer.from_pretrained(tmp_path / "fp32")
    gen = hf.generation_config
    assert (gen.bos_token_id, gen.eos_token_id, gen.pad_token_id) == (
        tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 0)
    prompt = tok("The movie was great. It was")["input_ids"]
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)
    assert out[0, len(prompt):].tolist() == workbench_greedy(cfg, flats, prompt, 6, 2, 0)

    export_run(tmp_path / "run", tmp_path / "bf16", dtype="bf16")
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "bf16").dtype == torch.bfloat16
    up = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", dtype=torch.float32)  # exact
    assert torch.equal(hf_logits(up, ids), workbench_logits(cfg, flats, ids, torch.bfloat16))


@pytest.mark.parametrize("case", CI, ids=_id)
def test_export_loads_in_transformers_with_the_workbench_logits(tmp_path, one_thread, case):
    check_round_trip(tmp_path, *case)


@pytest.mark.slow
@pytest.mark.parametrize("case", FULL, ids=_id)
def test_export_round_trip_every_method_and_format(tmp_path, one_thread, case):
    check_round_trip(tmp_path, *case)


def test_the_check_sees_a_wrong_weight(tmp_path, one_thread):
    """The comparison above can fail: one changed weight changes the logits."""
    cfg = RunConfig(model="tiny-opt", method="mezo", **SHORT)
    _, flats = train_live(cfg, tmp_path / "run")
    export_run(tmp_path / "run", tmp_path / "out")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    flats[1][0] += 1e-3
    ids = batch()
    assert not torch.equal(hf_logits(hf, ids), workbench_logits(cfg, flats, ids))
