"""Shared fixtures. GPU tests are marked ``gpu`` and skipped without CUDA."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from workbench.config import default_data_dir


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def data_dir():
    from pathlib import Path

    path = Path(default_data_dir())
    if not (path / "sst2" / "train.tsv").is_file():
        pytest.skip(f"shared data not found at {path} (set WORKBENCH_DATA_DIR)")
    return path


@pytest.fixture(scope="session")
def tiny_model():
    """A factory: ``tiny_model(preset, **overrides)`` -> a resident Hugging Face model of a tiny
    preset with seeded random weights (cached per arguments; treat it as read-only)."""
    from dataclasses import replace

    from transformers import AutoModelForCausalLM

    from workbench.models.build import hf_config
    from workbench.presets import PRESETS

    cache = {}

    def make(name: str, **overrides):
        key = (name, tuple(sorted(overrides.items())))
        if key not in cache:
            torch.manual_seed(0)
            config = hf_config(replace(PRESETS[name], **overrides))
            config._attn_implementation = "sdpa"
            cache[key] = AutoModelForCausalLM.from_config(config).eval()
        return cache[key]

    return make


@pytest.fixture
def one_thread():
    """Torch on one thread for the test: the 64-wide tiny models run fastest so, even on a
    busy 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def hf_greedy():
    """A function: ``hf_greedy(model, prompts, max_new_tokens, eos)`` -> each prompt's new tokens
    from the Hugging Face model's own ``generate`` (greedy, the batch left-padded as it expects,
    each row cut after its EOS): the reference our KV-free decoding must equal."""

    def generate(model, prompts: list[list[int]], max_new_tokens: int, eos: int):
        width = max(map(len, prompts))
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, p in enumerate(prompts):
            ids[r, width - len(p):], mask[r, width - len(p):] = torch.tensor(p), 1
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                 do_sample=False, pad_token_id=0, eos_token_id=eos)
        rows = [out[r, width:].tolist() for r in range(len(prompts))]
        return [row[:row.index(eos) + 1] if eos in row else row for row in rows]

    return generate


@pytest.fixture(scope="session")
def load_benchmark():
    """Loads ``benchmarks/NAME.py`` (not a package) as module ``NAME_bench`` for its tests, with
    its folder on ``sys.path`` for the script's own imports (``common``, ``fresh``)."""
    folder = Path(__file__).resolve().parent.parent / "benchmarks"
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

    def load(script: Path):
        spec = importlib.util.spec_from_file_location(f"{script.stem}_bench", script)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load
