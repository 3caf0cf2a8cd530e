"""The model card (``README.md``) of an exported folder, in the form the Hugging Face Hub shows.

YAML front matter (``library_name``, ``pipeline_tag``, ``tags``, ``base_model`` when the base
is a Hub id, ``datasets`` for a Hub data set), then what a reader needs to trust and reuse the
weights: the base model, the method, objective and data, the steps behind these weights and
how the run ended, the dev metrics at the start and at the exported step, the settings that
shaped the result, the digests that identify the weights, and how to load them.
"""
from __future__ import annotations

import json
from typing import Any

from workbench.config import HUB_ID, ZO_METHODS

#: Settings shown in the card: those that shape the trajectory (others only change speed).
SETTINGS = ("lr", "eps", "queries", "estimator", "directions", "zo_optimizer", "momentum",
            "hessian_smooth", "adam_beta1", "adam_beta2", "adam_eps", "weight_decay", "batch_size",
            "seq_len", "seed", "train_samples", "amp", "codec", "master", "peft", "lora_rank",
            "lora_alpha", "lora_targets", "base_codec", "template", "label_words",
            "max_new_tokens")
#: Presets with real weights, and the Hub model they are (random-init presets have none).
HUB_BASES = {"smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}
METHODS = {
    "mezo": "MeZO (zeroth-order SPSA, two forward passes per step, whole model on the device)",
    "zo-offload": "ZO-offload (zeroth-order SPSA with the blocks streamed from host memory)",
    "forward-grad": "forward gradient (one forward-mode pass per step)",
    "fo": "first-order AdamW",
    "fo-offload": "first-order AdamW with optimizer states offloaded to the host",
}


def _digest_row(info: dict[str, Any]) -> str:
    """The weights' digest, and how it relates to the run's ``param_digest``: equal, the run's
    weights rounded to the folder's dtype, or other weights (a checkpoint's)."""
    written, source = info["weights_digest"], info.get("source_digest", info["weights_digest"])
    if written == info["param_digest"]:
        return f"| param_digest | `{written}` (the run's own) |"
    if source == info["param_digest"] and source != written:
        return (f"| weights digest | `{written}` (the run's fp32 weights, param_digest "
                f"`{source}`, rounded to {info['dtype']}) |")
    return (f"| param_digest | `{written}` (the run's final one: "
            f"`{info['param_digest'] or '-'}`) |")


def model_card(info: dict[str, Any]) -> str:
    """README.md text. ``info``: the export's facts (``exporter.py`` builds it): config,
    status, steps, run_steps, origin, evals, param_digest, weights_digest, base_digest, kind
    ("model", "adapter" or "merged"), base (what the adapter loads on), dtype, run_dir."""
    cfg = info["config"]
    model, kind = cfg.get("model", "?"), info["kind"]
    front = {"library_name": "peft" if kind == "adapter" else "transformers",
             "pipeline_tag": "text-generation",
             "tags": ["zo-workbench", cfg.get("method", "?")]
             + (["zeroth-order"] if cfg.get("method") in ZO_METHODS else [])
             + (["lora"] if cfg.get("peft") == "lora" else [])}
    if HUB_ID.fullmatch(str(model)) and not str(model).startswith((".", "/", "~")):
        front["base_model"] = model
    elif model in HUB_BASES:
        front["base_model"] = HUB_BASES[model]
    data = str(cfg.get("data", ""))
    if data.startswith("hf:"):
        front["datasets"] = [data[3:].split(":")[0]]
    lines = ["---", *(f"{k}: {json.dumps(v)}" for k, v in front.items()), "---", "",
             f"# {model} fine-tuned with zo-workbench ({cfg.get('method', '?')})", "",
             _what(kind, info), "", "| | |", "|---|---|",
             f"| base model | `{model}` |",
             f"| method | {METHODS.get(cfg.get('method'), cfg.get('method'))} |",
             f"| objective | {cfg.get('objective', 'classify')} |",
             f"| data | `{data}`" + (f" ({cfg['train_samples']} training examples)"
                                    if cfg.get("train_samples") else "") + " |",
             f"| steps | {info['step']} of the run's {info['run_steps']} (run {info['status']}"
             + (f": {info['error']}" if info.get("error") else "") + ") |",
             f"| weights from | `{info['origin']}` of `{info['run_dir']}` |",
             f"| dtype | {info['dtype']} |",
             _digest_row(info)]
    if info.get("base_digest"):
        lines.append(f"| base_digest | `{info['base_digest']}` |")
    lines += ["", "## Dev metrics", "", *_metrics(info["evals"], info["step"]), "",
              "## Settings", "", "| setting | value |", "|---|---|",
              *(f"| {k} | `{cfg[k]}` |" for k in SETTINGS if k in cfg and _matters(k, cfg)),
              "", "## Load it", "", "```python", *_load(kind, info), "```", ""]
    return "\n".join(lines)


def _what(kind: str, info: dict) -> str:
    if kind == "adapter":
        return (f"A LoRA adapter (rank {info['config'].get('lora_rank')}) for `{info['base']}`: "
                "load the base, then the adapter with peft.")
    if kind == "merged":
        return "The base model with the run's LoRA adapter merged into its weights."
    return "Every weight of the model, as the run left it."


def _metrics(evals: list[dict], step: int) -> list[str]:
    if not evals:
        return ["No dev evaluation was recorded."]
    start = evals[0]
    at = [e for e in evals if e["step"] == step]
    names = sorted(set(start.get("metrics") or {"loss": start["loss"]}))
    rows = ["| metric | step 0 | " + (f"step {step} |" if at else "exported step |"),
            "|---|---|---|"]
    for name in names:
        first = (start.get("metrics") or {}).get(name, start.get(name))
        last = (at[0].get("metrics") or {}).get(name, at[0].get(name)) if at else None
        rows.append(f"| {name} | {_num(first)} | {_num(last) if at else 'not evaluated'} |")
    if start["step"] != 0:
        rows[0] = rows[0].replace("step 0", f"step {start['step']}")
    return rows + [f"\nOver {start.get('examples', '?')} dev examples."]


def _num(v) -> str:
    return "-" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v)


def _matters(key: str, cfg: dict) -> bool:
    """A setting worth a row: LoRA's only with peft=lora, the transfer formats only when
    streamed, eps and the ZO rule (queries, estimator, zo_optimizer) only for the ZO methods
    that perturb, an optimizer's own knobs only where it runs."""
    if key in ("lora_rank", "lora_alpha", "lora_targets", "base_codec"):
        return cfg.get("peft") == "lora"
    if key in ("codec", "master"):
        return cfg.get("method") in ("zo-offload", "forward-grad")
    if key in ("eps", "queries", "estimator", "zo_optimizer"):
        return cfg.get("method") in ("mezo", "zo-offload")
    if key == "directions":  # shown where it is not MeZO's normals
        return cfg.get(key, "gaussian") != "gaussian"
    if key == "momentum":  # the ZO optimizers' own knobs, where their rule reads them
        return cfg.get("zo_optimizer") == "momentum"
    if key == "hessian_smooth":
        return cfg.get("zo_optimizer") == "hizoo"
    if key.startswith("adam_"):
        return cfg.get("zo_optimizer") == "adam" or cfg.get("method") in ("fo", "fo-offload")
    if key in ("template", "label_words"):
        return cfg.get("objective", "classify") == "classify"
    if key == "max_new_tokens":
        return cfg.get("objective") == "completion"
    if key == "train_samples":
        return bool(cfg.get(key))  # 0: every example
    return True


def _load(kind: str, info: dict) -> list[str]:
    if kind == "adapter":
        return ["from peft import PeftModel",
                "from transformers import AutoModelForCausalLM, AutoTokenizer",
                f"base = AutoModelForCausalLM.from_pretrained({info['base']!r})",
                "model = PeftModel.from_pretrained(base, \"PATH/TO/THIS/FOLDER\")",
                f"tokenizer = AutoTokenizer.from_pretrained({info['base']!r})"]
    return ["from transformers import AutoModelForCausalLM, AutoTokenizer",
            "model = AutoModelForCausalLM.from_pretrained(\"PATH/TO/THIS/FOLDER\")",
            "tokenizer = AutoTokenizer.from_pretrained(\"PATH/TO/THIS/FOLDER\")"]
