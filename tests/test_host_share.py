"""One host copy per node under torchrun (issue 21, part 3), through the CLI with gloo ranks:
the shared copy trains bit-identically to today's per-rank copies, every rank agrees, and the
host storage of the streamed blocks is allocated once for the node instead of once per rank."""
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

SETTINGS = ["model=tiny-opt", "method=zo-offload", "data=synthetic", "batch_size=8",
            "seq_len=16", "steps=4", "lr=2e-3", "weight_decay=0.01", "sample_hz=0",
            "digest_check_every=2", "eval_samples=0", "codec=bf16", "master=compressed-sr",
            "rng=torch"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(out: Path, ranks: int, *extra: str) -> dict:
    sets = [x for kv in SETTINGS + list(extra) for x in ("--set", kv)]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}",
           f"--master_port={_free_port()}", "-m", "workbench", "run", *sets, "--out", str(out),
           "--quiet"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((out / "run.json").read_text())["info"]


@pytest.mark.parametrize("ranks", [2, 4])
def test_one_host_copy_per_node_bit_identical_to_per_rank_copies(ranks, tmp_path):
    shared = _torchrun(tmp_path / "shared", ranks)
    own = _torchrun(tmp_path / "own", ranks, "host_share=false")
    digests = {r["param_digest"] for r in shared["ranks"] + own["ranks"]}
    assert len(digests) == 1  # every rank, shared or not: the same weights, bit for bit
    hosts = [r["host"] for r in shared["ranks"]]
    streamed = hosts[0]["streamed_bytes"]
    assert streamed > 0 and all(h["streamed_bytes"] == streamed for h in hosts)
    # shared: created once (local rank 0), mapped by the others, allocated privately by none
    assert [h["created_bytes"] for h in hosts] == [streamed] + [0] * (ranks - 1)
    assert [h["mapped_bytes"] for h in hosts] == [0] + [streamed] * (ranks - 1)
    assert all(h["private_bytes"] == 0 for h in hosts)
    # today's way: every rank allocates its own copy
    assert [h["private_bytes"] for h in (r["host"] for r in own["ranks"])] == [streamed] * ranks


def test_mirror_transfer_is_refused_with_host_share(tmp_path):
    sets = [x for kv in SETTINGS + ["master=fp32"] for x in ("--set", kv)]
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                        f"--master_port={_free_port()}", "-m", "workbench", "run", *sets,
                        "--out", str(tmp_path / "x"), "--quiet"], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode != 0 and "host_share: master=fp32 with codec=bf16" in r.stderr


def test_lora_frozen_base_one_host_copy_per_node(tmp_path):
    """zo-offload + peft=lora under 2 ranks: the frozen base (int8) is created once by local
    rank 0 and mapped by the other, and both ranks train the same adapters over the same base
    as with a copy each."""
    lora = ["codec=fp32", "master=fp32", "peft=lora", "base_codec=int8"]
    shared = _torchrun(tmp_path / "shared", 2, *lora)
    own = _torchrun(tmp_path / "own", 2, *lora, "host_share=false")
    assert len({r["param_digest"] for r in shared["ranks"] + own["ranks"]}) == 1
    base = {json.loads((tmp_path / d / "run.json").read_text())["base_digest"]
            for d in ("shared", "own")}
    assert len(base) == 1 and "" not in base
    hosts = [r["host"] for r in shared["ranks"]]
    streamed = hosts[0]["streamed_bytes"]
    assert streamed > 0 and [h["created_bytes"] for h in hosts] == [streamed, 0]
    assert [h["mapped_bytes"] for h in hosts] == [0, streamed]


def test_streamed_embeddings_one_host_copy_per_node(tmp_path):
    """stream_embeddings under 2 ranks: the embedding and head masters are in the node's one
    copy too (the hand-off counts every streamed unit), the same weights as a copy per rank."""
    ends = ["model=tiny-llama", "stream_embeddings=true", "block_slots=2"]
    shared = _torchrun(tmp_path / "shared", 2, *ends)
    own = _torchrun(tmp_path / "own", 2, *ends, "host_share=false")
    assert len({r["param_digest"] for r in shared["ranks"] + own["ranks"]}) == 1
    hosts = [r["host"] for r in shared["ranks"]]
    streamed = hosts[0]["streamed_bytes"]
    assert [h["created_bytes"] for h in hosts] == [streamed, 0]
    assert [h["mapped_bytes"] for h in hosts] == [0, streamed]
    plain = _torchrun(tmp_path / "resident", 2, "model=tiny-llama")["ranks"][0]["host"]
    assert streamed - plain["streamed_bytes"] == 2 * 2 * 260 * 64 + 2 * 64  # bf16 ends
