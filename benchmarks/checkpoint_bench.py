"""What asynchronous checkpoints cost the step (issue 16, part 6), every row in a fresh process.

Per case, two runs of the same steps: without checkpoints, and with ``checkpoint_every=N``.
Over the window of steps [N, 3N) (two snapshots, N and 2N, and their writes) it reports

* the mean step time with checkpoints against without (target: at most +10%);
* the step that overlaps each snapshot's host self-copy (steps N and 2N) against the plain run's
  median step (target: at most 1.1x);
* each write's seconds (from the writer's ``checkpoint`` event), the self-copy's seconds (its
  ``self-copy`` events), snapshots skipped because the last write was still running, and the
  shortest interval the disk keeps up with: ceil(longest write / mean step). ``skipped > 0``
  means N was too short for this disk and the row says so.

    python benchmarks/checkpoint_bench.py --cases opt-1.3b-fp32      # ~2 min on an H200
    python benchmarks/checkpoint_bench.py --cases opt-6.7b-sr        # ~5 min
    python benchmarks/checkpoint_bench.py --device cpu --cases tiny-opt-fp32 --every 4  # plumbing
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import tempfile
import time
from pathlib import Path

# common first: it puts this checkout on sys.path
from common import add_fresh_args, finish, in_fresh_process, save

#: case -> (model, zo-offload settings, default checkpoint interval in steps)
CASES = {"opt-1.3b-fp32": ("opt-1.3b", {}, 40),
         "opt-6.7b-sr": ("opt-6.7b", {"master": "compressed-sr", "codec": "bf16"}, 30),
         "tiny-opt-fp32": ("tiny-opt", {}, 4),
         "tiny-opt-sr": ("tiny-opt", {"master": "compressed-sr", "codec": "bf16"}, 4)}
TARGET_MEAN, TARGET_COPY = 0.10, 1.10


def child(spec: dict, result: Path) -> None:
    """One run in this (fresh) process: its per-step seconds and checkpoint events."""
    from workbench.config import RunConfig
    from workbench.recipes.train import TrainRecipe

    cfg = RunConfig(**spec["config"])
    recipe = TrainRecipe(cfg, out_dir=None, progress=False)
    try:
        recipe.setup()
        recipe.dev_data = None
        recipe.train()
        rec = recipe.save(digest_params=False)
        ck = recipe.checkpointer
        out = {"seconds": [s["seconds"] for s in rec.steps],
               "warmup_steps": rec.summary.get("warmup_steps"),
               "written": len(ck.written) if ck else 0, "skipped": ck.skipped if ck else 0,
               # the writer's events: step = the snapshot's step - 1; the final one is untimed
               "writes": [[e.step + 1, e.seconds] for e in rec.events if e.op == "checkpoint"],
               "copies": {}}
        for e in rec.events:
            if e.op == "self-copy":
                span = out["copies"].setdefault(str(e.step), [e.start, e.end])
                span[0], span[1] = min(span[0], e.start), max(span[1], e.end)
        out["peak_gpu_mem_bytes"] = rec.summary.get("peak_gpu_mem_bytes")
    finally:
        recipe.cleanup()
        if cfg.checkpoint_dir:
            shutil.rmtree(cfg.checkpoint_dir, ignore_errors=True)
    result.write_text(json.dumps(out))


def compare(case: str, every: int, plain: dict, ckpt: dict) -> dict:
    """One table line from the two runs."""
    row = {"case": case, "every": every, "error": plain.get("error") or ckpt.get("error")}
    if row["error"]:
        return row
    window = slice(every, 3 * every)
    mean_plain = statistics.fmean(plain["seconds"][window])
    mean_ckpt = statistics.fmean(ckpt["seconds"][window])
    median_plain = statistics.median(plain["seconds"][plain["warmup_steps"]:])
    copy_steps = [s for s in (every, 2 * every) if s < len(ckpt["seconds"])]
    writes = [w for s, w in ckpt["writes"] if s in copy_steps]
    copies = [ckpt["copies"][str(s)] for s in copy_steps if str(s) in ckpt["copies"]]
    row.update(mean_plain_s=mean_plain, mean_ckpt_s=mean_ckpt, added=mean_ckpt / mean_plain - 1,
               median_plain_s=median_plain,
               copy_step_s=[ckpt["seconds"][s] for s in copy_steps],
               copy_step_x=[ckpt["seconds"][s] / median_plain for s in copy_steps],
               self_copy_s=[b - a for a, b in copies], write_s=writes,
               written=ckpt["written"], skipped=ckpt["skipped"],
               warmup=f"{plain['warmup_steps']}/{ckpt['warmup_steps']}")
    row["min_every"] = math.ceil(max(writes) / mean_ckpt) if writes else None
    row["keeps_up"] = ckpt["skipped"] == 0 and (row["min_every"] or 0) <= every
    ok = [row["added"] <= TARGET_MEAN, max(row["copy_step_x"]) <= TARGET_COPY]
    row["targets"] = " ".join("met" if m else "missed" for m in ok)
    return row


COLS = [("case", "case", ""), ("every", "every", ""), ("plain s", "mean_plain_s", "{:.4f}"),
        ("ckpt s", "mean_ckpt_s", "{:.4f}"), ("added", "added", "{:+.1%}"),
        ("copy steps x", "copy_step_txt", ""), ("self-copy s", "self_copy_txt", ""),
        ("write s", "write_txt", ""), ("skipped", "skipped", ""),
        ("min every", "min_every", ""), ("warm-up", "warmup", ""), ("targets", "targets", ""),
        ("error", "error", "")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="opt-1.3b-fp32,opt-6.7b-sr",
                   help=f"comma-separated: {', '.join(CASES)}")
    p.add_argument("--every", type=int, default=0,
                   help="checkpoint interval in steps (0: each case's default)")
    p.add_argument("--batch", default="16x128", help="batch_size x seq_len")
    p.add_argument("--dir", default=tempfile.gettempdir(), help="where checkpoints are written")
    add_fresh_args(p, "checkpoint_cost", 400.0)
    args = p.parse_args()
    if args.row:
        child(json.loads(args.row), Path(args.result))
        return
    unknown = set(args.cases.split(",")) - set(CASES)
    if unknown:
        p.error(f"--cases: {', '.join(sorted(unknown))} not among {', '.join(CASES)}")
    b, t = (int(x) for x in args.batch.split("x"))

    from workbench.presets import PRESETS

    start = time.perf_counter()
    out: dict = {"args": {k: v for k, v in vars(args).items() if k not in ("row", "result")},
                 "targets": {"added_mean": TARGET_MEAN, "copy_step_x": TARGET_COPY},
                 "runs": {}, "rows": []}
    for case in args.cases.split(","):
        model, extra, every = CASES[case]
        every = args.every or every
        preset = PRESETS.get(model)
        need = (preset.total_params() if preset else 0) * (2 if extra.get("master") else 4)
        free = shutil.disk_usage(args.dir).free
        if free < 2.5 * need:  # keep_last=1: the newest and the one being written
            out["rows"].append({"case": case, "error": f"skipped: {need / 1e9:.0f} GB "
                                f"checkpoints, {free / 1e9:.0f} GB free in {args.dir}"})
            continue
        cfg = {"model": model, "method": "zo-offload", "data": "synthetic", "device": args.device,
               "batch_size": b, "seq_len": t, "steps": 3 * every, "lr": 1e-7, "sample_hz": 0.0,
               "keep_last": 1, **extra}
        runs = {}
        for label, more in (("plain", {}), ("ckpt", {
                "checkpoint_every": every,
                "checkpoint_dir": str(Path(args.dir) / f"wb-ckpt-cost-{case}")})):
            spec = {"name": f"{case} {label}", "config": {**cfg, **more}}
            runs[label] = in_fresh_process(Path(__file__), spec, args.timeout)
            r = runs[label]
            print(f"{spec['name']}: " + (r["error"] if "error" in r else
                  f"{statistics.fmean(r['seconds'][every:]):.4f} s/step over steps >= {every}, "
                  f"written {r['written']}, skipped {r['skipped']}, "
                  f"process {r['process_seconds']:.0f} s"), flush=True)
        out["runs"][case] = runs
        row = compare(case, every, runs["plain"], runs["ckpt"])
        for key, txt, fmt in (("copy_step_x", "copy_step_txt", "{:.2f}"),
                              ("self_copy_s", "self_copy_txt", "{:.2f}"),
                              ("write_s", "write_txt", "{:.1f}")):
            if key in row:
                row[txt] = " ".join(fmt.format(v) for v in row[key])
        out["rows"].append(row)
        if args.device == "cuda":
            save(args.name, out)  # after every case: a timeout keeps what ran
    finish(args, out, COLS, "mean step over steps [N, 3N) (snapshots after steps N-1 and 2N-1), "
           "with vs without checkpoints; copy steps x = steps N and 2N (overlapping the host "
           "self-copy) over the plain median step; min every = ceil(longest write / mean step): "
           f"the shortest interval this disk keeps up with. Targets: added <= {TARGET_MEAN:.0%}, "
           f"copy steps <= {TARGET_COPY}x.", start)

if __name__ == "__main__":
    main()
