"""MeZO as MeZO runs it in half precision (issue 40, item 4): torch peak GPU memory and step
time of mezo with fp32 weights under bf16 autocast, mezo with bf16 weights rounded to nearest
(``master=compressed``, MeZO's own half-precision loading) and stochastically
(``master=compressed-sr``), and zo-offload bf16-SR, on OPT presets with random weights.

Every row runs in a fresh process: a few steps through the training recipe on synthetic
batches, then the torch allocator's peak, the steady step (warm-up left out) and the planner's
figures for the same config. A row the planner says cannot fit this GPU is not started: it
reports the planner's refusal (mezo fp32 at opt-30b needs about 113 GiB).

    python benchmarks/mezo_half.py --out DIR --models opt-13b,opt-30b --steps 5   # GPU
    python benchmarks/mezo_half.py --device cpu --models tiny-opt --steps 2 --shape 2x16  # plumbs
"""
from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

GiB = 1 << 30
BF16 = {"amp": "bf16", "codec": "bf16"}
MODES = {"mezo fp32 weights": {"method": "mezo", "amp": "bf16"},
         "mezo bf16 nearest": {"method": "mezo", **BF16, "master": "compressed"},
         "mezo bf16 SR": {"method": "mezo", **BF16, "master": "compressed-sr"},
         "zo-offload bf16-SR": {"method": "zo-offload", **BF16, "master": "compressed-sr"}}


def child(spec: dict, result: Path) -> None:
    """One row in this (fresh) process: its ``measure`` summary and torch's peak."""
    import torch
    from common import measure

    from workbench.config import RunConfig

    cfg = RunConfig(**spec["config"])
    if cfg.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    out = measure(cfg, spec["name"])
    if cfg.device == "cuda":
        out["torch_peak_bytes"] = torch.cuda.max_memory_allocated()
    result.write_text(json.dumps(out, default=str))


def refusal(cfg_dict: dict, gpu: str | None = None) -> str | None:
    """The planner's reason the config cannot run here (None: it fits); ``gpu``: a GPU of the
    planner's table instead of this machine's calibration."""
    from workbench.config import RunConfig
    from workbench.plan.fit import PlanError, check_fits

    try:
        check_fits(RunConfig(**cfg_dict), gpu=gpu)
    except PlanError as e:
        return str(e).split("; try ")[0]
    return None


def planned(cfg_dict: dict) -> dict:
    from workbench.config import RunConfig
    from workbench.plan.planner import plan

    pl = plan(RunConfig(**{**cfg_dict, "device": "cuda"}))
    return {"planned_peak_gib": pl.peak_gpu_mem_bytes / GiB, "planned_step_s": pl.step_seconds,
            "planned_param_gib": pl.gpu_param_bytes / GiB}


def specs(args) -> list[dict]:
    b, t = (int(x) for x in args.shape.split("x"))
    out = []
    for model in args.models.split(","):
        for mode in args.modes.split(","):
            cfg = {"model": model, **MODES[mode], "data": "synthetic", "device": args.device,
                   "batch_size": b, "seq_len": t, "steps": args.steps, "lr": 1e-7,
                   "sample_hz": 0.0}
            out.append({"name": f"{model} {b}x{t} {mode}", "model": model, "mode": mode,
                        "config": cfg})
    return out


COLS = [("model", "model", ""), ("mode", "mode", ""), ("torch peak GiB", "peak_gib", "{:.2f}"),
        ("plan GiB", "planned_peak_gib", "{:.2f}"), ("weights GiB", "planned_param_gib",
                                                       "{:.2f}"),
        ("step s", "step_seconds", "{:.4f}"), ("plan s", "planned_step_s", "{:.4f}"),
        ("refused / error", "error", "")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="opt-1.3b,opt-13b,opt-30b")
    p.add_argument("--modes", default=",".join(MODES), help="of: " + ", ".join(MODES))
    p.add_argument("--shape", default="8x128", help="BxT")
    p.add_argument("--steps", type=int, default=5, help="steps per run (warm-up left out)")
    p.add_argument("--out", default="", help="a folder to copy the JSON into as well")
    from common import add_fresh_args, finish, in_fresh_process, save

    add_fresh_args(p, "mezo_half", 600.0)
    args = p.parse_args()
    if args.row:
        child(json.loads(args.row), Path(args.result))
        return
    t = time.perf_counter()
    out: dict = {"args": {k: v for k, v in vars(args).items() if k not in ("row", "result")},
                 "rows": []}
    for spec in specs(args):
        row = {"model": spec["model"], "mode": spec["mode"], **planned(spec["config"])}
        refused = refusal(spec["config"]) if args.device == "cuda" else None
        if refused is not None:
            row["error"] = f"planner: {refused}"
        else:
            r = in_fresh_process(Path(__file__), spec, args.timeout)
            row.update(step_seconds=r.get("step_seconds"), error=r.get("error"), run=r)
            if r.get("torch_peak_bytes") is not None:
                row["peak_gib"] = r["torch_peak_bytes"] / GiB
        out["rows"].append(row)
        print(f"{spec['name']}: " + (row["error"] or f"peak {row.get('peak_gib') or 0:.2f} GiB, "
                                     f"step {row['step_seconds']:.4f} s"), flush=True)
        if args.device == "cuda":
            saved = save(args.name, out)  # after every row: a timeout keeps what ran
            if args.out:
                Path(args.out).mkdir(parents=True, exist_ok=True)
                shutil.copy(saved, Path(args.out) / saved.name)
    finish(args, out, COLS, "torch peak: max_memory_allocated over setup and steps; step: the "
           "steady step (warm-up left out); plan: the planner's peak and step for the config",
           t)


if __name__ == "__main__":
    main()
