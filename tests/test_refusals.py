"""Bad input a user meets through the CLI, refused before any work in one line (exit 2), or
planned and read as the README says: a JSONL text holding a lone surrogate, a model folder of a
type with no causal LM, a sweep grid with an invalid value, the real ranges of the betas and
epsilon, ``plan --suggest`` on the largest Llama, and a large file's rows tokenised only as the
run draws them."""
import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def one_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_a_lone_surrogate_is_refused_in_the_data_check(tmp_path):
    data = tmp_path / "train.jsonl"
    rows = [{"text": f"row {i}", "label": i % 2} for i in range(8)]
    text = "\n".join(json.dumps(r) for r in rows).replace('"row 3"', '"row \\ud800 3"')
    data.write_text(text + "\n")
    out = tmp_path / "run"
    line = one_line(cli("run", "--set", f"data={data}", "--set", "steps=2", "--out", str(out)))
    assert line == (f"error: data: {data} line 4: field 'text' holds a lone UTF-16 surrogate "
                    "(a \\ud800-\\udfff escape without its pair), which is not text: write the "
                    "character whole or drop it")
    assert not out.exists()
    data.write_text(text.replace("\\ud800", "\\ud83d\\ude00") + "\n")  # a whole pair is text
    r = cli("validate", "--set", f"data={data}")
    assert r.returncode == 0, r.stderr


def test_a_model_folder_of_a_type_without_a_causal_lm_is_refused(tmp_path):
    from transformers import T5Config, T5ForConditionalGeneration

    folder = tmp_path / "t5"
    T5ForConditionalGeneration(T5Config(vocab_size=260, d_model=16, d_kv=4, d_ff=32, num_layers=1,
                                        num_heads=4)).save_pretrained(folder)
    out = tmp_path / "run"
    line = one_line(cli("run", "--set", f"model={folder}", "--set", "steps=2", "--out", str(out)))
    assert line.startswith(f"error: model: {folder} is a 't5' model, which has no causal LM in "
                           "transformers; the supported types are ")
    assert ", llama, " in line and ", opt, " in line and "t5" not in line.split("types are")[1]
    assert not out.exists()


def test_a_sweep_grid_with_invalid_values_is_refused_before_any_point_runs(tmp_path):
    out = tmp_path / "sweep"
    r = cli("sweep", "--sweep", "queries=1,0,2", "--sweep", "lr=1e-3,-1", "--set", "steps=1",
            "--out", str(out))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.strip().splitlines() == ["error: --sweep queries: 0 is outside [1, 64]",
                                             "error: --sweep lr: -1.0 is outside [0, 10]"]
    assert not out.exists() and "run(s) of" not in r.stdout
    one_line(cli("validate", "--set", "queries=0"))  # as --set says it


@pytest.mark.parametrize("setting, said", [
    ("adam_beta2=1", "adam_beta2: 1.0 is outside [0, 1)"),
    ("adam_beta1=1", "adam_beta1: 1.0 is outside [0, 1)"),
    ("adam_eps=0", "adam_eps: 0.0 is outside (0, 1]"),
])
def test_the_betas_and_epsilon_are_refused_with_their_real_range(setting, said):
    assert one_line(cli("validate", "--set", "method=fo", "--set", setting)) == f"error: {said}"


def test_the_betas_just_below_one_and_a_tiny_epsilon_pass():
    r = cli("validate", "--set", "method=fo", "--set", "adam_beta2=0.9999999", "--set",
            "adam_eps=1e-30")
    assert r.returncode == 0, r.stderr


def test_suggest_finds_the_readme_setting_of_llama_405b():
    """The README plans llama-3.1-405b (bf16 compressed-sr, compute slots, streamed embedding
    and head, 2 slots) at 18.4 GiB under a 24 GB cap: ``--suggest 24`` finds it."""
    r = cli("plan", "--set", "model=llama-3.1-405b", "--set", "amp=bf16", "--gpu", "h100",
            "--suggest", "24", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    want = [x for x in rows if (x["codec"], x["master"], x["stream_embeddings"],
                                x["block_slots"], x["resident_blocks"])
            == ("bf16", "compressed-sr", True, 2, 0)]
    assert len(want) == 1 and round(want[0]["peak_gpu_mem_bytes"] / 2**30, 1) == 18.4
    assert all(x["nvml_gpu_mem_bytes"] <= 24 * 2**30 for x in rows)
    text = cli("plan", "--set", "model=llama-3.1-405b", "--set", "amp=bf16", "--gpu", "h100",
               "--suggest", "24").stdout
    # its row (codecs predicted alike share it: bf16/fp16)
    assert re.search(r"^bf16(/fp16)?\s+compressed-sr\s+0 streamed\s+2\s", text, re.M), text


COUNTED = """
import sys
from workbench.models.tokenizer import ByteTokenizer
calls = [0]
encode = ByteTokenizer.encode
def counted(self, text, *a, **k):
    calls[0] += 1
    return encode(self, text, *a, **k)
ByteTokenizer.encode = counted
from workbench.cli import main
code = main(sys.argv[1:])
print("encoded", calls[0])
raise SystemExit(code)
"""


def test_a_short_run_tokenises_only_the_rows_it_draws(tmp_path):
    """20,000 rows, 2 steps of 4 and 8 dev examples: the run tokenises those (and the label
    words), not the file."""
    data = tmp_path / "big.jsonl"
    data.write_text("".join(json.dumps({"text": f"w{i}", "label": i % 2}) + "\n"
                            for i in range(20_000)))
    r = subprocess.run([sys.executable, "-c", COUNTED, "run", "--set", f"data={data}", "--set",
                        "steps=2", "--set", "batch_size=4", "--set", "eval_samples=8", "--set",
                        "eval_every=0", "--out", str(tmp_path / "run")], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    encoded = int(r.stdout.strip().splitlines()[-1].split()[1])
    assert 2 * 4 <= encoded <= 2 * 4 + 8 + 8, encoded
