"""Compute-dtype block slots against fp32 slots (issue 39, item 5): zo-offload bf16-SR on OPT
presets with random weights, the same config with ``slot_dtype=fp32`` (the decoded master in fp32
slots, cast by autocast in every pass) and ``slot_dtype=compute`` (the 2-byte master in its slot,
the forward's form computed from it by the chain kernel): torch peak GPU memory, the steady step,
the planner's figures, and whether every step's loss and projected gradient (and, with
``--digest``, the final weights) are the same bits.

Every row runs in a fresh process: a few steps through the training recipe on synthetic batches.

    python benchmarks/compute_slots.py --models opt-13b,opt-30b --cap 24 --steps 5   # GPU
    python benchmarks/compute_slots.py --device cpu --models tiny-opt --steps 2 --shape 2x16
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

GiB = 1 << 30
SR = {"method": "zo-offload", "amp": "bf16", "codec": "bf16", "master": "compressed-sr"}


def child(spec: dict, result: Path) -> None:
    """One row in this (fresh) process: its ``measure`` summary and torch's peak."""
    import torch
    from common import measure

    from workbench.config import RunConfig

    cfg = RunConfig(**spec["config"])
    if cfg.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    out = measure(cfg, spec["name"], digest=spec["digest"])
    if cfg.device == "cuda":
        out["torch_peak_bytes"] = torch.cuda.max_memory_allocated()
    result.write_text(json.dumps(out, default=str))


def planned(cfg_dict: dict) -> dict:
    from workbench.config import RunConfig
    from workbench.plan.planner import plan

    pl = plan(RunConfig(**{**cfg_dict, "device": "cuda"}))
    return {"planned_peak_gib": pl.peak_gpu_mem_bytes / GiB, "planned_step_s": pl.step_seconds}


def settings(pairs: list[str]) -> dict:
    """``--set KEY=VALUE`` pairs as config values (the CLI's own parsing)."""
    from workbench.config import parse_value

    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        out[key] = parse_value(key, value)
    return out


def specs(args) -> list[dict]:
    b, t = (int(x) for x in args.shape.split("x"))
    out = []
    for model in args.models.split(","):
        for q in (int(x) for x in args.queries.split(",")):
            for slots in args.slots.split(","):
                cfg = {"model": model, **SR, "slot_dtype": slots, "queries": q, "data": "synthetic",
                       "device": args.device, "batch_size": b, "seq_len": t, "steps": args.steps,
                       "lr": 1e-6, "sample_hz": 0.0, "gpu_mem_limit_gb": args.cap,
                       **settings(args.set)}
                out.append({"name": f"{model} {b}x{t} q={q} {slots} slots", "model": model,
                            "queries": q, "slots": slots, "config": cfg, "digest": args.digest})
    return out


COLS = [("model", "model", ""), ("q", "queries", ""), ("slots", "slots", ""),
        ("torch peak GiB", "peak_gib", "{:.2f}"), ("plan GiB", "planned_peak_gib", "{:.2f}"),
        ("step s", "step_seconds", "{:.4f}"), ("plan s", "planned_step_s", "{:.4f}"),
        ("vs fp32", "speed_ratio", "{:.3f}"), ("same bits", "same_bits", ""), ("error", "error", "")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="opt-13b")
    p.add_argument("--queries", default="1", help="comma-separated q values")
    p.add_argument("--shape", default="8x128", help="BxT")
    p.add_argument("--steps", type=int, default=5, help="steps per run (warm-up left out)")
    p.add_argument("--cap", type=float, default=0.0, help="gpu_mem_limit_gb (0: the whole GPU)")
    p.add_argument("--digest", action="store_true", help="digest the final weights too")
    p.add_argument("--slots", default="fp32,compute", help="slot_dtype values, in order")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting for every row (repeatable), e.g. stream_embeddings=true")
    from common import add_fresh_args, finish, in_fresh_process, save

    add_fresh_args(p, "compute_slots", 900.0)
    args = p.parse_args()
    if args.row:
        child(json.loads(args.row), Path(args.result))
        return
    if args.device == "cpu":
        args.cap = 0.0
    t = time.perf_counter()
    out: dict = {"args": {k: v for k, v in vars(args).items() if k not in ("row", "result")},
                 "rows": []}
    last: dict = {}
    for spec in specs(args):
        row = {"model": spec["model"], "queries": spec["queries"], "slots": spec["slots"],
               **planned(spec["config"])}
        r = in_fresh_process(Path(__file__), spec, args.timeout)
        row.update(step_seconds=r.get("step_seconds"), error=r.get("error"),
                   losses=r.get("losses"), projected_grads=r.get("projected_grads"),
                   param_digest=r.get("param_digest"), run=r)
        if r.get("torch_peak_bytes") is not None:
            row["peak_gib"] = r["torch_peak_bytes"] / GiB
        if spec["slots"] == "compute" and last.get("step_seconds") and row["step_seconds"]:
            row["speed_ratio"] = last["step_seconds"] / row["step_seconds"]
            row["same_bits"] = all(row[k] == last[k] for k in
                                   ("losses", "projected_grads", "param_digest"))
        last = row
        out["rows"].append(row)
        print(f"{spec['name']}: " + (row["error"] or f"peak {row.get('peak_gib') or 0:.2f} GiB, "
                                     f"step {row['step_seconds']:.4f} s"), flush=True)
        if args.device == "cuda":
            save(args.name, out)  # after every row: a timeout keeps what ran
    finish(args, out, COLS, "torch peak: max_memory_allocated over setup and steps; step: the "
           "steady step (warm-up left out); vs fp32: the fp32-slot step / this one; same bits: "
           "every step's loss and projected gradient (and the digest with --digest) equal", t)


if __name__ == "__main__":
    main()
