"""Where zo-offload's GPU memory goes under AMP (issue 16, part 7), item by item.

ZO2's own benchmark shape: opt-6.7b, 1 x 2048, bf16 autocast, zo-offload with codec=bf16 and
master=compressed-sr (ZO2 in its AMP mode peaked at 4.73 GiB; target: at most 4.7 GiB). Every
row runs in a fresh process on the GPU: a few steps through the training recipe, then the torch
allocator's peak (``torch.cuda.max_memory_allocated``), the engine's own buffers by item
(``buffer_bytes``: embedding + head, block slots, wire buffers, tied head weight copy, ...) and
the rest (activations, autocast weight casts, the head, cuBLAS workspace) as peak - buffers,
each beside the planner's prediction of the same item.

On a machine without a GPU (``--device cpu``) nothing is built at scale: the breakdown is the
planner's, whose buffer items are checked against the engine's own buffers on the CPU
(tests/plan/test_planner.py::test_planned_device_buffers_are_the_engines_own).

    python benchmarks/amp_memory.py                 # the issue's row, ~1 min on an H200
    python benchmarks/amp_memory.py --models opt-1.3b,opt-6.7b --shapes 1x2048,16x128
    python benchmarks/amp_memory.py --device cpu    # the accounting alone, any machine
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common import add_fresh_args, in_fresh_process, save  # first: puts this checkout on sys.path

GiB = 1 << 30
TARGET_GIB, ZO2_GIB = 4.7, 4.73
SETTINGS = {"method": "zo-offload", "amp": "bf16", "codec": "bf16", "master": "compressed-sr",
            "data": "synthetic", "lr": 1e-7, "sample_hz": 0.0}


def child(spec: dict, result: Path) -> None:
    """Train ``spec``'s config a few steps in this fresh process; peak and buffers."""
    import torch

    from workbench.config import RunConfig
    from workbench.recipes.train import TrainRecipe

    recipe = TrainRecipe(RunConfig(**spec["config"]), out_dir=None, progress=False)
    try:
        recipe.setup()
        recipe.dev_data = None
        torch.cuda.reset_peak_memory_stats()
        recipe.train()
        torch.cuda.synchronize()
        out = {"peak": torch.cuda.max_memory_allocated(), "buffers": recipe.engine.buffer_bytes(),
               "step_seconds": recipe.save(digest_params=False).summary["step_seconds"]}
    finally:
        recipe.cleanup()
    result.write_text(json.dumps(out))


def breakdown(cfg_dict: dict, measured: dict | None) -> list[dict]:
    """Lines (item, planned bytes, measured bytes) for one config."""
    from workbench.config import RunConfig
    from workbench.plan.planner import plan

    planned = plan(RunConfig(**{**cfg_dict, "device": "cuda"}), gpu="h200").gpu_breakdown
    lines = []
    buffers = (measured or {}).get("buffers", {})
    for item, nbytes in planned.items():
        if nbytes or buffers.get(item):
            lines.append({"item": item, "planned": nbytes, "measured": buffers.get(item)})
    if measured is not None:
        rest = measured["peak"] - sum(buffers.values())
        planned_rest = planned.get("activations", 0) + planned.get("cuBLAS workspace", 0)
        lines.append({"item": "rest: activations, casts, head, workspace (peak - buffers)",
                      "planned": planned_rest, "measured": rest})
    lines.append({"item": "total (torch peak)", "planned": sum(planned.values()),
                  "measured": measured["peak"] if measured else None})
    return lines


def show(name: str, lines: list[dict]) -> None:
    print(f"\n{name}")
    print(f"{'item':<58}{'planned GiB':>12}{'measured GiB':>14}")
    for line in lines:
        meas = "-" if line["measured"] is None else f"{line['measured'] / GiB:.3f}"
        print(f"{line['item']:<58}{line['planned'] / GiB:>12.3f}{meas:>14}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="opt-6.7b")
    p.add_argument("--shapes", default="1x2048")
    p.add_argument("--steps", type=int, default=4)
    add_fresh_args(p, "amp_memory", 300.0)
    args = p.parse_args()
    if args.row:
        child(json.loads(args.row), Path(args.result))
        return
    start, rows = time.perf_counter(), []
    for model in args.models.split(","):
        for shape in args.shapes.split(","):
            b, t = (int(x) for x in shape.split("x"))
            cfg = {**SETTINGS, "model": model, "batch_size": b, "seq_len": t,
                   "steps": args.steps, "device": args.device}
            name = f"{model} {shape} amp=bf16 codec=bf16 master=compressed-sr"
            measured = None
            if args.device == "cuda":
                measured = in_fresh_process(Path(__file__), {"name": name, "config": cfg},
                                            args.timeout)
                if "error" in measured:
                    print(f"{name}: {measured['error']}")
                    rows.append({"name": name, "error": measured["error"]})
                    continue
            lines = breakdown(cfg, measured)
            show(name, lines)
            row = {"name": name, "config": cfg, "lines": lines}
            if measured is not None:
                peak = measured["peak"] / GiB
                row.update(peak_gib=peak, step_seconds=measured["step_seconds"],
                           target=f"{'met' if peak <= TARGET_GIB else 'missed'} "
                                  f"({peak:.2f} GiB vs {TARGET_GIB} GiB; ZO2 {ZO2_GIB} GiB)")
                print(f"torch peak {peak:.3f} GiB, steady step {measured['step_seconds']:.4f} s: "
                      f"target {row['target']}")
            rows.append(row)
    if args.device == "cuda":
        print(f"\nsaved {save(args.name, {'rows': rows, 'args': vars(args)})} "
              f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
