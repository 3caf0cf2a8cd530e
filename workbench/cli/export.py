"""The export and evaluate subcommands (``cli/__init__.py`` registers them with ``add_parsers``).

    python -m workbench export RUN_DIR --out DIR [--dtype bf16] [--step N] [--merge] ...
    python -m workbench evaluate MODEL_OR_RUN_DIR [--set data=sst2 ...] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys

from workbench.config import load_config, parse_sets


def cmd_export(args: argparse.Namespace) -> int:
    from workbench.export.base_ref import BASE_FOLDER
    from workbench.export.exporter import KINDS, export_run

    try:
        res = export_run(args.run_dir, args.out, dtype=args.dtype, step=args.step,
                         shard_size=args.shard_size, merge=args.merge, force=args.force,
                         overwrite=args.overwrite, device=args.device,
                         progress=None if args.quiet else _progress())
    except KeyboardInterrupt:  # the temporary folder is already removed
        print(f"error: export interrupted; nothing was written to {args.out}", file=sys.stderr)
        return 130
    print(f"exported the {KINDS[res.kind]} after {res.step} steps ({res.origin}, {res.dtype}) to "
          f"{res.out.resolve()} in {res.seconds:.1f} s")
    if res.matches_run is True and res.rounded:
        print(f"the run's fp32 weights were read back equal to its param_digest {res.digest[:16]}"
              f" and rounded to {res.dtype}: the exported weights' digest is "
              f"{res.written_digest[:16]} (read back, each group checked against the rounding "
              "of the run's weights)")
    elif res.matches_run is True:
        print(f"param_digest {res.digest[:16]} equals the run's")
    elif res.matches_run is False:  # a checkpoint's update replayed on another device type
        print(f"note: param_digest {res.digest[:16]} differs from the run's (its pending update "
              f"was applied on {args.device}; use --device as the run had it)", file=sys.stderr)
    if res.kind != "adapter":
        print("load it with: AutoModelForCausalLM.from_pretrained(DIR)")
    elif res.base == BASE_FOLDER:  # the base went along, named relative to the folder
        print(f"load it with: PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("
              f"DIR/{BASE_FOLDER}), DIR), or AutoPeftModelForCausalLM.from_pretrained('.') "
              f"inside DIR (the base the run trained on is in DIR/{BASE_FOLDER}: no Hub "
              "repository holds it)")
    else:
        print(f"load it with: AutoPeftModelForCausalLM.from_pretrained(DIR) (base: {res.base})")
    return 0


def _progress():
    from tqdm.auto import tqdm

    bar = None

    def update(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, desc="export", unit="group", leave=False)
        bar.update(done - bar.n)
        if done == total:
            bar.close()

    return update


def cmd_evaluate(args: argparse.Namespace) -> int:
    from workbench.recipes.evaluate import evaluate, is_run_dir, run_config

    overrides = parse_sets(args.set or [])
    run_dir = args.model if args.model and is_run_dir(args.model) else None
    note = ""  # an export's: whose task it is scored on
    if run_dir is not None:
        cfg = run_config(run_dir, overrides, args.config)
    else:
        task, note = _export_task(args.model) if args.model else ({}, "")
        if args.model:
            overrides = {"model": args.model, **task, **overrides}
        cfg = load_config(args.config, overrides)
    metrics = evaluate(cfg, run_dir, step=args.step, force=args.force)
    if note and not args.json:  # said once it ran: a refusal is one line
        print(note, file=sys.stderr)
    if args.json:
        print(json.dumps(metrics, indent=1))
        return 0
    what = run_dir or cfg.model
    print(f"{what} on {cfg.data} ({cfg.objective}, method={cfg.method}):")
    for name, value in metrics.items():
        print(f"  dev {name:<12} {value:.4f}")
    return 0


def _export_task(folder: str) -> tuple[dict[str, str], str]:
    """An exported folder's run's task (``workbench_export.json``: its ``task``, else the run's
    own run.json where the run is still there) as --set values, and a line saying whose task
    it is; ({}, "") for a folder that is no export of a run. ``--set`` overrides it."""
    from pathlib import Path

    from workbench.export.exporter import INFO_FILE
    from workbench.export.task import run_task

    info_file = Path(folder).expanduser() / INFO_FILE
    if not info_file.is_file():
        return {}, ""
    try:
        info = json.loads(info_file.read_text())
    except (OSError, ValueError):
        return {}, ""
    task = info.get("task")
    run_dir = Path(str(info.get("run_dir", "")))
    if not isinstance(task, dict) and (run_dir / "run.json").is_file():
        try:  # an export written before its task was recorded: the run's own record
            task = run_task(json.loads((run_dir / "run.json").read_text()).get("config") or {})
        except (OSError, ValueError):
            task = None
    if not isinstance(task, dict) or not task:
        return {}, (f"note: {info_file} records no task; evaluating on the settings given "
                    "(--set data=... objective=... for the run's own)")
    if task.get("data") == "synthetic":  # random token batches: nothing to score
        return {}, ("note: the run trained on synthetic batches, which have no dev split; "
                    "evaluating on the settings given (--set data=...)")
    for key in ("data", "data_dir"):  # a local file named relative to the export folder
        value = str(task.get(key) or "")
        if value and not Path(value).is_absolute() and (Path(folder) / value).exists():
            task[key] = str((Path(folder).expanduser() / value).resolve())
    sets = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in task.items()}
    return sets, (f"note: evaluating on the task the run learned (recorded in {INFO_FILE}): "
                  f"data={sets.get('data')}, objective={sets.get('objective', 'classify')}; "
                  "--set overrides it")


def add_parsers(sub, common) -> None:
    """The export and evaluate subparsers (``common`` adds --config / --set)."""
    sp = sub.add_parser("export", help="write a run's weights as a Hugging Face (or PEFT "
                        "adapter) folder")
    sp.add_argument("run_dir", metavar="RUN_DIR")
    sp.add_argument("--out", required=True, help="folder to create")
    sp.add_argument("--dtype", choices=("fp32", "bf16", "fp16"),
                    help="weights' dtype (default: the model's own, fp32 for presets)")
    sp.add_argument("--step", type=int, help="a checkpoint's weights after N steps (default: "
                    "the newest the run vouches for)")
    sp.add_argument("--shard-size", default="5GB", help="largest weights file (default 5GB)")
    sp.add_argument("--merge", action="store_true",
                    help="peft=lora runs: the base with the adapter merged, not the adapter")
    sp.add_argument("--force", action="store_true",
                    help="export a run that is running or failed (its newest kept weights)")
    sp.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    sp.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="where a checkpoint's pending update is applied (the run's device "
                    "type gives its bits)")
    sp.add_argument("--quiet", action="store_true", help="no progress bar")
    sp.set_defaults(fn=cmd_export)
    sp = sub.add_parser("evaluate", help="a model's dev metrics on a task, without training")
    common(sp)
    sp.add_argument("model", nargs="?", metavar="MODEL_OR_RUN_DIR",
                    help="a preset, hub id, model folder or run directory (default: --set "
                    "model=...)")
    sp.add_argument("--step", type=int, help="a run directory's weights after N steps")
    sp.add_argument("--force", action="store_true",
                    help="a run that is running or failed; a model the planner says won't fit")
    sp.add_argument("--json", action="store_true", help="print the metrics as JSON")
    sp.set_defaults(fn=cmd_evaluate)
