"""The task's checks, made without reading the data or loading the model: the data source's
shape, the objective's settings (template, label words, field names), and the model named
(a preset, ``tiny:<model_type>``, a local Hugging Face folder or a hub id) with its
positions."""
from __future__ import annotations

import json
import re
import string
from pathlib import Path

from workbench.config.kinds import default_of
from workbench.config.knobs import Knobs

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # org/name; paths start with / . or ~
DATA_SUFFIXES = (".jsonl", ".csv", ".tsv", ".parquet")
TASK_FIELDS = {"classify": ("text_field", "label_field", "template", "label_words"),
               "completion": ("prompt_field", "completion_field"), "lm": ("text_field",)}


def split_words(text: str) -> list[str]:
    """The one rule for word lists (``label_words``): split at each comma and nothing else;
    every other character, spaces included, is part of a word, whether the value came from
    TOML or ``--set``: ``" bad, fine"`` -> ``[" bad", " fine"]``."""
    return text.split(",")


def check_task(cfg: Knobs) -> list[str]:
    """The data source's shape (files are read later) and the objective's settings."""
    problems, data = [], cfg.data
    path = Path(data).expanduser()
    if not data.strip():
        problems.append(f"data: {data!r} is empty; give embedded, sst2, synthetic, "
                        "hf:NAME[:CONFIG], a file or a folder (. for this one)")
    elif data in ("embedded", "sst2", "synthetic") or data.startswith("hf:") and len(data) > 3:
        pass
    elif path.is_file():
        if path.suffix.lower() not in DATA_SUFFIXES:
            problems.append(f"data: {data!r} is not a {'/'.join(DATA_SUFFIXES)} file")
    elif not path.is_dir():
        problems.append(f"data: {data!r} is not embedded, sst2, synthetic, hf:NAME[:CONFIG], a "
                        "file or a folder")
    if data == "sst2" and cfg.objective != "classify":
        problems.append(f"data: sst2 is a classify data set; objective={cfg.objective} needs "
                        "another source")
    words = split_words(cfg.label_words)
    if len(words) < 2 or any(not w.strip() for w in words):
        problems.append(f"label_words: {cfg.label_words!r} needs k >= 2 non-blank words, split "
                        "at each comma (spaces are part of a word: ' bad, great' is ' bad' and "
                        "' great')")
    elif len(set(words)) < len(words):
        twice = next(w for w in words if words.count(w) > 1)
        problems.append(f"label_words: {cfg.label_words!r} repeats a word ({twice!r})")
    elif len(cfg.label_words) > 1 and cfg.label_words[0] == cfg.label_words[-1] in "\"'":
        # TOML's quotes pasted inside a shell's: the words would begin and end with them
        problems.append(f"label_words: {cfg.label_words!r} is wrapped in quotes, which would "
                        "be part of the first and last word; a value is taken exactly as typed "
                        "(the shell has removed its own quotes): leave these out")
    try:
        names = {n for _, n, _, _ in string.Formatter().parse(cfg.template) if n is not None}
    except ValueError as e:
        names = {f"<{e}>"}
    if names != {"text"}:
        problems.append(f"template: {cfg.template!r} must contain {{text}} and no other "
                        "{placeholder} (write {{ }} for a literal brace)")
    for name in ("text_field", "label_field", "prompt_field", "completion_field", "template",
                 "label_words"):
        if name not in TASK_FIELDS[cfg.objective] and getattr(cfg, name) != default_of(cfg, name):
            problems.append(f"{name}: does not apply to objective={cfg.objective} (it applies to "
                            f"{', '.join(o for o, f in TASK_FIELDS.items() if name in f)})")
    return problems


def model_positions(cfg: Knobs) -> int | None:
    """The model's positions, where known without loading it (a preset, a local folder)."""
    from workbench.presets import lookup

    if (preset := lookup(cfg.model)) is not None:
        return preset.max_positions
    try:
        conf = json.loads((Path(cfg.model).expanduser() / "config.json").read_text("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    found = conf.get("max_position_embeddings") if isinstance(conf, dict) else None
    return found if isinstance(found, int) else None


def tiny_problems(cfg: Knobs) -> list[str]:
    """``tiny:<model_type>`` names a causal LM of the installed transformers and fits its
    positions; whether the block adapter splits it is checked when the run builds it
    (``models.build.check_model_folder``)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from workbench.presets import TINY

    kind = cfg.model.split(":", 1)[1]
    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return [f"model: {kind!r} is not a causal-LM model_type of the installed transformers "
                "(see transformers' MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)"]
    if cfg.seq_len > TINY["max_positions"]:
        return [f"seq_len: {cfg.seq_len} exceeds the {TINY['max_positions']} positions of "
                f"{cfg.model}"]
    return []


def model_folder_problems(cfg: Knobs) -> list[str]:
    """A local model folder: a readable config.json, no custom code, weights, enough positions."""
    folder = Path(cfg.model).expanduser()
    try:
        conf = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return [f"model: {cfg.model!r} has no config.json: not a Hugging Face model folder"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return [f"model: {folder / 'config.json'} is not readable JSON ({e})"]
    if not isinstance(conf, dict):
        return [f"model: {folder / 'config.json'} is not a JSON object"]
    problems = []
    if "auto_map" in conf:
        problems.append(f"model: {cfg.model!r} needs its own Python code (auto_map in "
                        "config.json); local models load with trust_remote_code=False")
    if not any(folder.glob("*.safetensors")):
        problems.append(f"model: {cfg.model!r} holds no *.safetensors weights")
    positions = conf.get("max_position_embeddings")
    if isinstance(positions, int) and cfg.seq_len > positions:
        problems.append(f"seq_len: {cfg.seq_len} exceeds the {positions} positions of "
                        f"{cfg.model}")
    return problems
