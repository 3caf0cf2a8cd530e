"""fo-offload on one GPU under a memory cap: update throughput and iteration time per schedule.

The model's Adam state (fp32 p, g, m, v: 16 bytes / parameter) does not fit the cap, so it
lives in host memory and the schedules differ in where the update runs:

    all-cpu            ZeRO-Offload: every subgroup updated on the CPU
    static 20% / 50%   TwinFlow: that share of subgroups resident on the GPU, the rest on the CPU
    interleaved auto   Deep Optimizer States: the stride from the performance model
    all-gpu            everything resident (only where it fits)

One engine is built (host buffers are 16 bytes / parameter: 107 GB for opt-6.7b, pinned once)
and rescheduled between runs. Each schedule runs one warm-up step and ``--steps`` timed steps
of synthetic batches (8 x 128 tokens, bf16 autocast). A schedule whose predicted GPU memory
exceeds the cap is reported as not fitting instead of run.

    python benchmarks/fo_offload.py                      # opt-6.7b, 40 GB cap (~3 min, H200)
    python benchmarks/fo_offload.py --model opt-125m --cap-gb 2 --steps 2   # smoke run

Writes benchmarks/results/fo_offload-<gpu>-<date>.json (and a copy to $OUT if set).
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workbench.config import RunConfig  # noqa: E402
from workbench.data.batches import SyntheticData  # noqa: E402
from workbench.engine import build_engine, perfmodel  # noqa: E402
from workbench.engine.events import EventBus  # noqa: E402
from workbench.engine.fo_offload import N_SLOTS, make_schedule  # noqa: E402
from workbench.models.build import build_skeleton  # noqa: E402
from workbench.presets import PRESETS  # noqa: E402

GB = 1e9
NO_GPU = perfmodel.NO_GPU


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="opt-6.7b", help="preset name (default opt-6.7b)")
    ap.add_argument("--cap-gb", type=float, default=40.0, help="GPU memory cap, GB (default 40)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per schedule (default 3)")
    ap.add_argument("--subgroup", type=int, default=50_000_000,
                    help="parameters per optimizer subgroup (default 50M)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--strides", default="",
                    help="extra interleaved strides to measure, e.g. '-15,-3,2' (checks the model)")
    return ap.parse_args(argv)


def gpu_static_bytes(n: int, sub: int, stride: int, ratio: float) -> int:
    """GPU bytes fo-offload (bf16) holds between steps for a schedule: compute weights, kept
    gradients of GPU-updated subgroups, slots, resident (p, m, v) and upcast scratch."""
    s = make_schedule(-(-n // sub), stride, ratio)
    size = lambda j: min((j + 1) * sub, n) - j * sub  # noqa: E731
    gpu = sum(size(j) for j in s.gpu)
    res = sum(size(j) for j in s.resident)
    slots = min(N_SLOTS, len(s.gpu)) * 4 * 4 * sub
    return 2 * n + 2 * (gpu + res) + slots + 12 * res + (4 * sub if res else 0)


def run_schedule(engine, data, args, name: str, stride, ratio: float, dynamic: int,
                 cap: float) -> dict:
    n = engine.numel
    p = engine.perf
    k = stride if stride != "auto" else perfmodel.stride(p.B, p.Ug, p.Uc, p.Dc,
                                                         word_bytes=engine.word)
    need = gpu_static_bytes(n, engine.sub, k, ratio) + dynamic
    row = {"name": name, "stride": k, "gpu_resident_ratio": ratio,
           "predicted_gpu_bytes": need}
    if need > 0.97 * cap:
        row["skipped"] = f"does not fit: needs ~{need / GB:.1f} GB > cap {cap / GB:.1f} GB"
        return row
    try:
        engine.reschedule(k, ratio)
        torch.cuda.reset_peak_memory_stats()
        seconds = []
        for t in range(args.steps + 1):
            batch = data.batch_for_step(t, args.batch, 0).to("cuda")
            torch.cuda.synchronize()  # benchmark timing: whole steps, host clock
            t0 = time.perf_counter()
            engine.step(batch, t, 1e-5, 0.0)
            torch.cuda.synchronize()
            seconds.append(time.perf_counter() - t0)
        engine.sync()  # resolves the last step's update time
    except torch.cuda.OutOfMemoryError as e:
        row["skipped"] = f"out of memory: {str(e).splitlines()[0]}"
        gc.collect()
        torch.cuda.empty_cache()
        engine.reschedule(NO_GPU, 0.0)
        return row
    upd = engine.update_seconds[1:] or engine.update_seconds
    measured = sum(upd) / len(upd)
    row.update({
        "split": {"cpu": engine.split.cpu, "gpu": engine.split.gpu,
                  "resident": engine.split.resident},
        "update_s_predicted": engine.predicted_update_s,
        "update_s_measured": measured,
        "update_params_per_s": n / measured,
        "iteration_s": sum(seconds[1:]) / len(seconds[1:]),
        "iteration_s_each": seconds,
        "update_s_each": engine.update_seconds,
        "peak_gpu_bytes": torch.cuda.max_memory_allocated(),
        "gpu_param_bytes": engine.gpu_param_bytes(),
    })
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("fo_offload benchmark: needs a CUDA GPU", file=sys.stderr)
        return 2
    preset = PRESETS[args.model]
    n = preset.total_params()
    host_need = 16 * n + 4 * 2 * args.subgroup + 4 * GB
    try:
        import psutil

        avail = psutil.virtual_memory().available
        if avail < host_need:
            print(f"fo_offload benchmark: {args.model} needs ~{host_need / GB:.0f} GB of host "
                  f"memory (16 bytes / parameter), {avail / GB:.0f} GB available; use a smaller "
                  "--model", file=sys.stderr)
            return 2
    except ImportError:
        avail = None
    total = torch.cuda.get_device_properties(0).total_memory
    cap = min(args.cap_gb * GB, total)
    torch.cuda.set_per_process_memory_fraction(cap / total)
    cfg = RunConfig(model=args.model, method="fo-offload", device="cuda", amp="bf16", lr=1e-5,
                    data="synthetic", batch_size=args.batch, seq_len=args.seq,
                    subgroup_size=args.subgroup, update_stride=str(NO_GPU), telemetry=False)
    print(f"building fo-offload {args.model} ({n / 1e9:.2f} B params, host {16 * n / GB:.0f} GB, "
          f"GPU cap {cap / GB:.0f} GB) ...", flush=True)
    t0 = time.perf_counter()
    model, source = build_skeleton(cfg.model)
    engine = build_engine(model, source, cfg, torch.device("cuda"), EventBus())
    build_s = time.perf_counter() - t0
    data = SyntheticData(preset.vocab, args.seq)
    p = engine.perf
    k = perfmodel.balance_ratio(p.B, p.Ug, p.Uc, p.Dc, word_bytes=engine.word)
    auto = perfmodel.stride(p.B, p.Ug, p.Uc, p.Dc, word_bytes=engine.word)
    print(f"built in {build_s:.0f} s; B {p.B / 1e9:.2f}  Ug {p.Ug / 1e9:.1f}  Uc {p.Uc / 1e9:.2f}  "
          f"Dc {p.Dc / 1e9:.2f} G params/s -> k = {k:.3f}, auto stride {auto}", flush=True)

    # Baseline first: it also measures the step's transient GPU memory (activations, grads).
    base_static = gpu_static_bytes(n, engine.sub, NO_GPU, 0.0)
    rows = [run_schedule(engine, data, args, "all-cpu (ZeRO-Offload)", NO_GPU, 0.0, 0, cap)]
    dynamic = max(0, rows[0].get("peak_gpu_bytes", base_static) - base_static)
    plan = [("interleaved auto", "auto", 0.0), ("static 20% (TwinFlow)", NO_GPU, 0.2),
            ("static 50% (TwinFlow)", NO_GPU, 0.5), ("all-gpu", 1, 1.0)]
    plan += [(f"interleaved {s}", int(s), 0.0) for s in args.strides.split(",") if s.strip()]
    for name, stride, ratio in plan:
        print(f"  {name} ...", flush=True)
        rows.append(run_schedule(engine, data, args, name, stride, ratio, dynamic, cap))
    engine.close()

    head = (f"{'schedule':<24}{'stride':>11}{'gpu%':>6}{'res%':>6}{'upd pred s':>11}"
            f"{'upd meas s':>11}{'upd Gp/s':>9}{'iter s':>8}{'peak GB':>8}")
    print("\n" + head + "\n" + "-" * len(head))
    for r in rows:
        stride = "none" if r["stride"] == NO_GPU else str(r["stride"])
        if "skipped" in r:
            print(f"{r['name']:<24}{stride:>11}  {r['skipped']}")
            continue
        sp = r["split"]
        print(f"{r['name']:<24}{stride:>11}{100 * sp['gpu']:>6.0f}{100 * sp['resident']:>6.0f}"
              f"{r['update_s_predicted']:>11.3f}{r['update_s_measured']:>11.3f}"
              f"{r['update_params_per_s'] / 1e9:>9.2f}{r['iteration_s']:>8.3f}"
              f"{r['peak_gpu_bytes'] / GB:>8.1f}")

    import transformers

    gpu = torch.cuda.get_device_name(0)
    date = datetime.datetime.now().strftime("%Y-%m-%d")
    out = {
        "benchmark": "fo_offload", "gpu": gpu, "date": datetime.datetime.now().isoformat(),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "cuda": torch.version.cuda, "cpu_threads": torch.get_num_threads(),
        "host_available_bytes": avail, "args": vars(args), "params": n,
        "subgroups": engine.n_sub, "build_s": build_s, "gpu_cap_bytes": cap,
        "perf_inputs": p.as_dict(), "k": k, "auto_stride": auto,
        "step_transient_gpu_bytes": dynamic, "schedules": rows,
    }
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    name = f"fo_offload-{slug}-{date}.json"
    paths = [Path(__file__).resolve().parent / "results" / name]
    if os.environ.get("OUT"):
        paths.append(Path(os.environ["OUT"]) / name)
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=2, default=str))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
