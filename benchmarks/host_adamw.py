"""fo-offload's CPU update, per parameter: torch's fused AdamW against the one-pass kernel
(``workbench/engine/fo/adamw16.c``), on page-locked host buffers, in this process.

Rows, each on one subgroup of ``--sizes`` elements (weight decay on), with the update
thread count fo-offload uses on a GPU run (torch's threads less one):
    torch          torch's fused AdamW on fp32 (p, g, m, v): the update when the 16-bit
                   weights are downcast on the GPU
    torch+down     the same, then the fp32 -> bf16 copy into a staging buffer: the update when
                   they are downcast on the CPU
    adamw16        the one-pass kernel: bf16 g in, fp32 (p, m, v) updated, bf16 weights out
    adamw16 no out the same without the bf16 weights (the update when they are downcast on
                   the GPU)
Each is timed alone and under DMA load (``--load``: page-locked copies both ways on two
streams, as calibration's stand-in for a step's traffic), median of ``--reps``. Before timing,
each size checks the kernel's bits against torch's (p, m, v and the bf16 weights).

    python benchmarks/host_adamw.py                      # 25 M, 50 M, 100 M
    python benchmarks/host_adamw.py --device cpu --sizes 1000000 --reps 2   # plumbing

Saves benchmarks/results/<--name>-<gpu>-<date>.json (and a copy to $OUT) on a GPU.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import pcie_bandwidth, save, table  # noqa: E402
from workbench.engine.fo.adamw import AdamW, OptState, Segment, adamw  # noqa: E402
from workbench.engine.fo.adamw16 import adamw16, v_fma  # noqa: E402
from workbench.engine.fo.host import default_threads  # noqa: E402
from workbench.engine.device.pinned import HostMemory  # noqa: E402


def rows_for(n: int, memory: HostMemory, threads: int, reps: int, load) -> list[dict]:
    p, m, v, g32 = (memory.empty(n) for _ in range(4))
    g16, w16 = memory.empty(n, torch.bfloat16), memory.empty(n, torch.bfloat16)
    p.normal_()
    m.zero_()
    v.zero_()
    g16.copy_(torch.randn(n))
    g32.copy_(g16)
    opt, seg = AdamW(1e-5, 0.01, 0.9, 0.999, 1e-8), [Segment(0, n, True)]
    # the bits first: one step each way from the same state
    ref = OptState(p.clone(), m.clone(), v.clone())
    adamw(ref, g32, seg, opt, torch.tensor(1.0))
    got = OptState(p.clone(), m.clone(), v.clone())
    adamw16(got, g16, w16, seg, opt, 1, threads)
    equal = all(torch.equal(a, b) for a, b in zip(ref, got)) and torch.equal(w16, ref.p.bfloat16())
    del ref, got
    state, step_t = OptState(p, m, v), torch.tensor(1.0)
    variants = {
        "torch": lambda: adamw(state, g32, seg, opt, step_t),
        "torch+down": lambda: (adamw(state, g32, seg, opt, step_t), w16.copy_(p)),
        "adamw16": lambda: adamw16(state, g16, w16, seg, opt, 1, threads),
        "adamw16 no out": lambda: adamw16(state, g16, None, seg, opt, 1, threads),
    }
    out = []
    for loaded in (False, True):
        for name, fn in variants.items():
            fn()
            secs = []
            for _ in range(reps):
                with load() if loaded and load is not None else nullcontext():
                    t = time.perf_counter()
                    fn()
                    secs.append(time.perf_counter() - t)
            s = statistics.median(secs)
            out.append({"variant": name, "elements": n, "dma_load": loaded, "seconds": s,
                        "gparams_per_s": n / s / 1e9, "threads": threads,
                        "bits_equal_torch": equal})
    base = {(r["dma_load"]): r["seconds"] for r in out if r["variant"] == "torch+down"}
    for r in out:
        r["vs_torch_down"] = base[r["dma_load"]] / r["seconds"]
    return out


class Load:
    """Page-locked copies up and down the link on two side streams, running while the timed
    update runs (enqueued generously, drained on exit)."""

    def __init__(self, chunk: int = 64 << 20, count: int = 24):
        self.host = [torch.empty(chunk // 4, pin_memory=True) for _ in range(2)]
        self.dev = [torch.empty(chunk // 4, device="cuda") for _ in range(2)]
        self.streams = (torch.cuda.Stream(), torch.cuda.Stream())
        self.count = count

    def __call__(self):
        return self

    def __enter__(self):
        for _ in range(self.count):
            with torch.cuda.stream(self.streams[0]):
                self.dev[0].copy_(self.host[0], non_blocking=True)
            with torch.cuda.stream(self.streams[1]):
                self.host[1].copy_(self.dev[1], non_blocking=True)
        return self

    def __exit__(self, *exc):
        torch.cuda.synchronize()  # the copies end before the next timed run's
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--sizes", default="25000000,50000000,100000000")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--name", default="host_adamw")
    args = ap.parse_args()
    start = time.perf_counter()
    cuda = args.device == "cuda"
    memory, threads = HostMemory(cuda), default_threads(cuda)
    load = Load() if cuda else None
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        rows += rows_for(n, memory, threads, args.reps, load)
    memory.release()
    out = {"rows": rows, "v_fma": v_fma(), "threads": threads,
           "pcie": pcie_bandwidth() if cuda else None,
           "seconds": time.perf_counter() - start}
    cols = [("variant", "variant", ""), ("elements", "elements", ""),
            ("DMA load", "dma_load", ""), ("s", "seconds", "{:.4f}"),
            ("G/s", "gparams_per_s", "{:.2f}"), ("vs torch+down", "vs_torch_down", "{:.2f}"),
            ("bits = torch", "bits_equal_torch", "")]
    print(table(rows, cols))
    if cuda:
        print(f"saved {save(args.name, out)}")


if __name__ == "__main__":
    main()
