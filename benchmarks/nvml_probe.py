"""Where a run's device memory goes beyond torch's allocator, as NVML sees it (the planner's
``CONTEXT_BYTES``; issue 21's NVML column).

Each row is one process: NVML's used memory (device 0, so run it on an idle GPU) before CUDA
starts, after the context, after the first cuBLAS matmul, its peak during a short run (every
0.1 s) and at the end, beside torch's allocated / reserved peaks and the planner's figures for
the same settings. Run-own figures subtract the ``before`` reading (the driver's reserve that
NVML counts as used).

    python benchmarks/nvml_probe.py                            # three zo-offload rows (~1 min)
    python benchmarks/nvml_probe.py --row model=opt-1.3b ...   # one row in this process
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BASE = ("method=zo-offload amp=bf16 data=synthetic batch_size=8 seq_len=128 sample_hz=0 "
        "device=cuda gpu_mem_limit_gb=24 steps=6").split()
ROWS = {"opt-1.3b bf16 SR": ["codec=bf16", "master=compressed-sr", "model=opt-1.3b"],
        "opt-6.7b bf16 SR": ["codec=bf16", "master=compressed-sr", "model=opt-6.7b"],
        "opt-6.7b LoRA, fp8 base": ["codec=fp32", "master=fp32", "peft=lora",
                                    "base_codec=fp8-e4m3", "model=opt-6.7b"]}
MARK = "NVPROBE "


def row(sets: list[str]) -> dict:
    """One run in this process, NVML read around it (see the module docstring)."""
    import pynvml as nv

    nv.nvmlInit()
    handle = nv.nvmlDeviceGetHandleByIndex(0)

    def used() -> int:
        return nv.nvmlDeviceGetMemoryInfo(handle).used

    out: dict = {"before": used()}
    import torch

    from workbench.config import load_config, parse_sets
    from workbench.plan.planner import plan
    from workbench.recipes.train import run

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    out["context"] = used()
    a = torch.ones(256, 256, device="cuda")
    (a @ a).sum().item()
    out["cublas"], out["cublas_torch_reserved"] = used(), torch.cuda.memory_reserved()
    del a
    torch.cuda.empty_cache()
    peak, stop = {"v": 0}, threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak["v"] = max(peak["v"], used())
            time.sleep(0.1)

    threading.Thread(target=watch, daemon=True).start()
    cfg = load_config(None, parse_sets(sets))
    t = time.perf_counter()
    rec = run(cfg)
    out["run_s"] = time.perf_counter() - t
    stop.set()
    time.sleep(0.2)
    out.update(nvml_peak=peak["v"], end=used(), torch_max_alloc=torch.cuda.max_memory_allocated(),
               torch_max_reserved=torch.cuda.max_memory_reserved(),
               summary_peak=rec.summary.get("peak_gpu_mem_bytes"),
               step_s=rec.summary.get("step_seconds"))
    pl = plan(cfg)
    out.update(plan_torch=pl.peak_gpu_mem_bytes, plan_nvml=pl.nvml_gpu_mem_bytes, sets=sets)
    return out


def summarise(name: str, r: dict) -> dict:
    """Run-own figures (GB = 10^9 B): NVML peak less ``before``, and what lies outside torch."""
    own = r["nvml_peak"] - r["before"]
    return {"row": name, **r, "nvml_own_gb": own / 1e9,
            "outside_torch_mib": (own - r["torch_max_reserved"]) / 2 ** 20,
            "fragmentation_gb": (r["torch_max_reserved"] - r["torch_max_alloc"]) / 1e9,
            "plan_nvml_vs_own": r["plan_nvml"] / own - 1}


COLS = [("row", "row", ""), ("NVML own GB", "nvml_own_gb", "{:.2f}"),
        ("outside torch MiB", "outside_torch_mib", "{:.0f}"),
        ("reserved-free GB", "fragmentation_gb", "{:.2f}"),
        ("plan NVML vs own", "plan_nvml_vs_own", "{:+.1%}")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--row", nargs="*", help="KEY=VALUE settings: one row in this process")
    p.add_argument("--name", default="nvml_probe")
    args = p.parse_args()
    if args.row is not None:
        print(MARK + json.dumps(row(args.row)), flush=True)
        return
    from common import save, table

    rows = []
    for name, sets in ROWS.items():  # a fresh process each: a context of its own
        r = subprocess.run([sys.executable, __file__, "--row", *BASE, *sets],
                           capture_output=True, text=True, timeout=600)
        line = [x for x in r.stdout.splitlines() if x.startswith(MARK)]
        if not line:
            rows.append({"row": name, "error": (r.stderr or r.stdout)[-800:]})
            continue
        rows.append(summarise(name, json.loads(line[-1][len(MARK):])))
    print(table(rows, COLS))
    print(f"saved {save(args.name, {'rows': rows})}")


if __name__ == "__main__":
    main()
