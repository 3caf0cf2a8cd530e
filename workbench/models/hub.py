"""A model setting that is a hub id (``org/name``) -> a local folder, through ``huggingface_hub``.

Online, the config, tokenizer files and ``*.safetensors`` weights are downloaded into the Hugging
Face cache (pickled ``*.bin`` weights are never fetched nor loaded); offline (``HF_HUB_OFFLINE=1``)
the cached copy is used, and a model that is not cached is refused in one line. Everything after
this works on the folder, as with a local one, and never runs code from it
(``trust_remote_code=False``).
"""
from __future__ import annotations

import os
from pathlib import Path

from workbench.config import HUB_ID, ConfigError

#: Files a causal LM needs: config, weights, tokenizer (never pickles or other frameworks).
PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken"]


def offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` asks the Hugging Face libraries to stay off the network."""
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def model_folder(model: str) -> Path:
    """A local folder for ``model``: the folder itself, or a hub id's cached snapshot.

    Raises:
        ConfigError: one line when the id cannot be resolved (offline and not cached, unknown,
            no network) or is not a transformers model.
    """
    path = Path(model).expanduser()
    if path.is_dir() or not HUB_ID.fullmatch(model):
        return path
    from huggingface_hub import snapshot_download

    folder = Path(_fetch(model, lambda: snapshot_download(model, allow_patterns=PATTERNS,
                                                          local_files_only=offline())))
    if not (folder / "config.json").is_file():
        raise ConfigError([f"model: {model} has no config.json (not a transformers model)"])
    return folder


def config_path(model: str) -> Path:
    """``config.json`` of a local folder or a hub id (only that file is fetched: the planner's
    needs)."""
    path = Path(model).expanduser()
    if path.is_dir() or not HUB_ID.fullmatch(model):
        return path / "config.json"
    from huggingface_hub import hf_hub_download

    return Path(_fetch(model, lambda: hf_hub_download(model, "config.json",
                                                      local_files_only=offline())))


def _fetch(model: str, call):
    try:
        return call()
    except Exception as e:  # the hub client raises many types; its first line says which
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if offline():
            raise ConfigError([f"model: {model} is not in the local Hugging Face cache and "
                               "HF_HUB_OFFLINE is set; run once online to cache it"]) from None
        raise ConfigError([f"model: cannot fetch {model} from the Hugging Face hub "
                           f"({type(e).__name__}: {first})"]) from None


def check_weights(model: str, folder: Path) -> None:
    """Refuse a model folder without safetensors weights, in one line."""
    if not any(folder.glob("*.safetensors")):
        raise ConfigError([f"model: {model} has no *.safetensors weights in {folder} (pickled "
                           "*.bin weights are not loaded; convert them to safetensors)"])


def load_config(model: str, folder: Path):
    """The model's ``transformers`` config, refusing architectures that need custom code."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(folder, trust_remote_code=False)
    except ValueError as e:
        if "trust_remote_code" in str(e) or "custom code" in str(e):
            raise ConfigError([f"model: {model} needs custom code from its folder, which the "
                               "workbench does not run (trust_remote_code=False)"]) from None
        raise ConfigError([f"model: {model}: {str(e).splitlines()[0]}"]) from None
