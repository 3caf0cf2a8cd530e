"""Data-parallel zo-offload: tokens/s with 1 and N GPUs through torchrun (issue: scale out).

Each configuration is a real ``torchrun --nproc_per_node N -m workbench run`` (the command users
type), read back from rank 0's run.json. Two ways to scale:
  weak    every GPU keeps the per-GPU batch (global batch = N x per-GPU): the usual DP figure
  strong  the global batch stays the same and is split N ways
A zo-offload step at opt-6.7b is bound by each GPU's own PCIe stream of the blocks, which a
smaller shard does not shorten, so strong scaling is expected to gain little; weak scaling
should approach N x, since only two scalars cross between the GPUs per step.

Host memory per node (issue 21, part 3): with ``host_share`` on (the default) the ranks of a
host map one copy of the streamed blocks; off, each rank holds its own. ``host_gb`` is the
node's peak of the summed PSS of the torchrun tree (shared pages counted once), sampled every
0.5 s; ``host_rss_gb`` the summed RSS (shared pages counted by each rank that touches them).
Every row is a fresh torchrun; rank digests are compared at the end of each run and, during
it, every ``--digest-check-every`` steps (default 4, to exercise the check; the run default is 50).
A check syncs the streams and samples the weights, so the step after it is slower (0.1-0.5 s at
opt-6.7b / opt-13b on 2 x H200): ``x 1 GPU`` is the ratio of steady tokens/s, checks included;
``x 1 GPU, median`` the same ratio from the median steps (tokens per step / median step).

Usage: python benchmarks/data_parallel.py --model opt-6.7b --gpus 1,2
       python benchmarks/data_parallel.py --models opt-6.7b,opt-13b --precisions fp32,bf16-sr \
           --gpus 1,2 --modes weak --host-share on,off --steps 10 --name host_share
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import save, table, watch_tree

ROOT = Path(__file__).resolve().parent.parent


def torchrun(nproc: int, sets: list[str], out: Path, port: int) -> dict:
    """One run; rank 0's summary plus every rank's digest, or the error."""
    args = [x for kv in sets for x in ("--set", kv)]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           f"--master_port={port}", "-m", "workbench", "run", *args, "--out", str(out), "--quiet"]
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", PYTHONPATH=str(ROOT))  # multicast off: KINDS.md
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT)
    peak = {"pss": 0, "rss": 0}
    sampler = threading.Thread(target=watch_tree, args=(proc, peak), daemon=True)
    sampler.start()
    _, stderr = proc.communicate()
    sampler.join()
    if proc.returncode != 0:
        return {"error": stderr[-2000:], "host_gb": peak["pss"] / 1e9}
    info = json.loads((out / "run.json").read_text())
    s = info["summary"]
    ranks = info["info"].get("ranks", [])
    return {"tokens_per_s": s["tokens_per_s"], "step_seconds": s["step_seconds"],
            "peak_gpu_mem_gb": s.get("peak_gpu_mem_bytes", 0) / 1e9,
            "bytes_h2d_gb": s.get("bytes_h2d", 0) / 1e9,
            "ranks": len(ranks) or 1,  # the digests were also compared during the run
            "rank_digests_equal": (len({x.get("param_digest") for x in ranks}) == 1
                                   if len(ranks) > 1 else None),
            "param_digest": info.get("param_digest"),
            "warmup_steps": s.get("warmup_steps"),
            "step_seconds_all": [round(x["seconds"], 4) for x in info["steps"]],  # where a slow one is
            "host_gb": peak["pss"] / 1e9, "host_rss_gb": peak["rss"] / 1e9,
            "rank_host": [x.get("host") for x in ranks],
            "wall_seconds": time.perf_counter() - t}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="opt-6.7b")
    p.add_argument("--models", default="", help="comma list; overrides --model")
    p.add_argument("--precisions", default="", help=f"comma list of {', '.join(PRECISIONS)}; "
                   "overrides --amp")
    p.add_argument("--host-share", default="on", help="on, off or on,off")
    p.add_argument("--name", default="data_parallel", help="results file name")
    p.add_argument("--gpus", default="1,2")
    p.add_argument("--per-gpu-batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--amp", default="off")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--modes", default="weak,strong")
    p.add_argument("--device", default="cuda", help="cpu: a gloo smoke run of this script")
    p.add_argument("--digest-check-every", type=int, default=4,
                   help="the runs' digest_check_every (0: only the end-of-run comparison)")
    args = p.parse_args()
    gpus = [int(g) for g in args.gpus.split(",")]
    rows, base_tps = [], {}
    work = Path(tempfile.mkdtemp(prefix="wb-dp-"))
    models = args.models.split(",") if args.models else [args.model]
    precisions = args.precisions.split(",") if args.precisions else [f"amp={args.amp}"]
    for model in models:
        for prec in precisions:
            knobs = PRECISIONS.get(prec, [prec])
            for mode in args.modes.split(","):
                for share in args.host_share.split(","):
                    for n in gpus:
                        if n == 1 and share != args.host_share.split(",")[0]:
                            continue  # one rank: nothing to share, one row is enough
                        batch = args.per_gpu_batch * (n if mode == "weak" else max(gpus))
                        sets = [f"model={model}", "method=zo-offload", "data=synthetic",
                                f"device={args.device}", f"batch_size={batch}",
                                f"seq_len={args.seq_len}", f"steps={args.steps}", *knobs,
                                "lr=1e-7", "eval_samples=0",
                                f"digest_check_every={args.digest_check_every}",
                                f"host_share={'true' if share == 'on' else 'false'}"]
                        name = f"{model} {prec} {mode} {n} GPU x{batch} share={share}"
                        r = torchrun(n, sets, work / f"{len(rows)}", 29500 + len(rows))
                        r.update(model=model, precision=prec, mode=mode, gpus=n,
                                 host_share=share, global_batch=batch, name=name)
                        key = (model, prec, mode)
                        if "error" not in r:
                            per_step = batch * args.seq_len / r["step_seconds"]
                            base = base_tps.setdefault(key, (r["tokens_per_s"], per_step))
                            r["speedup"] = r["tokens_per_s"] / base[0]
                            r["median_speedup"] = per_step / base[1]
                        rows.append(r)
                        print(table([r], COLS), flush=True)
                        path = save(args.name, {"rows": rows, "args": vars(args)})  # each row
    print("\n" + table(rows, COLS))
    print(f"saved {path}")


PRECISIONS = {"fp32": ["amp=off"],
              "bf16-sr": ["amp=bf16", "codec=bf16", "master=compressed-sr"]}
COLS = [("run", "name", ""), ("tok/s", "tokens_per_s", "{:,.0f}"), ("x 1 GPU", "speedup", "{:.2f}"),
        ("x 1 GPU, median", "median_speedup", "{:.2f}"),
        ("step s", "step_seconds", "{:.3f}"), ("peak GB", "peak_gpu_mem_gb", "{:.1f}"),
        ("host GB (PSS)", "host_gb", "{:.1f}"), ("host RSS GB", "host_rss_gb", "{:.1f}"),
        ("digests equal", "rank_digests_equal", ""), ("error", "error", "")]


if __name__ == "__main__":
    main()
