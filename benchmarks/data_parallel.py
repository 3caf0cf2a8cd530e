"""Data-parallel zo-offload: tokens/s with 1 and N GPUs through torchrun (issue: scale out).

Each configuration is a real ``torchrun --nproc_per_node N -m workbench run`` (the command users
type), read back from rank 0's run.json. Two ways to scale:
  weak    every GPU keeps the per-GPU batch (global batch = N x per-GPU): the usual DP figure
  strong  the global batch stays the same and is split N ways
A zo-offload step at opt-6.7b is bound by each GPU's own PCIe stream of the blocks, which a
smaller shard does not shorten, so strong scaling is expected to gain little; weak scaling
should approach N x, since only two scalars cross between the GPUs per step.
Usage: python benchmarks/data_parallel.py --model opt-6.7b --gpus 1,2
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import save, table

ROOT = Path(__file__).resolve().parent.parent


def torchrun(nproc: int, sets: list[str], out: Path, port: int) -> dict:
    """One run; rank 0's summary plus every rank's digest, or the error."""
    args = [x for kv in sets for x in ("--set", kv)]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           f"--master_port={port}", "-m", "workbench", "run", *args, "--out", str(out), "--quiet"]
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", PYTHONPATH=str(ROOT))  # multicast off: KINDS.md
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode != 0:
        return {"error": r.stderr[-2000:]}
    info = json.loads((out / "run.json").read_text())
    s = info["summary"]
    ranks = info["info"].get("ranks", [])
    return {"tokens_per_s": s["tokens_per_s"], "step_seconds": s["step_seconds"],
            "peak_gpu_mem_gb": s.get("peak_gpu_mem_bytes", 0) / 1e9,
            "bytes_h2d_gb": s.get("bytes_h2d", 0) / 1e9,
            "ranks": len(ranks) or 1,  # the digests were also compared during the run
            "rank_digests_equal": (len({x.get("param_digest") for x in ranks}) == 1
                                   if len(ranks) > 1 else None),
            "wall_seconds": time.perf_counter() - t}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="opt-6.7b")
    p.add_argument("--gpus", default="1,2")
    p.add_argument("--per-gpu-batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--amp", default="off")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--modes", default="weak,strong")
    p.add_argument("--device", default="cuda", help="cpu: a gloo smoke run of this script")
    args = p.parse_args()
    gpus = [int(g) for g in args.gpus.split(",")]
    rows, base_tps = [], {}
    work = Path(tempfile.mkdtemp(prefix="wb-dp-"))
    for mode in args.modes.split(","):
        for n in gpus:
            batch = args.per_gpu_batch * (n if mode == "weak" else max(gpus))
            sets = [f"model={args.model}", "method=zo-offload", "data=synthetic", f"device={args.device}",
                    f"batch_size={batch}", f"seq_len={args.seq_len}", f"steps={args.steps}",
                    f"amp={args.amp}", "lr=1e-7", "eval_samples=0", "digest_check_every=4"]
            r = torchrun(n, sets, work / f"{mode}-{n}", 29500 + len(rows))
            r.update(mode=mode, gpus=n, global_batch=batch, name=f"{mode} {n} GPU x{batch}")
            if "error" not in r:
                base_tps.setdefault(mode, r["tokens_per_s"])
                r["speedup"] = r["tokens_per_s"] / base_tps[mode]
            rows.append(r)
            print(table([r], COLS), flush=True)
            path = save("data_parallel", {"rows": rows, "args": vars(args)})  # after every row
    print("\n" + table(rows, COLS))
    print(f"saved {path}")


COLS = [("run", "name", ""), ("tok/s", "tokens_per_s", "{:,.0f}"), ("x 1 GPU", "speedup", "{:.2f}"),
        ("step s", "step_seconds", "{:.3f}"), ("peak GB", "peak_gpu_mem_gb", "{:.1f}"),
        ("digests equal", "rank_digests_equal", ""), ("error", "error", "")]


if __name__ == "__main__":
    main()
