"""A model folder's safetensors files checked against the model its config.json describes,
from their headers alone (no weight is read): a file cut short (a copy or download that
stopped) and a tensor whose shape the config does not give (an edited ``vocab_size``) are
refused in one line before anything is built, rather than failing deep inside the build."""
from __future__ import annotations

import json
import struct
from pathlib import Path

from torch import nn

from workbench.config import ConfigError

#: safetensors dtype names -> bytes per element
ELEMENT_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
                 "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def header(path: Path) -> dict:
    """The JSON header of a safetensors file, checked to describe data the file holds whole.

    Raises:
        ConfigError: the file is shorter than its header says, or its header is unreadable.
    """
    size = path.stat().st_size
    try:
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if 8 + n > size:
                raise ValueError(f"its header needs {8 + n} bytes, the file has {size}")
            entries = json.loads(fh.read(n))
        end = max((e["data_offsets"][1] for k, e in entries.items() if k != "__metadata__"),
                  default=0)
    except (struct.error, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError([f"model: {path} is not a readable safetensors file ({e}); copy or "
                           "download it again"]) from None
    if 8 + n + end > size:
        raise ConfigError([f"model: {path} is cut short ({size} of {8 + n + end} bytes); copy "
                           "or download it again"])
    return {k: e for k, e in entries.items() if k != "__metadata__"}


def check_weights_files(skeleton: nn.Module, folder: Path) -> None:
    """Every parameter of ``skeleton`` (built from the folder's config, on the meta device)
    stored in the folder's safetensors files has the shape the config gives it (a tied LM head
    may be stored as the embedding only); every file is whole.

    Raises:
        ConfigError: one line naming the file or the weight and both shapes.
    """
    shapes: dict[str, tuple[list[int], Path]] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        shapes.update((k, (e["shape"], f)) for k, e in header(f).items())
    if not shapes:
        return  # no weights: ``PretrainedWeights`` says so in its own words
    for name, p in skeleton.named_parameters():
        key = name if name in shapes else _tied(name, shapes)
        if key is None:
            continue  # not stored under this name: the build says so if it needs it
        stored, f = shapes[key]
        if list(stored) != list(p.shape):
            raise ConfigError([f"model: {f.name} holds {key} as {tuple(stored)} but config.json "
                               f"makes it {tuple(p.shape)}; the config and the weights of "
                               f"{folder} disagree (an edited config.json?)"])


def _tied(name: str, shapes: dict) -> str | None:
    if name == "lm_head.weight":
        return next((k for k in shapes if k.endswith("embed_tokens.weight")), None)
    return None
