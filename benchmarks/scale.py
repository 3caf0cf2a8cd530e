"""The largest models on one GPU, through the real CLI (issue 21, parts 1 and 2).

Each row is ``python -m workbench run --set ... --out DIR`` (the command a user types), its
process tree watched from outside every 0.5 s: peak host RSS / PSS (psutil) and peak GPU memory
as NVML sees it, less what the device used before the run started (the driver's reserve, this
script's own context; the whole device, so run it on an otherwise idle GPU). Read back from the run's
own run.json: steady tokens/s and median step, torch peak, bytes per step, build seconds. Beside
each row, the planner's prediction for the same settings (``workbench plan --json``, this
machine's calibration) and the step's transfer bound (bytes per step / pinned PCIe rate, both
directions at once when blocks also go down; one way for a frozen stream).

    python benchmarks/scale.py --rows opt-66b-full        # one GPU of the 2-GPU machine
    python benchmarks/scale.py --rows opt-175b-lora-fp8 --gpu-index 0
    python benchmarks/scale.py --rows tiny --device cpu   # plumbing (no GPU figures)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import pcie_bandwidth, save, table, watch_tree  # first: this checkout on sys.path

ROOT = Path(__file__).resolve().parent.parent
CAP = {"gpu_mem_limit_gb": "24", "device": "cuda"}
FULL = {"method": "zo-offload", "amp": "bf16", "codec": "bf16", "master": "compressed-sr",
        "data": "synthetic", "batch_size": "8", "seq_len": "128", "sample_hz": "0"}
LORA = {**FULL, "peft": "lora", "codec": "fp32", "master": "fp32"}
#: row name -> settings (strings, as --set takes them)
ROWS = {"opt-66b-full": {**FULL, **CAP, "model": "opt-66b", "steps": "13"},
        "opt-175b-lora-fp8": {**LORA, **CAP, "model": "opt-175b", "base_codec": "fp8-e4m3",
                              "steps": "7"},
        "opt-175b-lora-int8": {**LORA, **CAP, "model": "opt-175b", "base_codec": "int8",
                               "steps": "7"},
        "tiny": {**FULL, "model": "tiny-opt", "device": "cpu", "amp": "off", "codec": "fp32",
                 "master": "fp32", "steps": "4", "batch_size": "2", "seq_len": "16"}}


def _sets(settings: dict) -> list[str]:
    return [x for k, v in settings.items() for x in ("--set", f"{k}={v}")]


def plan_for(settings: dict) -> dict:
    """The planner's JSON for ``settings`` (a separate process: this one holds no model)."""
    r = subprocess.run([sys.executable, "-m", "workbench", "plan", *_sets(settings), "--json"],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout).strip().splitlines()[-1:]}
    return json.loads(r.stdout)


def run_row(name: str, settings: dict, out: Path, gpu_index: int | None) -> dict:
    cmd = [sys.executable, "-m", "workbench", "run", *_sets(settings), "--out", str(out),
           "--quiet"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT)
    peak = {"rss": 0, "pss": 0, "nvml": 0}
    watcher = threading.Thread(target=watch_tree, args=(proc, peak, gpu_index), daemon=True)
    watcher.start()
    stdout, stderr = proc.communicate()
    watcher.join()
    row = {"name": name, "settings": settings, "wall_seconds": time.perf_counter() - t,
           "host_rss_gb": peak["rss"] / 1e9, "host_pss_gb": peak["pss"] / 1e9,
           # the run's own: the device's peak less what was used before it started
           "nvml_peak_gb": (max(peak["nvml"] - peak["nvml_base"], 0) / 1e9 if "nvml_base" in peak
                            else None),
           "nvml_device_peak_gb": peak["nvml"] / 1e9 if "nvml_base" in peak else None,
           "nvml_error": peak.get("nvml_error"), "stdout_tail": stdout[-1500:]}
    record = out / "run.json"
    if not record.exists():
        return {**row, "error": f"exit {proc.returncode}, no run.json: {stderr[-1500:]}"}
    rec = json.loads(record.read_text())
    row.update(from_record(rec))
    if proc.returncode != 0 or rec.get("status") != "done":
        row["error"] = f"exit {proc.returncode}, status {rec.get('status')}: {stderr[-800:]}"
    return row


def from_record(rec: dict) -> dict:
    """A row's figures from a run.json. A run that ended before its summary (stopped during
    the end-of-run save) is summarised from its steps by the recipe's own steady-state rule
    (``telemetry.steady.throughput``)."""
    from workbench.telemetry.steady import throughput

    steps = rec["steps"]
    s = rec.get("summary") or throughput(steps)
    peak = s.get("peak_gpu_mem_bytes") or max((x.get("mem_peak") or 0 for x in steps), default=0)
    return dict(status=rec.get("status"), tokens_per_s=s.get("tokens_per_s"),
                step_seconds=s.get("step_seconds"), warmup_steps=s.get("warmup_steps"),
                steady_steps=len(steps) - (s.get("warmup_steps") or 0),
                torch_peak_gb=peak / 1e9,
                h2d_gb_step=(steps[-1].get("bytes_h2d") or 0) / 1e9 if steps else None,
                d2h_gb_step=(steps[-1].get("bytes_d2h") or 0) / 1e9 if steps else None,
                build_seconds=rec["info"].get("build_seconds"),
                digest_seconds=rec["info"].get("digest_seconds"),
                step_seconds_all=[round(x["seconds"], 4) for x in steps],
                param_digest=rec.get("param_digest"), base_digest=rec.get("base_digest"))


def add_bound_and_plan(row: dict, bw: dict | None, plan: dict) -> None:
    """Transfer bound of the measured bytes and the planner's figures beside the row."""
    if bw and row.get("h2d_gb_step") is not None:
        up, down = row["h2d_gb_step"] * 1e9, row["d2h_gb_step"] * 1e9
        rate = bw["both_per_direction"] if down else bw["h2d"]
        row["bound_s"] = max(up, down) / rate
        row["vs_bound"] = row["step_seconds"] / row["bound_s"] if row.get("step_seconds") else None
    row["plan"] = plan
    if "error" not in plan:
        row["plan_step_s"] = plan["step_seconds"]
        row["plan_torch_gb"] = plan["peak_gpu_mem_bytes"] / 1e9
        row["plan_nvml_gb"] = plan["nvml_gpu_mem_bytes"] / 1e9
        row["plan_host_gb"] = plan["host_mem_bytes"] / 1e9
        row["plan_fits"] = {"gpu": plan["fits_gpu"], "host": plan["fits_host"]}

COLS = [("row", "name", ""), ("status", "status", ""), ("tok/s", "tokens_per_s", "{:,.0f}"),
        ("step s", "step_seconds", "{:.3f}"), ("plan s", "plan_step_s", "{:.3f}"),
        ("bound s", "bound_s", "{:.3f}"), ("step/bound", "vs_bound", "{:.2f}"),
        ("torch GB", "torch_peak_gb", "{:.2f}"), ("plan GB", "plan_torch_gb", "{:.2f}"),
        ("NVML GB", "nvml_peak_gb", "{:.2f}"), ("plan NVML", "plan_nvml_gb", "{:.2f}"), ("host RSS GB", "host_rss_gb", "{:.1f}"),
        ("plan host GB", "plan_host_gb", "{:.1f}"), ("build s", "build_seconds", "{:.0f}"),
        ("digest s", "digest_seconds", "{:.0f}"),
        ("steady", "steady_steps", "{}"), ("error", "error", "")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="opt-66b-full", help=f"comma list of {', '.join(ROWS)}")
    p.add_argument("--gpu-index", type=int, default=0, help="the GPU NVML watches")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--name", default="scale")
    p.add_argument("--from-run", metavar="RUN_JSON", help="no run: the row of a saved run.json "
                   "of --rows' one row (e.g. one whose process was ended during its save), "
                   "beside the planner; with --h2d-gbps, its transfer bound")
    p.add_argument("--h2d-gbps", type=float, default=0.0,
                   help="with --from-run: the pinned H2D rate that run's machine measured")
    args = p.parse_args()
    names = args.rows.split(",")
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        sys.exit(f"--rows: {', '.join(unknown)} not one of {', '.join(ROWS)}")
    cuda = args.device == "cuda"
    if args.from_run:
        return from_saved(args, names)
    bw = pcie_bandwidth() if cuda else None
    if bw:
        import torch
        torch.cuda.empty_cache()  # the probe's buffers go before the runs start
        print(f"PCIe pinned: H2D {bw['h2d'] / 1e9:.1f} GB/s, both {bw['both_per_direction'] / 1e9:.1f}"
              " GB/s per direction", flush=True)
    rows = []
    for name in names:
        settings = ROWS[name] if cuda else {**ROWS[name], "device": "cpu"}
        plan = plan_for(settings)
        with tempfile.TemporaryDirectory() as tmp:
            row = run_row(name, settings, Path(tmp) / "run", args.gpu_index if cuda else None)
        add_bound_and_plan(row, bw, plan)
        rows.append(row)
        print(table([row], COLS), flush=True)
    print("\n" + table(rows, COLS))
    print("GB = 10^9 B; NVML: the device's used memory less what was used before the run "
          "started (the driver's reserve, this script's own context); host: the run's process "
          "tree; bound: bytes per step / pinned PCIe (both directions at once when blocks go down)")
    path = save(args.name, {"rows": rows, "pcie": bw, "args": vars(args)})
    print(f"saved {path}")


def from_saved(args, names: list[str]) -> None:
    """--from-run: one row from a saved record (no host RSS / NVML: nothing watched it)."""
    if len(names) != 1:
        sys.exit("--from-run: name the record's one row in --rows")
    rec = json.loads(Path(args.from_run).read_text())
    row = {"name": names[0], "settings": ROWS[names[0]], "from_run": args.from_run,
           **from_record(rec)}
    bw = {"h2d": args.h2d_gbps * 1e9, "both_per_direction": None} if args.h2d_gbps else None
    add_bound_and_plan(row, bw, plan_for(ROWS[names[0]]))
    print(table([row], COLS))
    saved = save(args.name, {"rows": [row], "pcie": bw, "args": vars(args),
                             "run_environment": rec.get("environment")})
    print(f"saved {saved}")


if __name__ == "__main__":
    main()
