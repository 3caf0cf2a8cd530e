"""``python -m workbench demo``: the main job. MeZO then ZO-offload on the same settings, side
by side, with what each learned and whether they trained the same weights, and a report.

    python -m workbench demo [--set KEY=VALUE ...] [--out runs/demo]
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

from workbench.config import (ConfigError, check_environment, load_config, parse_sets,
                              read_settings)
from workbench.models.smollm2 import unavailable as smollm2_unavailable
from workbench.telemetry.evals import eval_value, main_metric

#: The demo: the real pretrained SmolLM2-135M learns the embedded sentiment set (80 dev
#: examples, all evaluated) with LoRA adapters, MeZO then zo-offload. ZO over 0.46 M adapter
#: weights learns in tens of steps where full-parameter ZO over 135 M needs thousands; ZO's
#: progress per step hardly depends on the batch, so many small steps learn most per second
#: (4 x 80 steps: dev loss 0.97 -> 0.71, where 8 x 40 reached 0.87 and lr 1e-2 diverged).
#: Sized so both runs take about two minutes on two CPU cores (docs/measurements.md).
DEMO = {"model": "smollm2-135m", "data": "embedded", "peft": "lora", "steps": "60",
        "batch_size": "4", "seq_len": "64", "lr": "2e-3", "eps": "1e-3", "eval_samples": "0"}
#: Where SmolLM2's weights cannot be had: tiny-opt (random weights), full-parameter, at a batch
#: and lr whose loss falls on either device (CPU: training loss 8.3 -> 4.3, dev loss
#: 8.26 -> 3.19, health "learning"; at the CPU demo's 4 x 64 the same lr diverged, 8.26 -> 47).
DEMO_FALLBACK = {"model": "tiny-opt", "peft": "none", "lr": "1e-3", "batch_size": "16",
                 "steps": "40", "eval_every": "0"}
#: On a GPU, the same pair for longer, at the batch and lr that stayed stable for 1,000 steps on
#: SST-2 (docs/measurements.md, adapters): the dev accuracy climbs above zero-shot (a GPU test
#: checks it), eval_every draws its curve; 200 steps keep the whole demo near a minute and a
#: half ...
DEMO_GPU = {"steps": "200", "batch_size": "16", "lr": "1e-3", "eval_every": "50"}
#: ... then a pair whose blocks make offloading matter: tiny or 135 M-parameter blocks leave
#: the GPU waiting for the host, so their times compare Python overheads. opt-1.3b (opt-350m on
#: a GPU under 16 GiB) on synthetic 16 x 128 batches is compute-bound as real runs are. Its
#: weights (random data, 20 steps) are not worth 5 GB of disk each: save_final is off.
DEMO_GPU_SPEED = {"model": "opt-1.3b", "data": "synthetic", "peft": "none", "steps": "20",
                  "batch_size": "16", "seq_len": "128", "lr": "1e-6", "eps": "1e-3",
                  "save_final": "false"}


def demo_command(args: argparse.Namespace, config_file: str | None,
                 summary: Callable[[list], str],
                 report: Callable[[list[Path], Path], Path | None]) -> int:
    """MeZO then ZO-offload on the same settings, compared; on a GPU a second pair for speed
    and memory. Exit 1 where a pair's digests differ.

    Args:
        config_file: the one ``--config`` file, or None.
        summary: runs -> the side-by-side table (``cli.format_summary``).
        report: (run directories, HTML path) -> the report written, or None without the UI.
    """
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    sets = parse_sets(args.set or [])  # over each pair's settings
    given = set(sets) | (set(read_settings(Path(config_file))) if config_file is not None
                         else set())
    mine = [k for k in ("method", "device") if k in given]
    if mine:  # the demo is a comparison of two methods on this machine's device
        raise ConfigError([f"{k}: the demo sets it itself (mezo, then zo-offload, on "
                           f"device={device}); use python -m workbench run to choose it"
                           for k in mine])
    demo, why = demo_settings(device)
    if why:
        print(f"note: training tiny-opt (random weights) instead of SmolLM2-135M: {why}")
    pairs = [(Path(args.out), demo)]
    if device == "cuda":
        speed = dict(DEMO_GPU_SPEED)
        if torch.cuda.get_device_properties(0).total_memory < 16 * 2**30:
            speed["model"] = "opt-350m"
        pairs.append((Path(args.out) / "speed", speed))
    status = 0
    for out, settings in pairs:
        if settings is not demo:
            print(f"== speed: {settings['model']} on synthetic tokens (random: nothing to learn, "
                  "so its health reads \"not learning\"); this pair times the steps and GPU memory "
                  "where offloading matters")
        records = demo_pair(config_file, sets, out, {**settings, "device": device},
                            not args.quiet, summary, report)
        status = status or (0 if records[0].param_digest == records[1].param_digest else 1)
    return status


def demo_settings(device: str) -> tuple[dict[str, str], str]:
    """The demo's first pair on ``device`` ("cpu" or "cuda"), as ``--set`` text, and why
    SmolLM2 cannot be had here ("" when it can: then the settings train it). The CLI and
    notebook 01 both start from these."""
    demo, why = dict(DEMO), smollm2_unavailable()
    if device == "cuda":
        demo.update(DEMO_GPU)
    if why:  # after the GPU sizes: the fallback's own batch, lr and length hold everywhere
        demo.update(DEMO_FALLBACK)
    return {**demo, "device": device}, why


def demo_pair(config_file: str | None, sets: dict[str, str], out: Path,
              settings: dict[str, str], progress: bool,
              summary: Callable[[list], str],
              report: Callable[[list[Path], Path], Path | None]) -> list:
    """MeZO then zo-offload on ``settings`` (with ``config_file`` and the ``--set`` values
    ``sets`` on top) in ``out/<method>``, their table, what they learned, and their report."""
    from workbench.runs import threads
    from workbench.recipes.train import run
    from workbench.telemetry.exactness import exactness_note

    records = []
    for method in ("mezo", "zo-offload"):
        cfg = load_config(config_file, {**settings, "method": method, **sets})
        check_environment(cfg)
        threads.choose_threads(cfg)  # as the notebooks do, on the free cores; the run records it
        print(f"== {method}: {cfg.model} on {cfg.data}, {cfg.steps} steps, device={cfg.device}")
        if threads.NOTE:
            print(threads.NOTE)
        # The demo's folders are its own: a second demo replaces the first one's runs.
        records.append(run(cfg, out / method, progress=progress, overwrite=True))
    print(summary(records))
    for rec in records:
        print(f"{rec.name}: {learning_text(rec)}")
    same = records[0].param_digest == records[1].param_digest
    print("param_digest identical: zo-offload trained exactly what MeZO trained" if same else
          "param_digest DIFFERENT: the two engines trained different weights")
    print(f"  {exactness_note([r.config for r in records])}")
    html = report([out / "mezo", out / "zo-offload"], out / "report.html")
    print(f"run directories: {out.resolve()}")
    if html:
        print(f"report: {html.resolve()}")
    return records


def learning_text(rec) -> str:
    """What a run learned, from its record: the training loss (mean of the first and of the
    last fifth of its steps) and the main dev metric, start -> end."""
    losses = [s["loss"] for s in rec.steps if s.get("loss") is not None]
    if not losses:
        return "no steps recorded"
    k = max(1, len(losses) // 5)
    start, end = sum(losses[:k]) / k, sum(losses[-k:]) / k
    text = f"training loss {start:.4f} -> {end:.4f} (mean of the first / last {k} steps)"
    metric = main_metric(rec.config)
    first, last = eval_value(rec, metric.key, "start"), eval_value(rec, metric.key, "end")
    if first is not None and last is not None and len(rec.evals) > 1:
        text += f", {metric.label} {metric.fmt.format(first)} -> {metric.fmt.format(last)}"
    return text
