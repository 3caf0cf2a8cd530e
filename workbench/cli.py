"""Command line: ``python -m workbench {run,validate,demo,compare,report,sweep,tune,...} ...``.

Every subcommand checks its settings before any model is built; a bad setting exits with
status 2 and one line per problem naming the field and what is allowed.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import warnings
from pathlib import Path

from workbench.config import ConfigError, RunConfig, check_environment, load_config, parse_sets
from workbench.telemetry.evals import eval_rows, eval_value
from workbench.telemetry.steady import STEADY_NOTE

DEMO = {"model": "tiny-opt", "data": "embedded", "steps": "40", "batch_size": "16",
        "seq_len": "64", "lr": "2e-3", "eps": "1e-3", "eval_samples": "0"}
#: On a GPU: tiny-opt's blocks (50 k parameters, microseconds of compute) leave the GPU waiting
#: for the host, so its table would compare Python overheads, not offloading. opt-1.3b (opt-350m
#: on a GPU under 16 GiB) on synthetic 16 x 128 batches: compute-bound as real runs are, and
#: both runs, builds included, within a minute.
DEMO_GPU = {"model": "opt-1.3b", "data": "synthetic", "steps": "20", "batch_size": "16",
            "seq_len": "128", "lr": "1e-6", "eps": "1e-3"}


def _config(args: argparse.Namespace, defaults: dict[str, str] | None = None) -> RunConfig:
    overrides = dict(defaults or {})
    overrides.update(parse_sets(args.set or []))
    return load_config(args.config, overrides)


def cmd_run(args: argparse.Namespace) -> int:
    if args.resume:
        # Continue a run: its own resolved config, then --config / --set on top.
        from workbench.telemetry.record import RunRecord

        if args.overwrite:
            raise ConfigError(["--overwrite: not with --resume (one continues a run, the other "
                               "replaces it)"])
        if args.out and Path(args.out).resolve() != Path(args.resume).resolve():
            raise ConfigError([f"--out: a resumed run continues in its own directory "
                               f"({args.resume}); leave out --out, or copy the run to "
                               f"{args.out} and resume that"])
        previous = RunRecord.load(args.resume, telemetry=False).config
        known = set(RunConfig.__dataclass_fields__)
        base = RunConfig(**{k: v for k, v in previous.items() if k in known})
        cfg = load_config(args.config, parse_sets(args.set or []), base=base)
        out = args.resume
    else:
        if not args.out:
            raise ConfigError(["--out: a run directory is required (or --resume RUN_DIR)"])
        cfg, out = _config(args), args.out
    check_environment(cfg)
    from workbench.recipes.signals import Interrupted, exit_status, graceful_stop
    from workbench.recipes.train import TrainRecipe

    rank = int(os.environ.get("RANK", "0"))  # under torchrun only rank 0 reports
    recipe = TrainRecipe(cfg, out, progress=not args.quiet and rank == 0,
                         overwrite=args.overwrite, force=args.force)
    with graceful_stop(recipe) as got:
        try:
            rec = recipe.run(resume=bool(args.resume))
        except Interrupted as e:  # in setup or saving, or a second signal: no clean stop
            if rank == 0:
                print(recipe.outcome() if recipe.rundir is not None and recipe.rundir.was_claimed
                      else f"stopped by {e} before the run started", file=sys.stderr)
            return exit_status(e.signum)
        except Exception as e:
            if isinstance(e, (ConfigError, FileNotFoundError)) or _bad_input(e):
                raise  # bad input: one line, exit status 2 (main)
            if recipe.rundir is None or not recipe.record.error:
                raise
            if rank == 0:
                print(f"error: {recipe.record.error} (details in {Path(out) / 'run.json'})",
                      file=sys.stderr)
            return 1
    if rank == 0 and rec.status == "done":
        print(format_summary([rec]))
        print(f"run directory: {Path(out).resolve()}")
    elif rank == 0 and rec.status == "stopped":
        print(recipe.outcome(), file=sys.stderr)
    elif rank == 0:  # failed or diverged: the record's one line says what and where
        print(f"error: {rec.error}", file=sys.stderr)
    if rec.status == "stopped":
        return exit_status(got["signum"] or signal.SIGINT)
    return 0 if rec.status == "done" else 1


def cmd_validate(args: argparse.Namespace) -> int:
    cfg = _config(args)
    print(f"ok: {cfg.method} on {cfg.model}, {cfg.steps} steps, device={cfg.device}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The main job: a short MeZO run and a short ZO-offload run, then the comparison."""
    import torch

    from workbench.recipes.train import run

    device = "cuda" if torch.cuda.is_available() else "cpu"
    demo = dict(DEMO)
    if device == "cuda":
        demo.update(DEMO_GPU)
        if torch.cuda.get_device_properties(0).total_memory < 16 * 2**30:
            demo["model"] = "opt-350m"
    out = Path(args.out)
    records = []
    for method in ("mezo", "zo-offload"):
        cfg = _config(args, {**demo, "device": device, "method": method})
        check_environment(cfg)
        print(f"== {method}: {cfg.model} on {cfg.data}, {cfg.steps} steps, device={device}")
        # The demo's folders are its own: a second demo replaces the first one's runs.
        records.append(run(cfg, out / method, progress=not args.quiet, overwrite=True))
    print(format_summary(records))
    same = records[0].param_digest == records[1].param_digest
    print(f"param_digest {'identical' if same else 'DIFFERENT'} across the two engines")
    report = _maybe_report([out / "mezo", out / "zo-offload"], out / "report.html")
    print(f"run directories: {out.resolve()}")
    if report:
        print(f"report: {report.resolve()}")
    return 0 if same else 1


def cmd_compare(args: argparse.Namespace) -> int:
    from workbench.telemetry.record import RecordError, RunRecord

    records, damaged = [], []
    for d in args.run_dirs:
        try:
            records.append(RunRecord.load(d))
        except RecordError as e:  # the table needs run.json only; the verdict needs events
            records.append(RunRecord.load(d, telemetry=False))
            damaged.append(f"note: {e}; its verdict has no stream events")
    print(format_summary(records))
    print(format_why(records, args.run_dirs))
    for line in damaged:
        print(line)
    return 0


def format_why(records, run_dirs) -> str:
    """Per run: what bounds its step, and the planner's best next knob."""
    from workbench.telemetry.advice import next_knob
    from workbench.telemetry.verdict import verdict

    return "\n".join(f"{d}: {verdict(r).text}\n  next knob: {next_knob(r).text}"
                     for r, d in zip(records, run_dirs))


def cmd_report(args: argparse.Namespace) -> int:
    if Path(args.out).is_dir():
        raise ConfigError([f"-o: {args.out} is a folder; give a file name such as "
                           f"{Path(args.out) / 'report.html'}"])
    from workbench.ui.report import write_report  # plotly only when a report is asked for

    print(write_report(args.run_dirs, args.out).resolve())
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from workbench.cli_sweep import sweep_command

    return sweep_command(_config(args), args)


def cmd_tune(args: argparse.Namespace) -> int:
    from workbench.cli_sweep import tune_command

    return tune_command(_config(args), args)


def cmd_plan(args: argparse.Namespace) -> int:
    """Predict memory, PCIe traffic and step time; exit 0 even when it would not fit."""
    import json

    from workbench.plan.rates import load_calibration
    from workbench.plan.fit import suggest
    from workbench.plan.planner import plan

    cfg = _config(args)
    calib = None if args.gpu else load_calibration(cfg.device)
    if args.suggest is not None:
        rows = suggest(cfg, int(args.suggest * 2 ** 30), args.gpu, calib)
        print(json.dumps(rows, indent=1) if args.json else format_suggestions(rows, args.suggest))
        return 0
    pl = plan(cfg, args.gpu, calib)
    print(json.dumps(pl.to_dict(), indent=1) if args.json else format_plan(cfg, pl))
    return 0


def format_plan(cfg: RunConfig, pl) -> str:
    gib = lambda b: f"{b / 2 ** 30:,.2f} GiB"  # noqa: E731
    lines = [f"plan: {pl.method} on {pl.model} ({pl.params / 1e9:,.2f} B params), "
             f"device={pl.device}" + (f", gpu={pl.gpu}" if pl.gpu else ""),
             f"  batch {cfg.batch_size} x {cfg.seq_len} tokens, amp={cfg.amp}, codec={cfg.codec}, "
             f"master={cfg.master}, resident_blocks={cfg.resident_blocks}, "
             f"prefetch_depth={cfg.prefetch_depth}"]
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
    head = f"{'codec':<9}{'master':<14}{'resident':>8}{'tokens/s':>12}{'step s':>9}" \
           f"{'GPU GiB':>9}{'host GiB':>10}{'PCIe GiB':>10}"
    out = [f"zo-offload settings within {budget_gib:g} GiB (NVML level), best first:", head]
    for r in rows[:top]:
        out.append(f"{r['codec']:<9}{r['master']:<14}{r['resident_blocks']:>8}"
                   f"{r['tokens_per_s']:>12,.0f}{r['step_seconds']:>9.3f}"
                   f"{r['nvml_gpu_mem_bytes'] / 2 ** 30:>9.2f}"
                   f"{r['host_mem_bytes'] / 2 ** 30:>10.1f}"
                   f"{r['pcie_bytes_per_step'] / 2 ** 30:>10.2f}")
    return "\n".join(out + ([f"... {len(rows) - top} more"] if len(rows) > top else []))


def cmd_calibrate(args: argparse.Namespace) -> int:
    from workbench.calibrate.machine import calibrate
    from workbench.plan.rates import cache_path

    result = calibrate(args.device, quick=args.quick)
    for k, v in sorted(result.items()):  # a table of measurements: a line per entry
        for name, value in (((f"{k} [{sk}]", sv) for sk, sv in v.items())
                            if isinstance(v, dict) else [(k, v)]):
            print(f"{name:<36} {_fmt(value)}")
    print(f"cached in {cache_path()}")
    return 0


def _fmt(value) -> str:
    """A calibration value: floats to 4 digits, also inside lists and dicts."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items())
    return str(value)


def _maybe_report(run_dirs: list[Path], path: Path) -> Path | None:
    try:
        from workbench.ui.report import write_report
    except ImportError:  # UI packages not installed: the printed comparison stands alone
        return None
    return write_report(run_dirs, path)


RATIO_ROWS = ("tokens/s (steady)", "peak GPU mem (MB)")


def format_summary(records) -> str:
    """A side-by-side table of runs, with ratios to the first."""
    rows = [("run", lambda r: r.name, None),
            ("tokens/s (steady)", lambda r: r.summary.get("tokens_per_s"), "{:,.0f}"),
            ("step (s, steady median)", lambda r: r.summary.get("step_seconds"), "{:.4f}"),
            ("tokens/s (all steps)", lambda r: r.summary.get("wall_tokens_per_s"), "{:,.0f}"),
            ("warm-up steps left out", lambda r: r.summary.get("warmup_steps"), "{:,}"),
            ("peak GPU mem (MB)", lambda r: r.summary.get("peak_gpu_mem_bytes", 0) / 1e6,
             "{:,.1f}"),
            ("H2D per step (MB)", lambda r: r.summary.get("bytes_h2d", 0) / 1e6, "{:,.2f}"),
            ("D2H per step (MB)", lambda r: r.summary.get("bytes_d2h", 0) / 1e6, "{:,.2f}"),
            ("final loss", lambda r: r.summary.get("final_loss"), "{:.4f}"),
            *_eval_rows(records),
            *_schedule_rows(records),
            ("param_digest", lambda r: r.param_digest[:16], None)]
    table = []
    for label, get, fmt in rows:
        cells = []
        for i, r in enumerate(records):
            v = get(r)
            text = "-" if v is None else (fmt.format(v) if fmt else str(v))
            if i and fmt and v is not None and label in RATIO_ROWS:
                base = get(records[0])
                text += f" ({v / base:.2f}x)" if base else ""
            cells.append(text)
        table.append((label, cells))
    width = max(len(label) for label, _ in table)
    cols = [max(len(c[i]) for _, c in table) for i in range(len(records))]
    lines = [f"{label:<{width}}  " + "  ".join(f"{c:>{w}}" for c, w in zip(cells, cols))
             for label, cells in table]
    return "\n".join(lines + [f"note: {STEADY_NOTE} MB = 10^6 bytes."])


def _schedule_rows(records) -> list:
    """fo-offload's optimizer-update placement, where some run recorded one."""
    if not any("fo_stride" in r.info for r in records):
        return []
    return [("fo-offload update schedule", lambda r: schedule_text(r.info), None)]


def schedule_text(info: dict) -> str | None:
    """"stride 3, downcast on gpu, best of 5 tried" from a run's fo-offload records (None for
    other methods): the stride kept, where 16-bit weights are downcast, and under
    update_stride=auto how many placements were tried."""
    from workbench.plan.placement import NO_GPU

    if "fo_stride" not in info:
        return None
    stride = info["fo_stride"]
    text = "all on the CPU" if stride == NO_GPU else f"stride {stride}"
    downcast = info.get("fo_perf_inputs", {}).get("downcast", "none")
    text += f", downcast on {downcast}" if downcast != "none" else ""
    tried = info.get("fo_trial", {}).get("candidates", [])
    return text + (f", best of {len(tried)} tried" if tried else "")


def _eval_rows(records) -> list:
    """Start and end rows of every dev metric some run recorded (``telemetry/evals.py``)."""
    return [(label, lambda r, k=key, w=when: eval_value(r, k, w), fmt)
            for label, key, when, fmt in eval_rows(records)]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m workbench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", help="TOML file with settings (a [run] table or top level)")
        sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override one setting; repeatable")

    sp = sub.add_parser("run", help="train one run and write its run directory")
    common(sp)
    sp.add_argument("--out", help="run directory to write")
    sp.add_argument("--resume", metavar="RUN_DIR",
                    help="continue RUN_DIR from its newest complete checkpoint")
    sp.add_argument("--overwrite", action="store_true",
                    help="replace the run --out already holds (its files and checkpoints)")
    sp.add_argument("--force", action="store_true",
                    help="start even when the planner says the run will not fit")
    sp.add_argument("--quiet", action="store_true", help="no progress bar")
    sp.set_defaults(fn=cmd_run)
    sp = sub.add_parser("validate", help="check settings without running")
    common(sp)
    sp.set_defaults(fn=cmd_validate)
    sp = sub.add_parser("demo", help="the main job: MeZO vs ZO-offload (tiny-opt on the embedded "
                        "data on a CPU, opt-1.3b on synthetic batches on a GPU)")
    common(sp)
    sp.add_argument("--out", default="runs/demo", help="folder for the two run directories")
    sp.add_argument("--quiet", action="store_true")
    sp.set_defaults(fn=cmd_demo)
    sp = sub.add_parser("sweep", help="run a grid of settings and compare them")
    common(sp)
    sp.add_argument("--sweep", action="append", required=True, metavar="KNOB=V1,V2,...",
                    help="a knob and its values; repeat for a grid")
    sp.add_argument("--out", required=True, help="folder: a run directory per point, "
                    "sweep.json and report.html")
    sp.add_argument("--quiet", action="store_true", help="no progress bars")
    sp.set_defaults(fn=cmd_sweep)
    sp = sub.add_parser("tune", help="measure the planner's best settings; write the fastest")
    common(sp)
    sp.add_argument("--gpu", help="plan for this GPU of the table (its memory is the budget)")
    sp.add_argument("--budget-gb", type=float, help="GPU memory budget in GiB (default: the "
                    "--gpu table's, else this GPU's free memory)")
    sp.add_argument("--top", type=int, default=3, help="candidates to measure (default 3)")
    sp.add_argument("--trial-steps", type=int, default=6, help="steps per trial (default 6)")
    sp.add_argument("--out", required=True, help="folder: the trials, best.toml, report.html")
    sp.add_argument("--quiet", action="store_true", help="no progress bars")
    sp.set_defaults(fn=cmd_tune)
    sp = sub.add_parser("plan", help="predict memory and step time without running")
    common(sp)
    sp.add_argument("--gpu", help="plan for a GPU of the table (h200, h100, a100-40gb, "
                    "a100-80gb, rtx-4090, 24gb); default: this machine's calibration, else h200")
    sp.add_argument("--json", action="store_true", help="print the plan as JSON")
    sp.add_argument("--suggest", type=float, metavar="BUDGET_GIB",
                    help="rank zo-offload settings that fit this much GPU memory, in GiB "
                    "(2^30 bytes)")
    sp.set_defaults(fn=cmd_plan)
    sp = sub.add_parser("calibrate", help="measure this machine's rates for the planner")
    sp.add_argument("--quick", action="store_true", help="smaller and fewer measurements")
    sp.add_argument("--device", choices=("cpu", "cuda"), default=None,
                    help="default: cuda when available")
    sp.set_defaults(fn=cmd_calibrate)
    sp = sub.add_parser("compare", help="print saved runs side by side")
    sp.add_argument("run_dirs", nargs="+")
    sp.set_defaults(fn=cmd_compare)
    sp = sub.add_parser("report", help="write a self-contained HTML report of saved runs")
    sp.add_argument("run_dirs", nargs="+")
    sp.add_argument("-o", "--out", default="report.html", help="HTML file to write")
    sp.set_defaults(fn=cmd_report)
    return p


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    return f"warning: {message}\n"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.formatwarning = _one_line_warning  # a terminal gets one line, not a source excerpt
    try:
        return args.fn(args)
    except ConfigError as e:
        for problem in e.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError) as e:
        if not isinstance(e, FileNotFoundError) and not _bad_input(e):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2


def _bad_input(error: BaseException) -> bool:
    """A checkpoint or a run record that cannot be used. Their modules import torch, which a
    refused setting should not wait for: an error of theirs means they are loaded already."""
    kinds = (("workbench.engine.checkpoint", "CheckpointError"),
             ("workbench.telemetry.record", "RecordError"))
    return any(m in sys.modules and isinstance(error, getattr(sys.modules[m], name))
               for m, name in kinds)


if __name__ == "__main__":
    raise SystemExit(main())
