"""Several perturbations per step (``queries``) on zo-offload: the step time of q in {1, 2, 4, 8}
at a PCIe-bound size, every row in a fresh process (issue 40, item 5).

Each streamed block crosses PCIe once per step whatever q is, so the 2q forward passes and the
perturbations of q queries run under the same transfers until compute overtakes them. Per
(model, q): the steady step (warm-up steps left out), its ratio to q = 1 of the same model,
the planner's step for the same config, and the projected time to MeZO's best accuracy when
``--steps-to-target`` gives the steps each q needed on the time-to-accuracy benchmark
(``benchmarks/time_to_accuracy.py``'s JSON). Targets at opt-13b 8 x 128 bf16-SR: q = 2 <= 1.10x
the q = 1 step, q = 4 <= 1.25x.

    python benchmarks/zo_queries.py                                    # 13b, 6.7b, 30b (~10 min)
    python benchmarks/zo_queries.py --models opt-13b --queries 1,2,4
    python benchmarks/zo_queries.py --device cpu --models tiny-opt --shapes 2x16 --steps 4  # plumbs
    python benchmarks/zo_queries.py --models opt-6.7b,opt-13b --queries 1 --rules sgd,momentum,adam

``--rules``: the ZO optimizers (``zo_optimizer``) measured at each q; momentum and adam stream
their per-weight state with each block (1 and 2 x the block's bytes each way), so their rows
say what that state costs against sgd's.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

TARGETS = {2: 1.10, 4: 1.25}  # q -> the most its step may cost, x the q = 1 step (opt-13b)
BF16_SR = {"amp": "bf16", "codec": "bf16", "master": "compressed-sr"}


def child(spec: dict, result: Path) -> None:
    """One row in this (fresh) process: its measure() summary and the planner's step."""
    from common import measure

    from workbench.config import RunConfig
    from workbench.plan.planner import plan

    cfg = RunConfig(**spec["config"])
    out = measure(cfg, spec["name"])
    out["planned_step_s"] = plan(cfg).step_seconds
    result.write_text(json.dumps(out, default=str))


def rows_for(args) -> list[dict]:
    specs = []
    for model in args.models:
        for q, rule in [(q, rule) for q in args.queries for rule in args.rules]:
            b, t = args.shape
            cfg = {"model": model, "method": "zo-offload", "data": "synthetic",
                   "device": args.device, "batch_size": b, "seq_len": t, "steps": args.steps,
                   "lr": 1e-7, "queries": q,  # q = 1: the central step, the baseline
                   "estimator": args.estimator if q > 1 else "central", "zo_optimizer": rule,
                   **(BF16_SR if args.device == "cuda" else {})}
            specs.append({"name": f"{model} {b}x{t} q={q} {rule}", "config": cfg,
                          "model": model, "queries": q, "rule": rule})
    return specs


def summarise(runs: list[dict], steps_to_target: dict[int, int]) -> list[dict]:
    """One line per run: its step against q = 1 of the same model, and the projected time to
    the target accuracy (steps the q needed x this step)."""
    base = {r["model"]: r["step_seconds"] for r in runs
            if r["queries"] == 1 and r.get("rule", "sgd") == "sgd" and "error" not in r}
    rows = []
    for r in runs:
        line = {k: r.get(k) for k in ("model", "queries", "rule", "step_seconds",
                                      "planned_step_s", "peak_gpu_mem_gb", "error")}
        if "error" not in r and r["model"] in base:
            line["vs_q1"] = r["step_seconds"] / base[r["model"]]
            limit = TARGETS.get(r["queries"])
            if limit is not None and r["model"] == "opt-13b" and r.get("rule", "sgd") == "sgd":
                line["target"] = f"<= {limit:.2f}x: " + ("met" if line["vs_q1"] <= limit
                                                          else "missed")
            if r["queries"] in steps_to_target:
                line["to_target_h"] = steps_to_target[r["queries"]] * r["step_seconds"] / 3600
        rows.append(line)
    return rows


COLS = [("model", "model", ""), ("q", "queries", "{}"), ("rule", "rule", ""),
        ("step s", "step_seconds", "{:.4f}"), ("x q=1 sgd", "vs_q1", "{:.3f}"), ("plan s", "planned_step_s", "{:.4f}"),
        ("peak GB", "peak_gpu_mem_gb", "{:.2f}"), ("to target h", "to_target_h", "{:.2f}"),
        ("target", "target", ""), ("error", "error", "")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="opt-13b,opt-6.7b,opt-30b")
    p.add_argument("--queries", default="1,2,4,8")
    p.add_argument("--estimator", default="central", choices=("central", "one-sided"))
    p.add_argument("--rules", default="sgd", help="zo_optimizer values, comma-separated")
    p.add_argument("--shapes", default="8x128", help="one BxT")
    p.add_argument("--steps", type=int, default=6, help="steps per run (warm-up left out)")
    p.add_argument("--steps-to-target", default="",
                   help="JSON {q: steps} (steps each q needed to reach the target accuracy)")
    from common import add_fresh_args, finish, in_fresh_process, save

    add_fresh_args(p, "zo_queries", 300.0)
    args = p.parse_args()
    if args.row:
        child(json.loads(args.row), Path(args.result))
        return
    args.models = args.models.split(",")
    args.queries = [int(q) for q in args.queries.split(",")]
    args.rules = args.rules.split(",")
    args.shape = tuple(int(x) for x in args.shapes.split("x"))
    to_target = {int(k): v for k, v in json.loads(args.steps_to_target or "{}").items()}
    t = time.perf_counter()
    out: dict = {"args": {k: v for k, v in vars(args).items() if k not in ("row", "result")},
                 "targets": {str(q): x for q, x in TARGETS.items()}, "runs": [], "rows": []}
    for spec in rows_for(args):
        r = in_fresh_process(Path(__file__), spec, args.timeout)
        r.update(model=spec["model"], queries=spec["queries"], rule=spec["rule"])
        out["runs"].append(r)
        print(f"{spec['name']}: " + (r["error"] if "error" in r else
              f"step {r['step_seconds']:.4f} s (plan {r['planned_step_s']:.4f} s), peak "
              f"{r['peak_gpu_mem_gb']:.2f} GB, process {r['process_seconds']:.0f} s"), flush=True)
        out["rows"] = summarise(out["runs"], to_target)
        if args.device == "cuda":
            save(args.name, out)  # after every row: a timeout keeps what ran
    finish(args, out, COLS, "steady step (warm-up left out), zo-offload bf16 autocast, bf16 "
           "codec, compressed-sr master; x q=1: against the same model's q = 1 row", t)


if __name__ == "__main__":
    main()
