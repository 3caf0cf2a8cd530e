"""Command line: ``python -m workbench {run,validate,demo,compare,report,sweep,tune,export,
evaluate,...} ...``.

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

from workbench.config import (ConfigError, RunConfig, check_environment, load_config, parse_sets,
                              resume_base)

def _config(args: argparse.Namespace, defaults: dict[str, str] | None = None) -> RunConfig:
    overrides = dict(defaults or {})
    overrides.update(parse_sets(args.set or []))
    return load_config(_config_file(args), overrides)


def _config_file(args: argparse.Namespace) -> str | None:
    """The one ``--config`` file (a second is refused: which would win is no rule to guess)."""
    files = getattr(args, "config", None) or []
    if len(files) > 1:
        raise ConfigError([f"--config: given {len(files)} times ({', '.join(files)}); give one "
                           "file (--set overrides single settings)"])
    return files[0] if files else None


def cmd_run(args: argparse.Namespace) -> int:
    if args.resume:
        # Continue a run: its own resolved config, then --config / --set on top.
        from workbench.runs.resume import started_config

        if args.overwrite:
            raise ConfigError(["--overwrite: not with --resume (one continues a run, the other "
                               "replaces it)"])
        if args.out and Path(args.out).resolve() != Path(args.resume).resolve():
            raise ConfigError([f"--out: a resumed run continues in its own directory "
                               f"({args.resume}); leave out --out, or copy the run to "
                               f"{args.out} and resume that"])
        base = RunConfig(**resume_base(started_config(Path(args.resume))))
        cfg = load_config(_config_file(args), parse_sets(args.set or []), base=base)
        out = args.resume
    else:
        if not args.out:
            raise ConfigError(["--out: a run directory is required (or --resume RUN_DIR)"])
        cfg, out = _config(args), args.out
    check_environment(cfg)
    from workbench.runs.signals import Interrupted, exit_status, graceful_stop
    from workbench.recipes.train import TrainRecipe

    from workbench.runs import threads

    threads.choose_threads(cfg)  # as the notebooks do, on the free cores; the run records it
    rank = int(os.environ.get("RANK", "0"))  # under torchrun only rank 0 reports
    recipe = TrainRecipe(cfg, out, progress=not args.quiet and rank == 0,
                         overwrite=args.overwrite, force=args.force)
    if threads.NOTE and rank == 0:  # once its checks passed: a refused run says only why
        recipe.on_prepared = lambda: print(threads.NOTE, file=sys.stderr, flush=True)
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
            if type(e).__name__ == "PeerFailed":  # under torchrun: another rank's failure
                print(f"error: {e}", file=sys.stderr)
                return 1
            if recipe.rundir is None or not recipe.record.error:
                raise
            if rank == 0:
                print(f"error: {recipe.record.error} ({recipe.where_recorded()})", file=sys.stderr)
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
    """The checks ``run`` makes before it builds anything (``recipes.inputs``): a setting or
    data file that run would refuse is refused here, with the same line."""
    cfg = _config(args)
    check_environment(cfg)
    from workbench.data.sizes import data_sizes
    from workbench.recipes.inputs import check_inputs

    read = check_inputs(cfg, force=args.force)
    data = ""
    if read.task is not None:
        sizes = data_sizes(read.task.train, read.task.dev)
        data = (f"; data {cfg.data}: {sizes.get('train examples', '?'):,} train / "
                f"{sizes.get('dev examples', '?'):,} dev examples")
    print(f"ok: {cfg.method} on {cfg.model}, {cfg.steps} steps, device={cfg.device}{data}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from workbench.cli.demo import demo_command

    return demo_command(args, _config_file(args), format_summary, _maybe_report)


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
    print(format_why(records))
    if len(records) > 1:
        print(digest_line(records))
    for line in damaged:
        print(line)
    return 0


def digest_line(records) -> str:
    """Whether the runs ended with one ``param_digest``, and whether they should have."""
    from workbench.telemetry.exactness import exactness_note

    digests = [r.param_digest for r in records]
    if len(records) < 2:
        return ""
    said = "param_digest: not recorded for every run" if not all(digests) else \
        f"param_digest {'identical' if len(set(digests)) == 1 else 'DIFFERENT'} across the runs"
    note = exactness_note([r.config for r in records])
    return said + (f"\n  {note}" if note else "")


def format_why(records) -> str:
    """Per run: what bounds its step and the planner's best next knob; then the settings that
    differ between the runs (the labels show at most a few)."""
    from workbench.telemetry.advice import next_knob
    from workbench.telemetry.naming import differing, run_labels, value_text
    from workbench.telemetry.verdict import verdict

    lines = [f"{label}: {verdict(r).text}\n  next knob: {next_knob(r).text}"
             for r, label in zip(records, run_labels(records))]
    keys = differing([r.config for r in records]) if len(records) > 1 else []
    if keys:
        lines.append("settings that differ: " + "; ".join(
            f"{k} " + " / ".join(value_text(r.config.get(k, "-")) for r in records)
            for k in keys))
    elif len(records) > 1:
        lines.append("settings: the same in every run")
    return "\n".join(lines)


def cmd_report(args: argparse.Namespace) -> int:
    from workbench.runs.outputs import check_report_out

    check_report_out(Path(args.out), args.overwrite)  # a report, new, or --overwrite; no run's
    above = next((p for p in Path(args.out).parents if p.exists()), None)
    if above is not None and not above.is_dir():  # mkdir would say "File exists"
        raise ConfigError([f"-o: cannot write {args.out} ({above} is a file, not a folder); "
                           "give a writable place"])
    from workbench.ui.report import write_report  # plotly only when a report is asked for

    try:
        print(write_report(args.run_dirs, args.out).resolve())
    except OSError as e:
        if isinstance(e, FileNotFoundError) and not e.filename:
            raise  # a run directory that is not one: one line from main
        raise ConfigError([f"-o: cannot write {args.out} ({e.strerror or e}); give a writable "
                           "place"]) from None
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from workbench.cli.sweep import sweep_command

    return sweep_command(_config(args), args)


def cmd_tune(args: argparse.Namespace) -> int:
    from workbench.cli.sweep import tune_command

    return tune_command(_config(args), args)


def cmd_plan(args: argparse.Namespace) -> int:
    from workbench.cli.plan import plan_command

    return plan_command(args, _config_file(args))


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


def format_summary(records) -> str:
    """The runs side by side (``telemetry/summary.py``: the report's table, as text), named by
    their directories and the settings that differ (``telemetry/naming.py``)."""
    from workbench.telemetry.naming import run_labels
    from workbench.telemetry.summary import text_table

    return text_table(records, run_labels(records))


#: What ``--help`` says first: whole sentences (argparse reflows it; the module docstring's first
#: line is cut mid-list).
DESCRIPTION = ("zo-workbench: zeroth-order fine-tuning with CPU offloading, and a live view of the "
               "machine. Every command checks its settings before any model is built; "
               "'python -m workbench COMMAND --help' says what each takes.")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m workbench", description=DESCRIPTION)
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", action="append", help="TOML file with settings (a [run] "
                        "table or top level); one file")
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
    sp = sub.add_parser("validate", help="check settings, model and data as run does, without "
                        "running")
    common(sp)
    sp.add_argument("--force", action="store_true",
                    help="skip the check that the run fits this machine (as run --force)")
    sp.set_defaults(fn=cmd_validate)
    sp = sub.add_parser("demo", help="the main job: MeZO vs ZO-offload training SmolLM2-135M "
                        "(LoRA) on the embedded sentiment set; on a GPU also opt-1.3b for speed")
    common(sp)
    sp.add_argument("--out", default="runs/demo", help="folder for the two run directories")
    sp.add_argument("--quiet", action="store_true")
    sp.set_defaults(fn=cmd_demo)
    sp = sub.add_parser("sweep", help="run a grid of settings and compare them")
    common(sp)
    sp.add_argument("--sweep", action="append", metavar="KNOB=V1,V2,...",
                    help="a knob and its values; repeat for a grid")
    sp.add_argument("--out", help="folder: a run directory per point, sweep.json and "
                    "report.html")
    sp.add_argument("--resume", metavar="SWEEP_DIR", help="finish the sweep SWEEP_DIR holds: "
                    "its finished points are kept, the others run (or continue)")
    sp.add_argument("--overwrite", action="store_true",
                    help="replace the sweep --out holds (its points' runs, manifest, report)")
    sp.add_argument("--rank-by", metavar="METRIC", help="what ranks the points: tokens_per_s, "
                    "loss, or dev.<metric> (dev.accuracy, dev.loss, ...); default: the "
                    "objective's dev metric when there is dev data, else tokens_per_s")
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
    sp.add_argument("--models", action="store_true", help="list the models a run can take "
                    "(presets, tiny:<model_type> and the supported model types) and exit")
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
    sp.add_argument("--overwrite", action="store_true", help="replace -o even when it is not "
                    "a report this tool wrote (a run's own files never)")
    sp.set_defaults(fn=cmd_report)
    from workbench.cli.export import add_parsers

    add_parsers(sub, common)  # export, evaluate
    return p


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    return f"warning: {message}\n"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.formatwarning = _one_line_warning  # a terminal gets one line, not a source excerpt
    try:
        status = args.fn(args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the interpreter's exit
        return status
    except BrokenPipeError:  # the reader left (``| head``): stop quietly, as CLI tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error at exit
        return 128 + signal.SIGPIPE
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
