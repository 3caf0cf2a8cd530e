"""ZO-LoRA over a frozen, compressed block stream vs MeZO-LoRA on the GPU (issue 19, part 4).

Per (model, shape), every row in a fresh Python process (``fresh.run_fresh``), bf16 autocast:
  mezo+lora      the whole model on the GPU, base blocks in bf16 (base_codec=bf16)
  lora <codec>   zo-offload + lora, base on the host in bf16 / fp8-e4m3 / int8, up only
  full           full-parameter zo-offload (bf16 codec, compressed-sr master) beside them
Reported: steady tokens/s, peak GPU memory (torch allocator), the offload rows' ratios to
mezo+lora, and each stream's step against its transfer bound (bytes up per step / pinned H2D
rate, the link running one way). Targets (issue 19): fp8 / int8 >= 0.9x mezo+lora tokens/s at
<= 0.3x its peak memory; bf16 base step <= 1.1x its transfer bound.

    python benchmarks/lora_stream.py                         # opt-6.7b, opt-13b; 16x128, 1x2048
    python benchmarks/lora_stream.py --models opt-6.7b --shapes 16x128 --steps 6
    python benchmarks/lora_stream.py --device cpu --models tiny-opt --shapes 2x16 --steps 3
"""
from __future__ import annotations

import argparse
import sys
import time

from fresh import run_fresh

CODECS = ("bf16", "fp8-e4m3", "int8")
TARGET_RATIO, TARGET_MEM, TARGET_BOUND = 0.9, 0.3, 1.1


def specs_for(model: str, b: int, t: int, args) -> list[dict]:
    base = {"model": model, "data": "synthetic", "device": args.device, "batch_size": b,
            "seq_len": t, "steps": args.steps, "lr": 1e-7, "amp": "bf16"}
    lora = {**base, "peft": "lora"}
    rows = [("mezo+lora", {**lora, "method": "mezo", "base_codec": "bf16"})]
    rows += [(f"lora {c}", {**lora, "method": "zo-offload", "base_codec": c}) for c in CODECS]
    rows.append(("full", {**base, "method": "zo-offload", "codec": "bf16",
                          "master": "compressed-sr"}))
    return [{"name": f"{model} {b}x{t} {kind}", "kind": kind, "config": cfg} for kind, cfg in rows]


def summarise(rows: dict[str, dict], h2d: float | None) -> list[dict]:
    """The table lines of one (model, shape): each row against mezo+lora and its bound."""
    ref = rows.get("mezo+lora", {})
    out = []
    for kind, r in rows.items():
        line = {"kind": kind, "tps": r.get("tokens_per_s"), "peak_gb": r.get("peak_gpu_mem_gb"),
                "step_s": r.get("step_seconds"), "h2d_gb": (r.get("bytes_h2d") or 0) / 1e9,
                "d2h_gb": (r.get("bytes_d2h") or 0) / 1e9, "error": r.get("error")}
        if not line["error"] and ref and not ref.get("error") and kind != "mezo+lora":
            line["tps_ratio"] = r["tokens_per_s"] / ref["tokens_per_s"]
            line["mem_ratio"] = (r["peak_gpu_mem_bytes"] / ref["peak_gpu_mem_bytes"]
                                 if ref.get("peak_gpu_mem_bytes") else None)  # CPU: no GPU peak
        if not line["error"] and h2d and r.get("bytes_h2d"):
            line["bound_s"] = r["bytes_h2d"] / h2d
            line["vs_bound"] = r["step_seconds"] / line["bound_s"]
        met = []
        if kind in ("lora fp8-e4m3", "lora int8") and line.get("mem_ratio") is not None:
            met.append(line["tps_ratio"] >= TARGET_RATIO and line["mem_ratio"] <= TARGET_MEM)
        if kind == "lora bf16" and "vs_bound" in line:
            met.append(line["vs_bound"] <= TARGET_BOUND)
        line["targets"] = " ".join("met" if m else "missed" for m in met)
        out.append(line)
    return out


COLS = [("model", "model", ""), ("shape", "shape", ""), ("row", "kind", ""),
        ("tok/s", "tps", "{:,.0f}"), ("x mezo+lora", "tps_ratio", "{:.3f}"),
        ("peak GB", "peak_gb", "{:.2f}"), ("mem x", "mem_ratio", "{:.3f}"),
        ("step s", "step_s", "{:.4f}"), ("H2D GB/step", "h2d_gb", "{:.2f}"),
        ("D2H GB/step", "d2h_gb", "{:.2f}"), ("bound s", "bound_s", "{:.4f}"),
        ("step/bound", "vs_bound", "{:.3f}"), ("targets", "targets", ""), ("error", "error", "")]


def report(paths: list[str], calibration_path: str | None = None) -> None:
    """One table from the runs of saved files, each (model, shape) against its mezo+lora row
    (rows of one shape may come from several files, e.g. one re-run with --kinds) and the PCIe
    rate of the first file holding it; with a calibration, the planner's predictions over the
    measurements."""
    import json

    from common import table

    calibration = None
    if calibration_path:  # a calibration of the same machine (planner_check saves one)
        calibration = json.loads(open(calibration_path).read())["calibration"]
    groups: dict = {}  # (model, shape) -> kind -> run; rows of one shape may span files
    rates: dict = {}  # (model, shape) -> the first file's pinned H2D rate for that shape
    for path in paths:
        saved = json.loads(open(path).read())
        for r in saved["runs"]:
            key = (r["model"], r["shape"])
            groups.setdefault(key, {})[r["kind"]] = r
            rates.setdefault(key, (saved.get("pcie") or {}).get("h2d"))
    lines = []
    for (model, shape), rows in groups.items():
        found = [{"model": model, "shape": shape, **x} for x in summarise(rows, rates[model, shape])]
        if calibration:
            for line in found:
                line.update(predicted(rows[line["kind"]], calibration))
        lines += found
    cols = COLS[:-2] + PLAN_COLS if calibration else COLS
    print(table(lines, cols))


PLAN_COLS = [("plan mem x", "plan_mem", "{:.3f}"), ("plan time x", "plan_time", "{:.3f}")]


def predicted(run: dict, calibration: dict) -> dict:
    """The planner's peak memory and step time for a measured run, over the measurement."""
    from workbench.config import RunConfig
    from workbench.plan.planner import plan

    if "error" in run:
        return {}
    cfg = {k: v for k, v in run["full_config"].items() if k not in ("steps", "lr")}
    p = plan(RunConfig(**cfg), calibration=calibration).to_dict()
    return {"plan_mem": p["peak_gpu_mem_bytes"] / run["peak_gpu_mem_bytes"],
            "plan_time": p["step_seconds"] / run["step_seconds"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="opt-6.7b,opt-13b")
    p.add_argument("--shapes", default="16x128,1x2048")
    p.add_argument("--steps", type=int, default=8, help="steps per run (warm-up left out)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--timeout", type=float, default=400.0, help="seconds per row")
    p.add_argument("--kinds", default="", help="only these rows (comma list of mezo+lora, "
                   "lora bf16, lora fp8-e4m3, lora int8, full; default all); --report merges")
    p.add_argument("--name", default="lora-stream")
    p.add_argument("--report", nargs="*", help="saved JSON files: one table from their runs "
                   "(rows cut short by a timeout included; nothing is run)")
    p.add_argument("--calibration", help="with --report: a JSON with this machine's "
                   "'calibration' (planner_check's results): adds the planner's predictions")
    args = p.parse_args()
    if args.report:
        return report(args.report, args.calibration)
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]

    from common import save, table

    t0 = time.perf_counter()
    bw = None
    if args.device == "cuda":
        bw = run_fresh({"pcie": True, "name": "pcie"}, args.timeout)
        if "error" in bw:
            sys.exit(f"PCIe measurement failed: {bw['error']}")
        print(f"PCIe pinned: H2D {bw['h2d'] / 1e9:.1f} GB/s", flush=True)
    out: dict = {"pcie": bw, "args": vars(args), "runs": [], "rows": [],
                 "targets": {"tps_ratio": TARGET_RATIO, "mem_ratio": TARGET_MEM,
                             "bf16_step_vs_bound": TARGET_BOUND}}
    for model in args.models.split(","):
        for b, t in shapes:
            rows = {}
            for spec in specs_for(model, b, t, args):
                if args.kinds and spec["kind"] not in args.kinds.split(","):
                    continue
                r = run_fresh(spec, args.timeout)
                r.update(kind=spec["kind"], model=model, shape=f"{b}x{t}",
                         full_config=spec["config"])
                out["runs"].append(r)
                rows[spec["kind"]] = r
                print(f"{spec['name']}: " + (r["error"] if "error" in r else
                      f"{r['tokens_per_s']:,.0f} tokens/s, peak {r['peak_gpu_mem_gb']:.2f} GB, "
                      f"step {r['step_seconds']:.4f} s"), flush=True)
                if args.device == "cuda":
                    save(args.name, out)  # after every row: a timeout keeps what ran
            lines = summarise(rows, bw["h2d"] if bw else None)
            out["rows"] += [{"model": model, "shape": f"{b}x{t}", **x} for x in lines]
    out["seconds"] = time.perf_counter() - t0
    saved = save(args.name, out) if args.device == "cuda" else "nothing (a CPU plumbing run)"
    print("\n" + table(out["rows"], COLS))
    print(f"\nsteady tokens/s; bound = bytes up per step / pinned H2D; targets: fp8 / int8 >= "
          f"{TARGET_RATIO}x mezo+lora tokens/s at <= {TARGET_MEM}x its peak, bf16 step/bound <= "
          f"{TARGET_BOUND}\nsaved {saved} ({out['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
