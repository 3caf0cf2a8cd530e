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

from workbench.config import ZO_METHODS
from workbench.export.base_ref import BASE_FOLDER, portable

#: Settings shown in the card: those that shape the trajectory (others only change speed).
SETTINGS = ("lr", "eps", "queries", "estimator", "directions", "zo_optimizer", "momentum",
            "hessian_smooth", "adam_beta1", "adam_beta2", "adam_eps", "weight_decay", "batch_size",
            "seq_len", "seed", "train_samples", "amp", "codec", "master", "peft", "lora_rank",
            "lora_alpha", "lora_targets", "base_codec", "template", "label_words",
            "max_new_tokens")
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
    ("model", "adapter" or "merged"), base (what the adapter loads on), base_model (the Hub
    repository the base is or descends from, or None), base_beside (the base is in ``base/``),
    trained_on (which weights the run trained on), dtype, run_dir (its name only)."""
    cfg = info["config"]
    model, kind = cfg.get("model", "?"), info["kind"]
    shown = portable(model)  # a local folder by its name: the card travels, the path does not
    data = portable(str(cfg.get("data", "")))
    lines = ["---", *(f"{k}: {json.dumps(v)}" for k, v in _front(info, cfg, kind).items()),
             "---", "",
             f"# {shown} fine-tuned with zo-workbench ({cfg.get('method', '?')})", "",
             _what(kind, info), "", "| | |", "|---|---|",
             f"| base model | `{shown}`: {info.get('trained_on') or 'see its card'} |",
             f"| method | {METHODS.get(cfg.get('method'), cfg.get('method'))} |",
             f"| objective | {cfg.get('objective', 'classify')} |",
             f"| data | `{data}`" + (f" ({cfg['train_samples']} training examples)"
                                    if cfg.get("train_samples") else "") + " |",
             f"| steps | {info['step']} of the run's {info['run_steps']} (run {info['status']}"
             + (f": {info['error']}" if info.get("error") else "") + ") |",
             f"| weights from | `{info['origin']}` of the run `{portable(info['run_dir'])}` |",
             f"| dtype | {info['dtype']} |",
             _digest_row(info)]
    if info.get("base_digest"):
        lines.append(f"| base_digest | `{info['base_digest']}` |")
    lines += ["", "## Dev metrics", "", *_metrics(info["evals"], info["step"]), "",
              "## Settings", "", "| setting | value |", "|---|---|",
              *(f"| {k} | `{portable(cfg[k]) if isinstance(cfg[k], str) else cfg[k]}` |"
                for k in SETTINGS if k in cfg and _matters(k, cfg)),
              "", "## Load it", "", "```python", *_load(kind, info), "```", ""]
    return "\n".join(lines)


def _front(info: dict, cfg: dict, kind: str) -> dict[str, Any]:
    """The YAML front matter the Hub reads: library, task, tags, license, base model and its
    relation, data set, and the exported step's dev metrics as a model-index."""
    front: dict[str, Any] = {
        "library_name": "peft" if kind == "adapter" else "transformers",
        "pipeline_tag": "text-generation",
        "tags": ["zo-workbench", cfg.get("method", "?")]
        + (["zeroth-order"] if cfg.get("method") in ZO_METHODS else [])
        + (["lora"] if cfg.get("peft") == "lora" else [])}
    license_ = _license(cfg.get("model", ""), info)
    if license_:
        front["license"] = license_
    if info.get("base_model"):
        front["base_model"] = info["base_model"]
        # the Hub's words: a LoRA adapter, or weights trained from the base (merged too)
        front["base_model_relation"] = "adapter" if kind == "adapter" else "finetune"
    data = str(cfg.get("data", ""))
    if data.startswith("hf:"):
        front["datasets"] = [data[3:].split(":")[0]]
    index = _model_index(info, cfg, front.get("datasets"))
    if index:
        front["model-index"] = index
    return front


def _license(model: str, info: dict) -> str | None:
    """apache-2.0 for presets (SmolLM2's GGUF is Apache-2.0, random weights are made by the
    Apache-2.0 workbench); a Hub or local base's own license is its card's, not known here."""
    from workbench.presets import lookup

    return "apache-2.0" if lookup(model) is not None else info.get("license")


def _model_index(info: dict, cfg: dict, datasets: list[str] | None) -> list[dict]:
    """The exported step's dev metrics, as the Hub's model-index (empty without an eval at
    that step)."""
    at = [e for e in info.get("evals") or [] if e["step"] == info["step"]]
    if not at:
        return []
    metrics = at[0].get("metrics") or {"loss": at[0].get("loss")}
    data = portable(str(cfg.get("data", "")))
    classify = cfg.get("objective", "classify") == "classify"
    return [{"name": f"{portable(cfg.get('model', '?'))}-zo-workbench",
             "results": [{"task": {"type": "text-classification" if classify
                                   else "text-generation"},
                          "dataset": {"name": data, "type": (datasets or [data])[0],
                                      "split": "dev"},
                          "metrics": [{"type": k, "value": float(v), "name": f"dev {k}"}
                                      for k, v in sorted(metrics.items())
                                      if isinstance(v, (int, float))]}]}]


def _what(kind: str, info: dict) -> str:
    if kind == "adapter":
        on = f"the base in `{BASE_FOLDER}/`, exported with it" if info.get("base_beside") \
            else f"`{info['base']}`" + (f" at revision `{info['base_revision']}`"
                                        if info.get("base_revision") else "")
        return (f"A LoRA adapter (rank {info['config'].get('lora_rank')}) for {on}: "
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
    if kind == "adapter" and info.get("base_beside"):
        return ["from peft import PeftModel",
                "from transformers import AutoModelForCausalLM, AutoTokenizer",
                "folder = \"PATH/TO/THIS/FOLDER\"",
                f"# the base the run trained on is in {BASE_FOLDER}/ (no Hub repository holds "
                "it); inside this folder,",
                "# peft.AutoPeftModelForCausalLM.from_pretrained(\".\") loads both",
                f"base = AutoModelForCausalLM.from_pretrained(f\"{{folder}}/{BASE_FOLDER}\")",
                "model = PeftModel.from_pretrained(base, folder)",
                "tokenizer = AutoTokenizer.from_pretrained(folder)"]
    if kind == "adapter":
        return ["from peft import AutoPeftModelForCausalLM",
                "from transformers import AutoTokenizer",
                "model = AutoPeftModelForCausalLM.from_pretrained(\"PATH/TO/THIS/FOLDER\")"
                f"  # base: {info['base']}",
                "tokenizer = AutoTokenizer.from_pretrained(\"PATH/TO/THIS/FOLDER\")"]
    return ["from transformers import AutoModelForCausalLM, AutoTokenizer",
            "model = AutoModelForCausalLM.from_pretrained(\"PATH/TO/THIS/FOLDER\")",
            "tokenizer = AutoTokenizer.from_pretrained(\"PATH/TO/THIS/FOLDER\")"]
