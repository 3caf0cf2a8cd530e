"""``python -m workbench sweep`` and ``python -m workbench tune``: run through the recipes,
print the table, write the folder's report.

    python -m workbench sweep --set model=tiny-opt --set method=zo-offload \\
        --sweep overlap=true,false --sweep prefetch_depth=1,2 --out runs/sweep
    python -m workbench tune --set model=opt-13b --set device=cuda --set amp=bf16 --gpu 24gb \\
        --out runs/tune

Exit status: 0 when at least one point finished; 2 when the settings are bad or every point
was refused (nothing runs); 1 when every point that ran failed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from workbench.config import RunConfig
from workbench.recipes.sweep import Point, Sweep, SweepError, parse_sweeps


def sweep_command(base: RunConfig, args: argparse.Namespace) -> int:
    """Check the grid, run it, print the table, write ``--out/report.html``; with
    ``--resume DIR``, finish the sweep DIR holds, on its own grid."""
    saved_rank = None
    if args.resume:
        base, axes, args.out, saved_rank = _resumed(args)
    elif not args.sweep or not args.out:
        raise SweepError(["sweep: --sweep KNOB=V1,V2,... and --out are needed (or --resume "
                          "SWEEP_DIR)"])
    else:
        axes = parse_sweeps(args.sweep)
    both = sorted(set(axes) & set(_set_keys(args)))
    if both:
        raise SweepError([f"{k}: given with --set and --sweep; keep it in --sweep only"
                          for k in both])
    rank_by = getattr(args, "rank_by", None) or saved_rank
    if rank_by is not None:
        from workbench.telemetry.ranking import parse_rank_by

        parse_rank_by(rank_by)  # a bad name: one line, before any point is checked
        if rank_by.startswith("dev.") and base.data == "synthetic":
            raise SweepError([f"--rank-by {rank_by}: data=synthetic has no dev split to "
                              "evaluate; rank by tokens_per_s or loss, or use a data set"])
    sweep = Sweep.grid(base, axes, args.out, resume=bool(args.resume), overwrite=args.overwrite,
                       rank_by=rank_by)
    from workbench.runs import threads

    threads.choose_threads(base)  # the grid's model and device are the base's
    if threads.NOTE:
        print(threads.NOTE)
    _say_refused(sweep)
    if not sweep.runnable and not sweep.finished():
        raise SweepError([f"sweep: every point of the grid was refused ({len(sweep.points)}); "
                          "nothing ran"])
    print(f"sweep: {len(sweep.runnable)} run(s) of {len(sweep.points)} points -> "
          f"{Path(args.out).resolve()}", flush=True)
    return _run_and_report(sweep, lambda: sweep.run(progress=not args.quiet,
                                                    on_update=_progress_line))


def _resumed(args: argparse.Namespace):
    """(base, axes, folder, rank_by) of the sweep ``--resume`` names; it runs as it was
    started (and ranks as it did, unless ``--rank-by`` says otherwise)."""
    from workbench.config import resume_base
    from workbench.recipes.sweep import load_manifest

    given = [o for o, v in (("--set", args.set), ("--config", args.config),
                            ("--sweep", args.sweep), ("--overwrite", args.overwrite)) if v]
    if given:
        raise SweepError([f"{o}: not with --resume (a resumed sweep runs its own grid)"
                          for o in given])
    if args.out and Path(args.out).resolve() != Path(args.resume).resolve():
        raise SweepError([f"--out: a resumed sweep continues in its own folder ({args.resume}); "
                          "leave out --out"])
    try:
        manifest = load_manifest(args.resume)
    except FileNotFoundError as e:
        raise SweepError([f"--resume: {e}"]) from None
    except ValueError as e:
        raise SweepError([f"--resume: {args.resume}/sweep.json cannot be read ({e})"]) from None
    if manifest.get("kind") != "sweep" or not isinstance(manifest.get("axes"), dict):
        raise SweepError([f"--resume: {args.resume} holds a {manifest.get('kind')}, not a grid "
                          "sweep; run it again into another --out"])
    rank_by = manifest.get("rank_by") if isinstance(manifest.get("rank_by"), str) else None
    return (RunConfig(**resume_base(manifest.get("base") or {})), manifest["axes"], args.resume,
            rank_by)


def tune_command(base: RunConfig, args: argparse.Namespace) -> int:
    """Propose, measure, write ``best.toml`` and the report."""
    from workbench.recipes.tune import tune

    holder: list[Sweep] = []
    result = None

    def go() -> None:
        nonlocal result
        result = tune(base, args.out, gpu=args.gpu, budget_gb=args.budget_gb, top=args.top,
                      trial_steps=args.trial_steps, progress=not args.quiet,
                      on_update=_progress_line, start=_started(holder))

    code = _run_and_report(None, go, holder)
    if result is not None and result.toml is not None:
        tied = result.sweep.extra.get("within_noise") or []
        print(f"fastest: {result.best.name} "
              f"({result.best.measured.get('tokens_per_s') or 0:,.0f} tokens/s measured)"
              if len(tied) < 2 else
              f"no winner: {len(tied)} trials within noise of each other ({', '.join(tied)}); "
              f"kept the planner's first choice of them, {result.best.name}")
        print(f"config: {result.toml.resolve()}   "
              f"(python -m workbench run --config {result.toml} --out DIR)")
    return code


def _started(holder: list[Sweep]):
    def start(sweep: Sweep) -> None:
        holder.append(sweep)
        _say_refused(sweep)
        print(f"tune: measuring {len(sweep.runnable)} candidate(s) -> "
              f"{sweep.out_dir.resolve()}", flush=True)
    return start


def _run_and_report(sweep: Sweep | None, work, holder: list[Sweep] | None = None) -> int:
    interrupted = False
    try:
        work()
    except KeyboardInterrupt:  # what finished is saved; report it and say so
        interrupted = True
    sweep = sweep or (holder[0] if holder else None)
    if interrupted:
        how = (f"; finish it with: python -m workbench sweep --resume {sweep.out_dir}"
               if sweep is not None and sweep.kind == "sweep" else "")
        print("interrupted: the finished runs are kept, the rest marked skipped" + how,
              file=sys.stderr)
    if sweep is None:
        return 2
    print(sweep.table())
    if not sweep.finished():
        return 130 if interrupted else 1
    try:
        from workbench.ui.sweep_view import write_sweep_report
    except ImportError:  # UI packages not installed: the printed table stands alone
        return 130 if interrupted else 0
    try:
        print(f"report: {write_sweep_report(sweep.out_dir).resolve()}")
    except KeyboardInterrupt:  # the runs and sweep.json are whole; only the page is missing
        print(f"interrupted while writing {sweep.out_dir / 'report.html'}; the runs and "
              "sweep.json are kept", file=sys.stderr)
        return 130
    return 130 if interrupted else 0


def _say_refused(sweep: Sweep) -> None:
    for p in sweep.points:
        if p.status == "refused":
            print(f"refused: {p.name}: {p.reason}", file=sys.stderr)
        elif p.status == "reused":
            print(f"reused: {p.name}: finished earlier in {p.dir}")


def _progress_line(sweep: Sweep, p: Point) -> None:
    n = sweep.points.index(p) + 1
    if p.status == "running":
        print(f"[{n}/{len(sweep.points)}] {p.name}", flush=True)
    elif p.status == "failed":
        print(f"[{n}/{len(sweep.points)}] {p.name}: failed: {p.reason}", file=sys.stderr)
    else:
        tps = p.measured.get("tokens_per_s")
        print(f"[{n}/{len(sweep.points)}] {p.name}: {p.status}"
              + (f", {tps:,.0f} tokens/s" if tps else ""), flush=True)


def _set_keys(args: argparse.Namespace) -> list[str]:
    return [item.split("=", 1)[0].strip() for item in (args.set or []) if "=" in item]

