"""Time to accuracy of the ZO rules: SmolLM2-135M on SST-2 (batch 16, all 872 dev examples
evaluated every ``--eval-every`` steps), forward passes and seconds to 75 %, to 79.7 % and to
the best, mean +- std over seeds, per rule and learning rate.

A rule is a set of knob settings (``RULES``; a new rule of ``workbench/engine/zo`` is one more
entry, or ``--rule NAME=knob=value,knob=value`` and ``--lrs NAME=lr,lr,lr,lr`` on the command
line). Every run uses the prompt ``benchmarks/templates.py`` measured best (``--template``),
first-order included. Three phases, each run in a process of its own, ``--procs-per-gpu`` of
them side by side on every visible GPU:
  grid     every rule x its lr grid (>= 4 values) x every seed (``--quick``: seed 0 alone)
  seeds    each rule's best lr (highest mean best accuracy; then fewest passes to it) at the
           seeds the grid did not run (none left in the full mode)
  compose  each pair of rules' best configs merged where their knobs do not clash and the
           config accepts them (e.g. momentum + queries=4), at either parent's best lr, x seeds
A run stops at ``--max-steps`` or when its share of ``--budget-s`` is spent (its last step is
then followed by one more eval). Runs share a GPU, so their seconds are those of a shared
GPU: forward passes are the measure neighbours do not change; ``step_s`` is each rule's step.
"Reached" and "best", over seeds: ``workbench/telemetry/reach.py``.

    python benchmarks/time_to_accuracy.py --quick --budget-s 600 --procs-per-gpu 12  # a lent H200
    python benchmarks/time_to_accuracy.py --budget-s 3600             # all lrs x 3 seeds
    python benchmarks/time_to_accuracy.py --rule hizoo=zo_rule=hizoo --lrs hizoo=1e-6,3e-6,1e-5,3e-5 \\
        --rules mezo,hizoo --quick
    python benchmarks/time_to_accuracy.py --device cpu --model tiny-opt --data embedded \\
        --rules mezo,fo --lrs mezo=1e-3 --lrs fo=1e-3 --seeds 2 --max-steps 6 --eval-every 3
Imports only the engine side (config, recipes, telemetry): no plotly, ipywidgets or datasets.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # templates; this checkout's workbench

from templates import BEST, TEMPLATES  # noqa: E402

LEVELS = (0.75, 0.797)  # 79.7 %: MeZO's best in docs/measurements.md (old template)
#: rule -> its knob settings; the lr grid of each (>= 4 values, around what worked before).
RULES: dict[str, dict] = {
    "mezo": {},
    "one-sided": {"estimator": "one-sided", "queries": 4},
    "queries=4": {"queries": 4},
    "momentum": {"zo_optimizer": "momentum"},
    "adam": {"zo_optimizer": "adam"},
    "fo": {"method": "fo"},
}
LRS: dict[str, list[float]] = {
    "mezo": [1e-5, 2e-5, 4e-5, 8e-5],
    "one-sided": [3e-7, 1e-6, 3e-6, 1e-5],
    "queries=4": [2e-5, 4e-5, 8e-5, 1.6e-4],
    "momentum": [1e-6, 2e-6, 4e-6, 8e-6],
    "adam": [3e-6, 1e-5, 3e-5, 1e-4],
    "fo": [1e-5, 3e-5, 1e-4, 3e-4],
}
ZO_METHODS = ("mezo", "zo-offload")


def parse_knobs(text: str) -> dict:
    """``queries=4,estimator=one-sided`` -> ``{"queries": 4, "estimator": "one-sided"}``
    (integers, then numbers, else words)."""
    out: dict = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        for kind in (int, float):
            try:
                out[key] = kind(value)
                break
            except ValueError:
                continue
        else:
            out[key] = {"true": True, "false": False}.get(value.lower(), value)
    return out


def base_config(args) -> dict:
    template, words = TEMPLATES[args.template]
    return {"model": args.model, "data": args.data, "device": args.device, "method": "mezo",
            "batch_size": 16, "seq_len": args.seq_len, "train_samples": args.train_samples,
            "eval_samples": 0, "steps": args.max_steps, "eval_every": args.eval_every,
            "sample_hz": 0.0, "telemetry": False, "template": template, "label_words": words}


def config_of(args, knobs: dict, lr: float, seed: int) -> dict:
    cfg = {**base_config(args), **knobs, "lr": lr, "seed": seed}
    if cfg["method"] in ZO_METHODS:
        cfg.setdefault("eps", args.eps)
    return cfg


def combines(cfg: dict) -> str:
    """"" when ``RunConfig`` accepts ``cfg``, else its first problem."""
    from workbench.config import ConfigError, RunConfig

    try:
        RunConfig(**cfg)
    except ConfigError as e:
        return e.problems[0]
    except TypeError as e:  # a knob this workbench does not have
        return str(e)
    return ""


# --- one run (a child process) ----------------------------------------------------------------
def child(spec: dict, result: Path) -> None:
    """Train ``spec["config"]`` until its steps or ``spec["seconds"]`` of training; write the
    dev curve with each eval's cost (``telemetry.cost.eval_costs``: recorded passes)."""
    import torch

    from workbench.config import RunConfig
    from workbench.recipes.train import TrainRecipe
    from workbench.telemetry.cost import eval_costs

    torch.set_num_threads(1)  # many runs share the host's cores
    recipe = TrainRecipe(RunConfig(**spec["config"]), out_dir=None, progress=False)
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
              "train_seconds": c.seconds, "forward_passes": c.forward_passes}
             for e, c in zip(rec.evals, eval_costs(rec))]
    seconds = [s["seconds"] for s in rec.steps if s.get("seconds") is not None]
    result.write_text(json.dumps({"curve": curve, "steps": len(rec.steps), "status": rec.status,
                                  "step_s": sum(seconds) / max(len(seconds), 1)}))


# --- running many side by side ----------------------------------------------------------------
def gpus(device: str) -> list[str | None]:
    """Where runs go: every visible GPU (as ``CUDA_VISIBLE_DEVICES`` names it, if set), or
    [None] (one host device)."""
    if device != "cuda":
        return [None]
    import torch

    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return visible or [str(i) for i in range(torch.cuda.device_count())] or [None]


def run_all(specs: list[dict], slots: list[str | None], seconds: float) -> list[dict]:
    """Each spec in its own process, ``len(slots)`` at a time (a slot: a GPU index), each run
    given ``seconds`` of training; the runs' results in ``specs``' order."""
    script = str(Path(__file__).resolve())
    out: list[dict | None] = [None] * len(specs)
    free, running = list(slots), []
    pending = list(enumerate(specs))
    with tempfile.TemporaryDirectory() as tmp:
        while pending or running:
            while pending and free:
                k, spec = pending.pop(0)
                gpu = free.pop(0)
                env = {**os.environ, "OMP_NUM_THREADS": "1"}
                if gpu is not None:
                    env["CUDA_VISIBLE_DEVICES"] = gpu
                result = Path(tmp) / f"{k}.json"
                cmd = [sys.executable, script, "--row", json.dumps({**spec, "seconds": seconds}),
                       "--result", str(result)]
                proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)
                running.append((k, gpu, result, proc, time.perf_counter()))
            time.sleep(0.2)
            for item in [r for r in running if r[3].poll() is not None]:
                k, gpu, result, proc, t0 = item
                running.remove(item)
                free.append(gpu)
                err = proc.stderr.read()
                run = (json.loads(result.read_text()) if proc.returncode == 0
                       and result.is_file() else
                       {"error": f"exit {proc.returncode}: "
                                 f"{' | '.join(err.strip().splitlines()[-2:])}"})
                if "error" not in run and not run.get("curve"):
                    run["error"] = "no evals recorded"
                out[k] = {**specs[k], **run, "process_s": time.perf_counter() - t0, "gpu": gpu}
                best = "" if "error" in run else max(e["accuracy"] for e in run["curve"])
                print(f"  {specs[k]['name']} lr {specs[k]['lr']:.1e} seed "
                      f"{specs[k]['config']['seed']}: " + (run.get("error") or
                      f"{run['steps']} steps, best {best:.3f}"), flush=True)
    return out  # type: ignore[return-value]


# --- the phases ---------------------------------------------------------------------------
def specs_for(args, name: str, knobs: dict, lrs: list[float], seeds: list[int],
              phase: str) -> list[dict]:
    return [{"name": name, "rule": name, "knobs": knobs, "lr": lr, "phase": phase,
             "config": config_of(args, knobs, lr, seed)} for lr in lrs for seed in seeds]


def configurations(runs: list[dict]) -> dict[tuple[str, float], list[dict]]:
    """Runs grouped by (rule name, lr): the seeds of one configuration."""
    out: dict[tuple[str, float], list[dict]] = {}
    for r in runs:
        if "error" not in r and r.get("curve"):
            out.setdefault((r["name"], r["lr"]), []).append(r)
    return out


def summary(runs: list[dict]) -> dict:
    from workbench.telemetry.reach import level_costs, over_seeds

    per = [level_costs(r["curve"], LEVELS) for r in runs]
    return {"seeds": sorted(r["config"]["seed"] for r in runs),
            "zero_shot": runs[0]["curve"][0]["accuracy"],
            "step_s": sum(r["step_s"] for r in runs) / len(runs), **over_seeds(per)}


def best_lr(groups: dict, name: str) -> float | None:
    """The lr of ``name`` with the highest mean best accuracy (ties: fewest passes to it)."""
    mine = [(lr, summary(rs)) for (n, lr), rs in groups.items() if n == name]
    if not mine:
        return None
    return max(mine, key=lambda x: (x[1]["best"]["accuracy"][0],
                                    -x[1]["best"]["forward_passes"][0]))[0]


def compositions(rules: dict, best: dict) -> list[tuple[str, dict, list[float]]]:
    """Each pair of ZO rules with a best lr whose knobs do not clash, merged (a merge equal to
    either parent left out), at both parents' best lrs."""
    out, seen = [], []
    zo = [n for n in rules if best.get(n) is not None
          and rules[n].get("method", "mezo") in ZO_METHODS]
    for a, b in itertools.combinations(zo, 2):
        ka, kb = rules[a], rules[b]
        if any(ka[k] != kb[k] for k in ka.keys() & kb.keys()):
            continue
        merged = {**ka, **kb}
        if merged in (ka, kb) or merged in seen:
            continue
        seen.append(merged)
        out.append((f"{a}+{b}", merged, sorted({best[a], best[b]})))
    return out


def cell(s: dict, key: str, cost: str, scale: float = 1.0, fmt: str = "{:,.0f}") -> str:
    line = s.get(key)
    if not line or not line["reached"]:
        return "-"
    mean, std = line[cost]
    text = f"{fmt.format(mean * scale)}±{fmt.format(std * scale)}"
    return text + ("" if line["reached"] == line["seeds"] else
                   f" ({line['reached']}/{line['seeds']})")


def print_table(rows: list[dict]) -> None:
    keys = [f"{lv:.1%}" for lv in LEVELS]
    head = ["rule", "lr", "seeds", "zero", "best %", "step s"] + [
        f"{w} to {k}" for k in (*keys, "best") for w in ("passes", "s")]
    lines = [head]
    for r in rows:
        s = r["summary"]
        lines.append([r["name"], f"{r['lr']:.1e}", str(len(s["seeds"])),
                      f"{s['zero_shot']:.3f}", cell(s, "best", "accuracy", 100, "{:.1f}"),
                      f"{s['step_s']:.3f}"]
                     + [cell(s, k, c, 1.0, f) for k in (*keys, "best")
                        for c, f in (("forward_passes", "{:,.0f}"), ("train_seconds", "{:.0f}"))])
    widths = [max(len(l[i]) for l in lines) for i in range(len(head))]
    for l in lines:
        print("  ".join(c.rjust(w) for c, w in zip(l, widths)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rules", default=",".join(RULES), help="rule names, comma-separated")
    p.add_argument("--rule", action="append", default=[], metavar="NAME=KNOBS",
                   help="a rule by name: NAME=knob=value,knob=value (repeatable)")
    p.add_argument("--lrs", action="append", default=[], metavar="NAME=LR,LR",
                   help="a rule's lr grid (default: LRS, else mezo's)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--quick", action="store_true",
                   help="the grid at one seed, then the best lr of each rule at the others")
    p.add_argument("--no-compose", action="store_true")
    p.add_argument("--budget-s", type=float, default=600.0, help="wall-clock for everything")
    p.add_argument("--setup-s", type=float, default=30.0, help="a run's start and end besides "
                   "training (import, load, last eval); re-measured after each phase")
    p.add_argument("--procs-per-gpu", type=int, default=8)
    p.add_argument("--max-steps", type=int, default=20_000)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--template", default=BEST, choices=list(TEMPLATES))
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--train-samples", type=int, default=1000,
                   help="training examples (MeZO's 1000; 0 = all 67,349)")
    p.add_argument("--eps", type=float, default=1e-3)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--data", default="sst2")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--name", default="time_to_accuracy")
    p.add_argument("--json", help="also write the results here (any run, plumbing included)")
    p.add_argument("--row", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.row:
        child(json.loads(args.row), Path(args.result))
        return
    rules, lrs = dict(RULES), dict(LRS)
    for text in args.rule:
        name, _, knobs = text.partition("=")
        rules[name] = parse_knobs(knobs)
    problems = []
    for text in args.lrs:
        name, _, values = text.partition("=")
        try:
            lrs[name] = [float(v) for v in values.split(",")]
        except ValueError:
            problems.append(f"--lrs {text}: give NAME=LR,LR,... (numbers)")
    names = args.rules.split(",")
    problems += [f"--rules: {n!r} is not a rule (RULES: {', '.join(rules)}; add one with --rule)"
                for n in names if n not in rules]
    problems += [f"--rule {n}: {why}" for n in names if n in rules
                 for why in [combines(config_of(args, rules[n], 1e-6, 0))] if why]
    if problems or args.seeds < 1 or args.procs_per_gpu < 1:
        print(problems[0] if problems else "--seeds, --procs-per-gpu: at least 1", file=sys.stderr)
        sys.exit(2)
    rules = {n: rules[n] for n in names}
    slots = [g for g in gpus(args.device) for _ in range(args.procs_per_gpu)]
    seeds = list(range(args.seeds))
    grid_seeds = seeds[:1] if args.quick else seeds
    start = time.perf_counter()
    waves = lambda n: math.ceil(n / len(slots))  # noqa: E731
    runs: list[dict] = []

    def phase(name: str, specs: list[dict], waves_after: int) -> None:
        """Run ``specs`` with this phase's share of what is left of the budget (per wave
        alike, less each run's start and end, re-measured from the phase before); save."""
        if not specs:
            return
        left = args.budget_s - (time.perf_counter() - start)
        seconds = max(left / (waves(len(specs)) + waves_after) - args.setup_s, 5.0)
        print(f"{name}: {len(specs)} runs on {len(slots)} slots, {seconds:.0f} s of training "
              "each", flush=True)
        done = run_all(specs, slots, seconds)
        runs.extend(done)
        over = sorted(r["process_s"] - seconds for r in done if "error" not in r)
        if over:  # what a run took besides its training: import, load, the last eval
            args.setup_s = max(over[len(over) // 2], 5.0)
        finish(args, rules, lrs, runs, start, quiet=True)

    n_comp = 0 if args.no_compose else 2 * len(compositions(rules, {n: 1.0 for n in rules}))
    later = (waves(len(rules) * (len(seeds) - len(grid_seeds))) if args.quick else 0) \
        + waves(n_comp * len(seeds))
    phase("grid", [s for n in rules for s in specs_for(
        args, n, rules[n], lrs.get(n, LRS["mezo"]), grid_seeds, "grid")], later)
    best = {n: best_lr(configurations(runs), n) for n in rules}
    if args.quick:
        phase("seeds", [s for n in rules if best[n] is not None for s in specs_for(
            args, n, rules[n], [best[n]], seeds[1:], "seeds")], waves(n_comp * len(seeds)))
    composed = [] if args.no_compose else compositions(rules, best)
    phase("compose", [s for n, k, lr in composed if not combines(config_of(args, k, lr[0], 0))
                      for s in specs_for(args, n, k, lr, seeds, "compose")], 0)
    finish(args, rules, lrs, runs, start, quiet=False)


def finish(args, rules: dict, lrs: dict, runs: list[dict], start: float, quiet: bool) -> None:
    """The rows (a configuration over its seeds) and every run's curve: saved (a GPU run of
    SmolLM2 / SST-2, after every phase: a run cut short keeps what ran; ``--json``), and
    unless ``quiet`` printed."""
    groups = configurations(runs)
    rows = [{"name": n, "lr": lr, "knobs": rs[0]["knobs"], "summary": summary(rs)}
            for (n, lr), rs in groups.items()]
    out = {"args": {k: v for k, v in vars(args).items() if k not in ("row", "result")},
           "levels": LEVELS, "reached": "first eval >= level confirmed by the next eval "
           "(workbench/telemetry/reach.py)", "rules": rules, "lrs": lrs,
           "best_lr": {n: best_lr(groups, n) for n in rules}, "rows": rows, "runs": runs,
           "seconds": time.perf_counter() - start}
    real = args.model == "smollm2-135m" and args.data == "sst2" and args.device == "cuda"
    from common import save

    saved = save(args.name, out) if real else "nothing (a plumbing run)"
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
        saved = f"{saved}; {args.json}"
    if quiet:
        return
    print()
    print_table(rows)
    print(f"\nmean±std over the seeds that reached (k/n when not all did); s = training "
          f"seconds on a GPU shared by {args.procs_per_gpu} runs; saved {saved} "
          f"({out['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
