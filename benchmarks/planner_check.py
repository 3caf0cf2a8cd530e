"""Planner predictions against measurements (issue 16, part 8): one command on the GPU.

On a GPU (the default there): this machine is calibrated in a fresh process (the fused-kernel
timing included: its ``fused_kernel`` flag and rate are printed), then every row is measured in
a fresh process of its own (``fresh.py``'s child: the training recipe, steady steps), then each
row is predicted by ``workbench.plan.planner.plan`` with that calibration and the table gives
predicted / measured peak GPU memory (torch allocator) and step time, and how many rows are
within 10% (memory) and 15% (time). Rows: MeZO and zo-offload at 16 x 128, amp off and bf16,
for ``--models`` (the 24 rows of the H200 session of 2026-11-22 with every model), plus
zo-offload bf16 + compressed-sr at 1 x 2048 (the AMP memory rows of part 7).

    python benchmarks/planner_check.py --models opt-125m,opt-350m,opt-1.3b,opt-2.7b   # ~6 min
    python benchmarks/planner_check.py --models opt-6.7b,opt-13b                      # ~8 min
    python benchmarks/planner_check.py --from-results NVIDIA-H200-2026-11-22          # any machine

``--from-results DAY`` re-predicts rows saved by an earlier session instead (zo_offload-DAY.json,
main13b-DAY.json, calibration-DAY.json); that session's calibration had a broken fused-kernel
timing, so there the perturbation rate is derived from its MeZO rows, and said so.
``--rows-from FILE --calibration JSON`` re-predicts measured rows with the calibration of another
run's saved JSON (its ``calibration``): FILE is a saved planner_check JSON (its ``measured``) or
the log of a run cut off before it saved (step seconds and GiB as printed, 4 and 2 decimals).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from common import RESULTS, in_fresh_process, save, table  # first: this checkout on sys.path

from workbench.config import RunConfig
from workbench.presets import PRESETS
from workbench.plan.planner import plan

HERE = Path(__file__).resolve().parent
MODELS = "opt-125m,opt-350m,opt-1.3b,opt-2.7b,opt-6.7b,opt-13b"
SR = {"amp": "bf16", "codec": "bf16", "master": "compressed-sr"}


def load_rows(day: str) -> list[dict]:
    rows = []
    for name in ("zo_offload", "main13b"):
        path = RESULTS / f"{name}-{day}.json"
        if path.is_file():
            rows += [r for r in json.loads(path.read_text()).get("main", []) if "error" not in r]
    return rows


def perturb_rate(rows: list[dict]) -> float:
    """Elements per second of one fused perturbation pass, from MeZO's step minus compute."""
    rates = []
    for r in rows:
        if r["config"]["method"] == "mezo" and r["config"]["amp"] == "off":
            n = PRESETS[r["config"]["model"]].total_params()
            spare = r["step_seconds"] - r["compute_seconds_per_step"]
            if n > 5e8 and spare > 0:
                rates.append(4 * n / spare)
    return statistics.median(rates)


def specs(models: list[str], steps: int) -> list[dict]:
    """The rows to measure: (method, amp) at 16 x 128 per model, + bf16/SR at 1 x 2048."""
    out = []
    for model in models:
        for amp in ("off", "bf16"):
            for method in ("mezo", "zo-offload"):
                out.append({"name": f"{model} {amp} 16x128 {method}", "config": {
                    "model": model, "method": method, "amp": amp, "batch_size": 16,
                    "seq_len": 128}})
        out.append({"name": f"{model} bf16+sr 1x2048 zo-offload", "config": {
            "model": model, "method": "zo-offload", "batch_size": 1, "seq_len": 2048, **SR}})
    for spec in out:
        spec["config"].update(data="synthetic", device="cuda", steps=steps, lr=1e-7)
    return out


def rows_from(path: Path) -> list[dict]:
    """Measured rows: a saved planner_check JSON's ``measured``, or the rows a run printed in its
    log (``NAME: S s/step, G GiB``), their configs from ``specs``."""
    text = path.read_text()
    if path.suffix == ".json":
        return json.loads(text)["measured"]
    known = {sp["name"]: sp["config"] for sp in specs(MODELS.split(","), 0)}
    rows = []
    for line in text.splitlines():
        name, _, rest = line.partition(": ")
        parts = rest.replace(" s/step,", "").replace(" GiB", "").split()
        if name in known and len(parts) == 2:
            rows.append({"name": name, "config": known[name], "step_seconds": float(parts[0]),
                         "peak_gpu_mem_bytes": float(parts[1]) * 2**30})
    return rows


def measure_rows(args) -> tuple[dict, list[dict]]:
    """Calibrate, then run every row, each in a fresh process."""
    calib = in_fresh_process(HERE / "planner_check.py", {"calibrate": True}, args.timeout)
    if "error" in calib:
        sys.exit(f"calibration failed: {calib['error']}")
    print(f"calibration: {calib.get('gpu_name')}, fused kernel "
          f"{'works' if calib.get('fused_kernel') else 'FAILED (torch path)'}, perturbation "
          f"{calib.get('perturb_fused_per_s', 0) / 1e9:.0f} G elements/s fused", flush=True)
    for key, (per_step, per_block) in calib.get("host_costs_s", {}).items():
        print(f"  host, {key}: {per_step * 1e3:.2f} ms per step + {per_block * 1e3:.3f} ms per "
              f"block", flush=True)
    for key, rate in calib.get("block_flops_by_shape", {}).items():
        print(f"  block {key}: {rate['off'] / 1e12:.1f} TFLOP/s fp32, "
              f"{rate['bf16'] / 1e12:.1f} bf16", flush=True)
    rows = []
    for spec in specs(args.models.split(","), args.steps):
        r = in_fresh_process(HERE / "fresh.py", spec, args.timeout)
        r.setdefault("config", spec["config"])
        r["name"] = spec["name"]
        print(f"{spec['name']}: " + (r["error"] if "error" in r else
              f"{r['step_seconds']:.4f} s/step, {r['peak_gpu_mem_bytes'] / 2**30:.2f} GiB"),
              flush=True)
        if "error" not in r:
            rows.append(r)
    return calib, rows


def compare(rows: list[dict], calib: dict) -> list[dict]:
    out = []
    for r in rows:
        c = r["config"]
        cfg = RunConfig(**{k: c[k] for k in ("model", "method", "amp", "batch_size", "seq_len")},
                        **{k: c[k] for k in ("codec", "master") if k in c},
                        data="synthetic", device="cuda")
        p = plan(cfg, calibration=calib).to_dict()
        out.append({"run": r["name"], "mem_pred_gb": p["peak_gpu_mem_bytes"] / 1e9,
                    "mem_meas_gb": r["peak_gpu_mem_bytes"] / 1e9,
                    "mem_ratio": p["peak_gpu_mem_bytes"] / r["peak_gpu_mem_bytes"],
                    "time_pred_s": p["step_seconds"], "time_meas_s": r["step_seconds"],
                    "time_ratio": p["step_seconds"] / r["step_seconds"]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per row")
    ap.add_argument("--from-results", metavar="DAY",
                    help="re-predict rows saved by an earlier session "
                         "(e.g. NVIDIA-H200-2026-11-22)")
    ap.add_argument("--rows-from", metavar="FILE", type=Path,
                    help="re-predict measured rows (a saved JSON, or a cut-off run's log) with "
                         "--calibration")
    ap.add_argument("--calibration", metavar="JSON", type=Path,
                    help="a saved planner_check JSON whose calibration --rows-from uses")
    ap.add_argument("--name", default="planner_check")
    ap.add_argument("--row", help=argparse.SUPPRESS)  # internal: calibrate in this process
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.row:
        from workbench.calibrate.machine import calibrate

        Path(args.result).write_text(json.dumps(calibrate("cuda", save=False), default=str))
        return
    import torch

    start, note = time.perf_counter(), ""
    if args.rows_from:
        if args.calibration is None:
            ap.error("--rows-from needs --calibration (a saved planner_check JSON)")
        calib = json.loads(args.calibration.read_text())["calibration"]
        rows = rows_from(args.rows_from)
        note = (f"rows measured in {args.rows_from.name}, predicted with the calibration of "
                f"{args.calibration.name}")
    elif args.from_results or not torch.cuda.is_available():
        day = args.from_results or "NVIDIA-H200-2026-11-22"
        calib = json.loads((RESULTS / f"calibration-{day}.json").read_text())
        calib = next(iter(calib["machines"].values()))
        rows = load_rows(day)
        rate = perturb_rate(rows)
        calib = {**calib, "perturb_fused_per_s": rate, "fused_kernel": True}
        note = (f"rows of {day}; perturbation rate derived from its MeZO rows: "
                f"{rate / 1e9:.0f} G elements/s per pass (that calibration's fused timing failed)")
    else:
        calib, rows = measure_rows(args)
        note = f"measured now on {calib.get('gpu_name')} ({time.perf_counter() - start:.0f} s)"
    out = compare(rows, calib)
    big = []
    for model in ("opt-66b", "opt-175b"):
        for b, t in ((16, 128), (1, 2048)):
            cfg = RunConfig(model=model, method="zo-offload", amp="bf16", codec="bf16",
                            master="compressed-sr", data="synthetic", device="cuda",
                            batch_size=b, seq_len=t)
            p = plan(cfg, gpu="24gb").to_dict()
            big.append({"run": f"{model} zo-offload bf16/sr {b}x{t} on 24gb",
                        "gpu_gib": p["peak_gpu_mem_bytes"] / 2**30,
                        "nvml_gib": p["nvml_gpu_mem_bytes"] / 2**30,
                        "host_gib": p["host_mem_bytes"] / 2**30, "fits": p["fits_gpu"],
                        "step_s": p["step_seconds"]})
    cols = [("run", "run", ""), ("mem pred GB", "mem_pred_gb", "{:.2f}"),
            ("mem meas GB", "mem_meas_gb", "{:.2f}"), ("pred/meas", "mem_ratio", "{:.3f}"),
            ("time pred s", "time_pred_s", "{:.4f}"), ("time meas s", "time_meas_s", "{:.4f}"),
            ("pred/meas", "time_ratio", "{:.3f}")]
    bcols = [("plan", "run", ""), ("torch GiB", "gpu_gib", "{:.1f}"),
             ("NVML GiB", "nvml_gib", "{:.1f}"), ("host GiB", "host_gib", "{:.1f}"),
             ("fits GPU", "fits", ""), ("step s", "step_s", "{:.2f}")]
    within = (sum(abs(r["mem_ratio"] - 1) <= 0.10 for r in out),
              sum(abs(r["time_ratio"] - 1) <= 0.15 for r in out))
    print(note)
    print(table(out, cols))
    print(f"within 10% memory: {within[0]}/{len(out)}; within 15% time: {within[1]}/{len(out)}\n")
    print(table(big, bcols))
    path = save(args.name, {"note": note, "calibration": calib, "rows": out, "large": big,
                            "within": {"memory_10pct": within[0], "time_15pct": within[1],
                                       "rows": len(out)}, "measured": rows})
    print(f"saved {path}")


if __name__ == "__main__":
    main()
