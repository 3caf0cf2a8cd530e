"""Host cost per streamed block (issue 16, part 9): why tiny blocks stream slower than MeZO.

On a GPU the host only enqueues work; a block whose compute lasts less than the host's work
for it leaves the GPU waiting, and then every host microsecond shows in the step. Two parts:

* ``steps``: host time to enqueue one step (no sync inside; median over steps), MeZO vs
  zo-offload, telemetry on and off, for small presets at a 1 x 8 batch (so the GPU's work is
  negligible and the host's is what is measured); the difference per streamed block is the
  streaming schedule's own host cost.
* ``calls``: the host cost of each CUDA call the schedule makes per streamed block (events,
  stream waits and switches, copies, a fused-kernel launch) and of one decoder layer's forward,
  for scale.

    python benchmarks/block_overhead.py               # ~1 min on an H100 / H200
"""
from __future__ import annotations

import argparse
import time

import torch

from common import save, table

from workbench.calibrate.shapes import host_step_seconds
from workbench.engine.groups import build_layouts
from workbench.engine.zo.perturb import ZOOps
from workbench.models.adapter import BlockAdapter
from workbench.models.build import build_skeleton
from workbench.presets import PRESETS


def host_per_step(model: str, method: str, telemetry: bool, steps: int) -> tuple[float, int]:
    """Median host seconds to enqueue one step (the GPU drained between steps: the
    calibration's own measurement, ``calibrate/shapes.py::host_step_seconds``), and blocks."""
    seconds = host_step_seconds(model, method, "off", "cuda", steps, telemetry=telemetry)
    return seconds, PRESETS[model].num_layers


def per_call(fn, reps: int = 2000) -> float:
    """Host microseconds per call of ``fn`` (the GPU drained first)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    host = (time.perf_counter() - start) / reps
    torch.cuda.synchronize()
    return host * 1e6


def _switch(stream) -> None:
    with torch.cuda.stream(stream):
        pass


def calls() -> list[dict]:
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    reused = torch.cuda.Event()
    host = torch.empty(50_000, pin_memory=True)
    dev = torch.empty(50_000, device="cuda")
    ops = ZOOps("philox", torch.device("cuda"))
    skeleton, source = build_skeleton("opt-125m")
    _, blocks, _ = build_layouts(BlockAdapter(skeleton))
    lay = blocks[0]
    flat = torch.zeros(lay.numel, device="cuda")
    if ops.kernels is not None:
        ops.kernels.warm(lay.numel, lay.n_decay)
    rows = [
        ("torch.cuda.Event() + record (Streams.record)", lambda: torch.cuda.Event().record(s1)),
        ("record of a reused event", lambda: reused.record(s1)),
        ("timing event pair record (OpTimer.span)",
         lambda: (torch.cuda.Event(enable_timing=True).record(s1),
                  torch.cuda.Event(enable_timing=True).record(s1))),
        ("stream.wait_event", lambda: s2.wait_event(reused)),
        ("with torch.cuda.stream(s) (enter + exit)", lambda: _switch(s1)),
        ("copy 200 KB pinned -> GPU, non_blocking", lambda: dev.copy_(host, non_blocking=True)),
        ("copy 200 KB GPU -> pinned, non_blocking", lambda: host.copy_(dev, non_blocking=True)),
        ("slot view flat[:numel]", lambda: flat[:lay.numel]),
        ("bind a block's 16 parameters", (lambda p: lambda: lay.bind(p))(lay.make_params(flat))),
    ]
    if ops.kernels is not None:
        rows.append(("fused perturb launch (opt-125m block)",
                     lambda: ops.perturb(flat, lay, 1, 1e-3)))
    out = [{"call": name, "host_us": per_call(fn)} for name, fn in rows]
    layer = skeleton.model.decoder.layers[0].to_empty(device="cuda")  # timing only: any values
    x = torch.zeros(1, 8, 768, device="cuda")
    with torch.no_grad():
        out.append({"call": "one OPT-125m decoder layer forward, 1 x 8 tokens",
                    "host_us": per_call(lambda: layer(x), reps=300)})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny-opt,opt-125m,opt-350m")
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    rows = []
    for model in args.models.split(","):
        for telemetry in (False, True):
            mezo, n = host_per_step(model, "mezo", telemetry, args.steps)
            off, _ = host_per_step(model, "zo-offload", telemetry, args.steps)
            rows.append({"model": model, "blocks": n, "telemetry": telemetry,
                         "mezo_ms": mezo * 1e3, "offload_ms": off * 1e3,
                         "extra_us_per_block": (off - mezo) / n * 1e6})
            print(table(rows[-1:], STEP_COLS), flush=True)
    prims = calls()
    path = save("block_overhead", {"steps": rows, "calls": prims})
    print("\n== host time to enqueue one step (1 x 8 tokens), median\n" + table(rows, STEP_COLS))
    print("\n== host time per call\n" + table(prims, [("call", "call", ""),
                                                      ("host us", "host_us", "{:.2f}")]))
    print(f"\nsaved {path}")


STEP_COLS = [("model", "model", ""), ("blocks", "blocks", ""), ("telemetry", "telemetry", ""),
             ("MeZO ms", "mezo_ms", "{:.3f}"), ("offload ms", "offload_ms", "{:.3f}"),
             ("extra us/block", "extra_us_per_block", "{:.1f}")]

if __name__ == "__main__":
    main()
