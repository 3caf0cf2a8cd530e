"""Command line: ``python -m workbench {run,validate,demo,compare} ...``.

Every subcommand checks its settings before any model is built; a bad setting exits with
status 2 and one line per problem naming the field and what is allowed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from workbench.config import ConfigError, RunConfig, check_environment, load_config, parse_sets

DEMO = {"model": "tiny-opt", "data": "embedded", "steps": "40", "batch_size": "16",
        "seq_len": "64", "lr": "2e-3", "eps": "1e-3", "eval_samples": "0"}


def _config(args: argparse.Namespace, defaults: dict[str, str] | None = None) -> RunConfig:
    overrides = dict(defaults or {})
    overrides.update(parse_sets(args.set or []))
    return load_config(args.config, overrides)


def cmd_run(args: argparse.Namespace) -> int:
    from workbench.recipes.train import run

    cfg = _config(args)
    check_environment(cfg)
    rec = run(cfg, args.out, progress=not args.quiet)
    print(format_summary([rec]))
    print(f"run directory: {Path(args.out).resolve()}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    cfg = _config(args)
    print(f"ok: {cfg.method} on {cfg.model}, {cfg.steps} steps, device={cfg.device}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The main job: a short MeZO run and a short ZO-offload run, then the comparison."""
    import torch

    from workbench.recipes.train import run

    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = Path(args.out)
    records = []
    for method in ("mezo", "zo-offload"):
        cfg = _config(args, {**DEMO, "device": device, "method": method})
        check_environment(cfg)
        print(f"== {method}: {cfg.model} on {cfg.data}, {cfg.steps} steps, device={device}")
        records.append(run(cfg, out / method, progress=not args.quiet))
    print(format_summary(records))
    same = records[0].param_digest == records[1].param_digest
    print(f"param_digest {'identical' if same else 'DIFFERENT'} across the two engines")
    report = _maybe_report([out / "mezo", out / "zo-offload"], out / "report.html")
    print(f"run directories: {out.resolve()}")
    if report:
        print(f"report: {report.resolve()}")
    return 0 if same else 1


def cmd_compare(args: argparse.Namespace) -> int:
    from workbench.telemetry.record import RunRecord

    print(format_summary([RunRecord.load(d) for d in args.run_dirs]))
    return 0


def _maybe_report(run_dirs: list[Path], path: Path) -> Path | None:
    try:
        from workbench.ui.report import write_report
    except ImportError:  # UI packages not installed: the printed comparison stands alone
        return None
    return write_report(run_dirs, path)


def format_summary(records) -> str:
    """A side-by-side table of runs, with ratios to the first."""
    rows = [("run", lambda r: r.name, None),
            ("tokens/s", lambda r: r.summary.get("tokens_per_s"), "{:,.0f}"),
            ("step (s)", lambda r: r.summary.get("step_seconds"), "{:.4f}"),
            ("peak GPU mem (MB)", lambda r: r.summary.get("peak_gpu_mem_bytes", 0) / 2**20,
             "{:,.1f}"),
            ("H2D per step (MB)", lambda r: r.summary.get("bytes_h2d", 0) / 2**20, "{:,.2f}"),
            ("D2H per step (MB)", lambda r: r.summary.get("bytes_d2h", 0) / 2**20, "{:,.2f}"),
            ("final loss", lambda r: r.summary.get("final_loss"), "{:.4f}"),
            ("dev acc start", lambda r: r.summary.get("eval_accuracy_start"), "{:.3f}"),
            ("dev acc end", lambda r: r.summary.get("eval_accuracy"), "{:.3f}"),
            ("param_digest", lambda r: r.param_digest[:16], None)]
    table = []
    for label, get, fmt in rows:
        cells = []
        for i, r in enumerate(records):
            v = get(r)
            text = "-" if v is None else (fmt.format(v) if fmt else str(v))
            if i and fmt and v is not None and label in ("tokens/s", "peak GPU mem (MB)"):
                base = get(records[0])
                text += f" ({v / base:.2f}x)" if base else ""
            cells.append(text)
        table.append((label, cells))
    width = max(len(label) for label, _ in table)
    cols = [max(len(c[i]) for _, c in table) for i in range(len(records))]
    return "\n".join(f"{label:<{width}}  " + "  ".join(f"{c:>{w}}" for c, w in zip(cells, cols))
                     for label, cells in table)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m workbench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", help="TOML file with settings (a [run] table or top level)")
        sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override one setting; repeatable")

    sp = sub.add_parser("run", help="train one run and write its run directory")
    common(sp)
    sp.add_argument("--out", required=True, help="run directory to write")
    sp.add_argument("--quiet", action="store_true", help="no progress bar")
    sp.set_defaults(fn=cmd_run)
    sp = sub.add_parser("validate", help="check settings without running")
    common(sp)
    sp.set_defaults(fn=cmd_validate)
    sp = sub.add_parser("demo", help="the main job: MeZO vs ZO-offload on the embedded default")
    common(sp)
    sp.add_argument("--out", default="runs/demo", help="folder for the two run directories")
    sp.add_argument("--quiet", action="store_true")
    sp.set_defaults(fn=cmd_demo)
    sp = sub.add_parser("compare", help="print saved runs side by side")
    sp.add_argument("run_dirs", nargs="+")
    sp.set_defaults(fn=cmd_compare)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except ConfigError as e:
        for problem in e.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
