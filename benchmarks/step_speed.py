"""Steady step time of one configuration in fresh processes, to compare code trees A / B.

For changes that must not slow a method down (issue 17: the ZO core must leave zo-offload's
speed at opt-1.3b 1 x 2048 within 2%). Each repeat runs every tree once, interleaved (A B A B
...), each run in a fresh Python process with that tree's ``workbench`` first on the path, so
clock drift and warm caches favour neither. A row per tree: the median over repeats of each
run's median steady step (steps after ``--warmup``), tokens/s, and the ratio to the first tree.

Usage (GPU machine; BASE a checkout of the commit to compare against):
  python benchmarks/step_speed.py --trees BASE,. --model opt-1.3b --shape 1x2048 \
      --method zo-offload --steps 30 --repeats 3
A tree may carry settings of its own after a colon (one tree, two settings compared; trees
then separated by ';'):
  python benchmarks/step_speed.py --trees ".;.:prefetch_depth=2" --amp bf16 --codec bf16 \
      --master compressed-sr --model opt-6.7b --shape 16x128
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from common import save, table

CHILD = r"""
import json, sys, torch
import workbench
from workbench.config import RunConfig
from workbench.recipes.train import TrainRecipe
cfg = RunConfig(**json.loads(sys.argv[1]))
recipe = TrainRecipe(cfg, out_dir=None, progress=False)
try:
    recipe.setup()
    recipe.dev_data = None  # speed runs: no eval
    recipe.train()
    rec = recipe.save(digest_params=False)
finally:
    recipe.cleanup()
print("RESULT " + json.dumps({"workbench": workbench.__file__,
                              "seconds": [s["seconds"] for s in rec.steps],
                              "peak_gpu_mem_bytes": rec.summary.get("peak_gpu_mem_bytes")}))
"""

COLS = [("tree", "tree", ""), ("median step s", "step_seconds", "{:.4f}"),
        ("spread s", "spread", "{:.4f}"), ("tokens/s", "tokens_per_s", "{:,.0f}"),
        ("ratio", "ratio", "{:.4f}"), ("peak GB", "peak_gb", "{:.2f}")]


def one_run(tree: Path, cfg: dict, warmup: int) -> dict:
    """One fresh process on ``tree``: its steady steps' median seconds and peak memory."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg)], env=env, cwd=tree,
                       capture_output=True, text=True, timeout=3600)
    line = next((l for l in r.stdout.splitlines() if l.startswith("RESULT ")), None)
    if r.returncode != 0 or line is None:
        raise RuntimeError(f"{tree}: run failed\n{r.stderr[-3000:]}")
    out = json.loads(line[len("RESULT "):])
    if not out["workbench"].startswith(str(tree)):
        raise RuntimeError(f"{tree}: imported {out['workbench']}, not this tree")
    steady = out["seconds"][warmup:]
    return {"step_seconds": statistics.median(steady), "peak": out["peak_gpu_mem_bytes"]}


def parse_tree(entry: str) -> tuple[Path, dict]:
    """``PATH[:knob=value[,knob=value]]`` -> (root, settings); a value is JSON where it parses
    (numbers, true / false), else the string."""
    path, _, sets = entry.partition(":")
    settings = {}
    for item in filter(None, sets.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise SystemExit(f"--trees: '{item}' in '{entry}' is not knob=value")
        try:
            settings[key] = json.loads(value)
        except json.JSONDecodeError:
            settings[key] = value
    return Path(path).resolve(), settings


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trees", required=True,
                   help="repository roots separated by ';' or ',' (each PATH[:knob=value,...]; "
                        "with settings, separate trees by ';'); first = A")
    p.add_argument("--model", default="opt-1.3b")
    p.add_argument("--method", default="zo-offload")
    p.add_argument("--shape", default="1x2048", help="batch x seq_len")
    p.add_argument("--amp", default="off")
    p.add_argument("--codec", default="fp32", help="zo-offload's transfer codec")
    p.add_argument("--master", default="fp32", help="zo-offload's host master")
    p.add_argument("--device", default="cuda", help="cpu: a smoke test of this script")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3, help="first steps left out (kernel builds)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--name", default="step_speed")
    args = p.parse_args()
    sep = ";" if ";" in args.trees or ":" in args.trees else ","
    trees = [parse_tree(t) for t in args.trees.split(sep)]
    b, t = (int(x) for x in args.shape.split("x"))
    cfg = dict(model=args.model, method=args.method, data="synthetic", device=args.device,
               amp=args.amp, codec=args.codec, master=args.master, batch_size=b, seq_len=t, steps=args.steps, lr=1e-7, sample_hz=0.0)
    runs: list[list[dict]] = [[] for _ in trees]
    labels = [str(root) + "".join(f" {k}={v}" for k, v in sets.items()) for root, sets in trees]
    for rep in range(args.repeats):
        for (root, sets), label, mine in zip(trees, labels, runs):
            mine.append(one_run(root, {**cfg, **sets}, args.warmup))
            print(f"repeat {rep} {label}: {mine[-1]['step_seconds']:.4f} s", flush=True)
    rows = []
    for label, mine in zip(labels, runs):
        secs = [r["step_seconds"] for r in mine]
        step = statistics.median(secs)
        rows.append({"tree": label, "step_seconds": step, "spread": max(secs) - min(secs),
                     "tokens_per_s": b * t / step, "runs": mine,
                     "peak_gb": (mine[0]["peak"] or 0) / 1e9})
    for r in rows:
        r["ratio"] = rows[0]["step_seconds"] / r["step_seconds"]  # > 1: faster than A
    print(table(rows, COLS))
    print(save(args.name, {"config": cfg, "warmup": args.warmup, "rows": rows}))


if __name__ == "__main__":
    main()
