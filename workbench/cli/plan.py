"""``python -m workbench plan``: memory, PCIe traffic and step time predicted for a run, or
the zo-offload settings that fit a GPU memory budget (``--suggest``)."""
from __future__ import annotations

import argparse
import json
import sys

from workbench.config import ConfigError, RunConfig, load_config, parse_sets
from workbench.models.shape import shape_of
from workbench.plan.fit import shortfalls, suggest
from workbench.plan.planner import plan
from workbench.plan.rates import load_calibration


def plan_command(args: argparse.Namespace, config_file: str | None) -> int:
    """Predict memory, PCIe traffic and step time (``config_file``: --config's). A plan that
    does not fit is printed, then each shortfall with the knob that helps (stderr), and exits
    1."""
    if args.models:
        from workbench.cli.models import models_text

        print(models_text())
        return 0
    if args.suggest is not None and not args.suggest > 0:
        raise ConfigError([f"--suggest: {args.suggest:g} GiB is not a GPU memory budget; give a "
                           "number of GiB above 0"])
    # --gpu names a GPU: a CUDA run, unless a setting says otherwise (then one line, below)
    cfg = load_config(config_file, parse_sets(args.set or []),
                      base=RunConfig(device="cuda") if args.gpu else None)
    if args.gpu and cfg.device != "cuda":
        raise ConfigError([f"--gpu {args.gpu}: plans a CUDA run, but device={cfg.device} is set; "
                           "set device=cuda or leave out --gpu"])
    calib = None if args.gpu else load_calibration(cfg.device)
    shape = shape_of(cfg.model)  # a layout the formulas do not know: counted on its model
    if args.suggest is not None:
        rows = suggest(cfg, int(args.suggest * 2 ** 30), args.gpu, calib, shape=shape)
        print(json.dumps(rows, indent=1) if args.json else format_suggestions(rows, args.suggest))
        return 0
    pl = plan(cfg, args.gpu, calib, shape=shape)
    print(json.dumps(pl.to_dict(), indent=1) if args.json else format_plan(cfg, pl))
    problems = shortfalls(cfg, pl, args.gpu, calib, shape)
    for problem in problems:
        print(f"does not fit: {problem}", file=sys.stderr)
    return 1 if problems else 0


def format_plan(cfg: RunConfig, pl) -> str:
    gib = lambda b: f"{b / 2 ** 30:,.2f} GiB"  # noqa: E731
    lines = [f"plan: {pl.method} on {pl.model} ({pl.params / 1e9:,.2f} B params), "
             f"device={pl.device}" + (f", gpu={pl.gpu}" if pl.gpu else ""),
             f"  batch {cfg.batch_size} x {cfg.seq_len} tokens, amp={cfg.amp}, codec={cfg.codec}, "
             f"master={cfg.master}, resident_blocks={cfg.resident_blocks}, "
             f"prefetch_depth={cfg.prefetch_depth}"
             + (f", block_slots={cfg.block_slots}" if cfg.block_slots != "auto" else "")
             + (", stream_embeddings=true" if cfg.stream_embeddings else "")]
    if pl.device == "cuda":
        ok = "fits" if pl.fits_gpu else "DOES NOT FIT"
        lines.append(f"GPU memory, torch peak   {gib(pl.peak_gpu_mem_bytes):>14}")
        lines += [f"  {k:<36}{gib(v):>14}" for k, v in pl.gpu_breakdown.items() if v]
        lines.append(f"GPU memory, NVML         {gib(pl.nvml_gpu_mem_bytes):>14}   "
                     f"available {gib(pl.gpu_mem_available_bytes)}: {ok}")
    ok = "fits" if pl.fits_host else "DOES NOT FIT"
    lines.append(f"host memory              {gib(pl.host_mem_bytes):>14}   (pinned "
                 f"{gib(pl.pinned_host_bytes)}; available {gib(pl.host_mem_available_bytes)}: "
                 f"{ok})")
    lines += [f"  {k:<36}{gib(v):>14}" for k, v in pl.host_breakdown.items() if v]
    lines += [f"PCIe per step            {gib(pl.pcie_bytes_per_step):>14}   (H2D "
              f"{gib(pl.h2d_bytes_per_step)}, D2H {gib(pl.d2h_bytes_per_step)})",
              f"step time                {pl.step_seconds:>12.4f} s   (compute "
              f"{pl.compute_seconds:.4f} s, transfer {pl.transfer_seconds:.4f} s)",
              f"tokens/s                 {pl.tokens_per_s:>14,.0f}"]
    lines += [f"note: {n}" for n in pl.notes]
    return "\n".join(lines)


def format_suggestions(rows: list[dict], budget_gib: float, top: int = 15) -> str:
    if not rows:
        return f"no zo-offload setting fits {budget_gib:g} GiB"
    head = f"{'codec':<19}{'master':<14}{'resident':>8}{'ends':>9}{'slots':>6}{'tokens/s':>12}" \
           f"{'step s':>9}{'GPU GiB':>9}{'host GiB':>10}{'host fits':>11}{'PCIe GiB':>10}"
    out = [f"zo-offload settings within {budget_gib:g} GiB (NVML level), best first (ends: the "
           "embedding and head resident or streamed, stream_embeddings; host fits: its host "
           "memory, with the process, within what this machine has free):", head]
    for r in rows[:top]:
        ends = "streamed" if r["stream_embeddings"] else "resident"
        # every block resident: nothing streams, the formats are moot
        codec = "-" if r.get("all_resident") else "/".join([r["codec"], *r.get("alike", [])])
        master = "-" if r.get("all_resident") else r["master"]
        out.append(f"{codec:<19}{master:<14}{r['resident_blocks']:>8}{ends:>9}"
                   f"{r['block_slots']!s:>6}"
                   f"{r['tokens_per_s']:>12,.0f}{r['step_seconds']:>9.3f}"
                   f"{r['nvml_gpu_mem_bytes'] / 2 ** 30:>9.2f}"
                   f"{r['host_mem_bytes'] / 2 ** 30:>10.1f}"
                   f"{'yes' if r['fits_host'] else 'NO':>11}"
                   f"{r['pcie_bytes_per_step'] / 2 ** 30:>10.2f}")
    return "\n".join(out + ([f"... {len(rows) - top} more"] if len(rows) > top else []))
