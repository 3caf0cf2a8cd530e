"""Step time with asynchronous checkpoints vs none vs a synchronous torch.save (issue: checkpoints).

For each model, zo-offload runs with: no checkpoint; checkpoint_every=1 (the async scheme: the
step waits only for host self-copies; a snapshot due while the last is still being written is
skipped and the step log covers it); and a synchronous torch.save of all weights after every
step. Disk use is checked first: a model whose checkpoint would not fit twice is skipped.
``--master compressed-sr --codec bf16`` halves the checkpoint (the host master is bf16), which is
how opt-6.7b fits the GPU machine's 64 GB disk.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from common import save, table

from workbench.config import RunConfig
from workbench.presets import PRESETS
from workbench.recipes.train import TrainRecipe


class SyncSaveRecipe(TrainRecipe):
    """The baseline: every checkpoint is a blocking torch.save of all weights, fsynced."""

    def _checkpoint(self) -> None:
        path = self.checkpointer.root / "sync.pt"
        torch.save([f.detach().cpu() for f in self.engine.state_flats()], path)
        with open(path, "rb+") as fh:
            os.fsync(fh.fileno())


def timed_run(cfg: RunConfig, recipe_cls=TrainRecipe) -> dict:
    torch.cuda.empty_cache()
    recipe = recipe_cls(cfg, out_dir=None, progress=False)
    try:
        recipe.setup()
        recipe.dev_data = None
        t = time.perf_counter()
        recipe.train()
        wall = time.perf_counter() - t
        rec = recipe.save(digest_params=False)
        written = len(recipe.checkpointer.written) if recipe.checkpointer else 0
        skipped = recipe.checkpointer.skipped if recipe.checkpointer else 0
    finally:
        recipe.cleanup()
    return {"step_seconds": rec.summary["step_seconds"],
            "wall_seconds": wall, "written": written,
            "skipped": skipped, "steps": len(rec.steps)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="opt-1.3b,opt-2.7b,opt-6.7b")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--dir", default=tempfile.gettempdir())
    p.add_argument("--master", default="fp32", choices=["fp32", "compressed-sr"])
    p.add_argument("--codec", default="fp32")
    p.add_argument("--name", default="checkpoint")
    p.add_argument("--variants", default="none,async,sync")
    args = p.parse_args()
    rows = []
    for model in args.models.split(","):
        nbytes = PRESETS[model].total_params() * (2 if args.master == "compressed-sr" else 4)
        free = shutil.disk_usage(args.dir).free
        if free < 2.5 * nbytes:
            rows.append({"model": model, "error": f"skipped: {nbytes / 1e9:.0f} GB checkpoints, "
                                                  f"{free / 1e9:.0f} GB free on disk"})
            print(rows[-1], flush=True)
            continue
        root = Path(args.dir) / f"wb-ckpt-{model}"
        base = RunConfig(model=model, method="zo-offload", data="synthetic", device="cuda",
                         batch_size=16, seq_len=128, steps=args.steps, lr=1e-7,
                         checkpoint_dir=str(root), keep_last=1, sample_hz=0.0,
                         master=args.master, codec=args.codec)
        row = {"model": model, "master": args.master, "checkpoint_gb": nbytes / 1e9}
        for label, cfg, cls in (("none", base.replace(checkpoint_dir=""), TrainRecipe),
                                ("async", base.replace(checkpoint_every=1), TrainRecipe),
                                ("sync", base.replace(checkpoint_every=1), SyncSaveRecipe)):
            if label not in args.variants.split(","):
                continue
            shutil.rmtree(root, ignore_errors=True)
            r = timed_run(cfg, cls)
            # Step time from the GPU's own end-of-step markers: a host busy saving leaves the
            # GPU idle between steps, and that idle time counts; the final save does not.
            row[f"{label}_s"] = r["step_seconds"]
            if label == "async":
                row["async_written"], row["async_skipped"] = r["written"], r["skipped"]
            print(model, label, r, flush=True)
        shutil.rmtree(root, ignore_errors=True)
        for label in ("async", "sync"):
            if f"{label}_s" in row:
                row[f"{label}_overhead"] = row[f"{label}_s"] / row["none_s"] - 1
        rows.append(row)
    cols = [("model", "model", ""), ("ckpt GB", "checkpoint_gb", "{:.1f}"),
            ("none s/step", "none_s", "{:.3f}"), ("async s/step", "async_s", "{:.3f}"),
            ("async +%", "async_overhead", "{:.1%}"), ("written", "async_written", ""),
            ("skipped", "async_skipped", ""), ("sync s/step", "sync_s", "{:.3f}"),
            ("sync +%", "sync_overhead", "{:.1%}"), ("error", "error", "")]
    path = save(args.name, {"rows": rows, "args": vars(args)})
    print("\n" + table(rows, cols) + f"\nsaved {path}")


if __name__ == "__main__":
    main()
