"""A streamed export holds one group at a time: in a fresh process, the export's peak resident
memory above where it started stays under the largest group's fp32 size plus a small constant,
for a model whose groups together are many times that (a whole-model export would not fit).

glibc serves allocations above its mmap threshold (at most 32 MiB) with their own mappings,
returned to the system when freed; smaller ones come from its heap, which keeps freed blocks
(resident memory then measures the allocator's history, not what the export holds). A real
model's groups are far above 32 MiB; this test's 27 MiB ones are not, so the probe runs with a
1 MiB threshold to treat them as real groups are treated."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workbench.config import RunConfig
from workbench.engine.checkpoint import Snapshot, write_checkpoint
from workbench.engine.groups import LazyFlats
from workbench.export.exporter import group_layouts
from workbench.export.tokenizer_files import byte_tokenizer

MiB = 2 ** 20
SLACK = 16 * MiB  # the bf16 cast buffer (8 MiB), Python's own allocations

PROBE = r"""
import json, sys, threading, time
import psutil, torch
from workbench.export.exporter import export_run
torch.set_num_threads(1)
run, out = sys.argv[1], sys.argv[2]
export_run(run, out + "-warm", dtype=sys.argv[3])  # imports, tokenizer, caches: paid once
proc, peak, stop = psutil.Process(), [0], threading.Event()
def sample():
    while not stop.is_set():
        peak[0] = max(peak[0], proc.memory_info().rss)
        time.sleep(0.0005)
base = proc.memory_info().rss
thread = threading.Thread(target=sample); thread.start()
export_run(run, out, dtype=sys.argv[3])
stop.set(); thread.join()
print(json.dumps({"base": base, "peak": peak[0]}))
"""


def fake_run(root: Path) -> tuple[Path, list[int]]:
    """A done run of a Llama folder model (hidden 768, 8 blocks of 7 M parameters: 28 MiB of
    fp32 each, 230 MiB in all) whose RUN_DIR/weights hold random values; no training needed."""
    from transformers import LlamaConfig

    model = root / "model"
    LlamaConfig(hidden_size=768, intermediate_size=2048, num_hidden_layers=8,
                num_attention_heads=12, vocab_size=260,
                max_position_embeddings=64).save_pretrained(model)
    byte_tokenizer().save_pretrained(model)
    from safetensors.torch import save_file

    save_file({"unused": torch.zeros(1)}, str(model / "placeholder.safetensors"))
    cfg = RunConfig(model=str(model), method="mezo", data="synthetic", steps=3, seq_len=16)
    layouts = group_layouts(cfg)
    run = root / "run"
    run.mkdir()
    gen = torch.Generator().manual_seed(0)
    flats = LazyFlats(len(layouts), lambda k: torch.randn(layouts[k].numel, generator=gen))
    write_checkpoint(run, Snapshot(3, flats, [lay.name for lay in layouts], None, cfg.to_dict(),
                                   [lay.n_decay for lay in layouts]), name="weights",
                     per_group=True)
    (run / "run.json").write_text(json.dumps({"config": cfg.to_dict(), "status": "done",
                                              "steps": [{"step": t, "loss": 1.0}
                                                        for t in range(3)]}))
    return run, [lay.numel for lay in layouts]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_export_peak_memory_is_one_group_plus_a_constant(tmp_path, dtype):
    run, numels = fake_run(tmp_path)
    group, total = 4 * max(numels), 4 * sum(numels)
    assert total > 6 * group  # a whole-model export would show
    r = subprocess.run([sys.executable, "-c", PROBE, str(run), str(tmp_path / "out"), dtype],
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MiB)})
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    grew = got["peak"] - got["base"]
    assert grew < group + SLACK, (f"peak grew {grew / MiB:.0f} MiB; one group is "
                                  f"{group / MiB:.0f} MiB, the model {total / MiB:.0f} MiB")
    written = (tmp_path / "out" / "model.safetensors").stat().st_size
    assert written > total // (2 if dtype == "bf16" else 1) - MiB  # every weight was written
