"""benchmarks/templates.py: every row is a prompt the classify objective accepts (the chat row
in SmolLM2-Instruct's own chat format), the best row is one of them, and the script scores
the rows through the evaluate recipe (a tiny plumbing run); an unknown row is refused."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from workbench.config import RunConfig

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "templates.py"


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark(SCRIPT)


def test_every_row_is_a_classify_prompt_and_the_best_is_a_row(bench):
    for template, words in bench.TEMPLATES.values():
        RunConfig(template=template, label_words=words)  # raises ConfigError if not
    assert bench.BEST in bench.TEMPLATES
    chat, _ = bench.TEMPLATES["chat"]
    # the tokenizer's chat_template with add_generation_prompt: system, user turn, assistant
    assert chat.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert chat.endswith("{text}<|im_end|>\n<|im_start|>assistant\n")


def test_rows_are_scored_through_the_evaluate_recipe(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--model", "tiny-opt", "--data",
                        "embedded", "--rows", "mezo,review", "--examples", "8"],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "mezo: accuracy" in r.stdout and "review: accuracy" in r.stdout
    assert "on 8 dev examples; saved nothing (a plumbing run)" in r.stdout
    r = subprocess.run([sys.executable, str(SCRIPT), "--rows", "mezo,nope"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and "--rows: nope unknown" in r.stderr
