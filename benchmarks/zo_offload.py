"""MeZO vs ZO-offload on the GPU machine (issue: ZO block-streaming offload engine).

Suites (combine with commas):
  main      tokens/s and peak memory, MeZO vs zo-offload, per model / amp / batch shape, with the
            lower bound max(two forward passes, bytes each way / measured PCIe bandwidth)
  ablation  each scheduler knob off in turn (the paper's Table 2)
  codecs    zo-offload tokens/s per codec and master (the paper's Table 3)
  telemetry telemetry fully on vs off; NVML PCIe rates vs the engine's bytes / time
  methods   zo-offload vs forward-grad (tokens/s, peak memory)
  cap       the largest OPT preset that trains under a 24 GiB GPU memory cap
Usage: python benchmarks/zo_offload.py --suite main --models opt-125m,opt-1.3b
  main, one method per process (a fresh process per row; the ratios and the bound are then
  the caller's, from the rows' JSON):
    python benchmarks/zo_offload.py --models nemotron-h-8b --amps off --shapes 8x128 --methods mezo
    python benchmarks/zo_offload.py --models nemotron-h-8b --amps bf16 --shapes 8x128 \
        --methods zo-offload --codec bf16 --master compressed-sr
  plumbing on the CPU (no PCIe rates, no bounds, nothing saved):
    --device cpu --models tiny:nemotron_h --shapes 2x16
"""
from __future__ import annotations

import argparse
import contextlib
import time

import torch

from common import add_bound, measure, pcie_bandwidth, save, table

from workbench.config import RunConfig
from workbench.engine.codecs import wire as codec_module


def run_main(args, bw) -> list[dict]:
    """``--methods`` picks the rows (both: zo-offload's ratios to MeZO and its bound from MeZO's
    compute; zo-offload alone: the bound from its own compute); ``--codec`` / ``--master`` are
    zo-offload's (MeZO keeps fp32 weights)."""
    rows = args.sink.setdefault("main", [])
    knobs = {k: v for k, v in (("codec", args.codec), ("master", args.master)) if v}
    tag = "".join(f" {v}" for v in knobs.values())
    for model in args.models:
        for amp in args.amps:
            for b, t in args.shapes:
                base = RunConfig(model=model, data="synthetic", device=args.device, amp=amp,
                                 batch_size=b, seq_len=t, steps=args.steps, lr=1e-7)
                mezo = off = None
                if "mezo" in args.methods:
                    mezo = measure(base.replace(method="mezo"), f"{model} {amp} {b}x{t} mezo")
                if "zo-offload" in args.methods:
                    off = measure(base.replace(method="zo-offload", **knobs),
                                  f"{model} {amp} {b}x{t} offload{tag}")
                now = [r for r in (mezo, off) if r is not None]
                for r in now:
                    r.update(model=model, amp=amp, shape=f"{b}x{t}")
                fwd2 = mezo.get("compute_seconds_per_step") if mezo else None
                if off is not None and "error" not in off and bw is not None:
                    # MeZO's two forward passes: the compute bound (alone: its own compute)
                    add_bound(off, bw, fwd2 if mezo else off.get("compute_seconds_per_step"))
                if off and mezo and "error" not in off and "error" not in mezo:
                    off["tps_ratio"] = off["tokens_per_s"] / mezo["tokens_per_s"]
                    off["mem_ratio"] = (off["peak_gpu_mem_bytes"] / mezo["peak_gpu_mem_bytes"]
                                        if mezo["peak_gpu_mem_bytes"] else None)
                if mezo is not None:
                    mezo["lower_bound_s"] = fwd2
                rows += now
                args.flush()
                print(table(now, MAIN_COLS), flush=True)
    return rows


def _randint_stochastic_round(x: torch.Tensor, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """The rounding as it was before the fused kernel (commit 3897549): torch.randint noise and
    about seven passes over the block. Same cost as then; its own random numbers."""
    drop = 16 if dtype == torch.bfloat16 else 13
    gen = torch.Generator(device=x.device)
    gen.manual_seed(seed)
    noise = torch.randint(0, 1 << drop, x.shape, generator=gen, device=x.device, dtype=torch.int32)
    bits = x.contiguous().view(torch.int32)
    rounded = ((bits + noise) & ~((1 << drop) - 1)).view(torch.float32)
    return torch.where(torch.isfinite(x), rounded, x).to(dtype)


@contextlib.contextmanager
def sr_path(path: str):
    """Which stochastic rounding the SR codec uses: "fused" (the kernel), "torch" (the torch
    path of the same numbers) or "before" (the pre-kernel code). Benchmark-only switch."""
    fused, rounding = codec_module.sr_kernels, codec_module.stochastic_round
    if path in ("torch", "before"):
        codec_module.sr_kernels = lambda: None
    if path == "before":
        codec_module.stochastic_round = _randint_stochastic_round
    try:
        yield
    finally:
        codec_module.sr_kernels, codec_module.stochastic_round = fused, rounding


def _versus_first(args, suite: str, cols, runs, bw: dict | None = None) -> list[dict]:
    """Measure ``runs`` ((cfg, name, fields) in order); each row's tokens/s as a ratio to the
    first of the series, and with ``bw`` its distance from max(compute, bytes / PCIe)."""
    rows, ref = args.sink.setdefault(suite, []), None
    for cfg, name, fields in runs:
        with sr_path(fields.get("sr_path") or "fused"):
            r = measure(cfg, name)
        r.update(fields)
        if bw is not None and "error" not in r:
            add_bound(r, bw, r.get("compute_seconds_per_step"))
        ref = ref or r
        if "error" not in r and "error" not in ref:
            r["ratio"] = r["tokens_per_s"] / ref["tokens_per_s"]
        rows.append(r)
        args.flush()
        print(table([r], cols), flush=True)
    return rows


def run_ablation(args) -> list[dict]:
    variants = {"all on": {}, "overlap off": {"overlap": False},
                "reuse_buffers off": {"reuse_buffers": False},
                "fused_update off": {"fused_update": False}}
    for model in args.models:
        base = RunConfig(model=model, method="zo-offload", data="synthetic", device="cuda",
                         batch_size=16, seq_len=128, steps=args.steps, lr=1e-7,
                         amp=args.amps[0])
        _versus_first(args, "ablation", ABL_COLS,
                      [(base.replace(**knobs), f"{model} {label}",
                        {"model": model, "variant": label}) for label, knobs in variants.items()])
    return args.sink.get("ablation", [])


def run_codecs(args, bw) -> list[dict]:
    """``--combos``: codec/master[/torch-sr|/before-sr], the first being each series' reference."""
    combos = [c.split("/") for c in args.combos.split(",")]
    for model in args.models:
        for amp in [a for a in args.amps if a != "off"] or ["bf16"]:
            base = RunConfig(model=model, method="zo-offload", data="synthetic", device="cuda",
                             batch_size=16, seq_len=128, steps=args.steps, lr=1e-7, amp=amp)
            _versus_first(args, "codecs", CODEC_COLS,
                          [(base.replace(codec=c, master=m), f"{model} {amp} {'/'.join([c, m, *p])}",
                            {"model": model, "amp": amp, "codec": c, "master": m,
                             "sr_path": (p[0].removesuffix("-sr") if p else "fused")
                             if m == "compressed-sr" else None})
                           for c, m, *p in combos], bw)
    return args.sink.get("codecs", [])


def run_telemetry(args) -> list[dict]:
    """Telemetry fully on vs off, and NVML's PCIe rates against the engine's bytes / time."""
    rows = args.sink.setdefault("telemetry", [])
    for model in args.models:
        base = RunConfig(model=model, method="zo-offload", data="synthetic", device="cuda",
                         batch_size=16, seq_len=128, steps=args.steps + 3, lr=1e-7,
                         amp=args.amps[0])
        on = measure(base, f"{model} telemetry on")
        off = measure(base.replace(telemetry=False, sample_hz=0.0), f"{model} telemetry off")
        for r in (on, off):
            r.update(model=model)
        if "error" not in on and "error" not in off:
            on["ratio"] = on["tokens_per_s"] / off["tokens_per_s"]
            for d in ("rx", "tx"):
                engine = on.get("engine_h2d" if d == "rx" else "engine_d2h")
                nvml = on.get(f"nvml_{d}")
                if engine and nvml:
                    on[f"nvml_{d}_vs_engine"] = nvml / engine
        rows += [on, off]
        args.flush()
        print(table([on, off], TEL_COLS), flush=True)
    return rows


def run_methods(args) -> list[dict]:
    """zo-offload vs forward-grad: tokens/s and peak memory."""
    rows = args.sink.setdefault("methods", [])
    for model in args.models:
        for amp in args.amps:
            base = RunConfig(model=model, data="synthetic", device="cuda", batch_size=16,
                             seq_len=128, steps=args.steps, lr=1e-7, amp=amp)
            zo = measure(base.replace(method="zo-offload"), f"{model} {amp} zo-offload")
            fg = measure(base.replace(method="forward-grad"), f"{model} {amp} forward-grad")
            for r in (zo, fg):
                r.update(model=model, amp=amp)
            if "error" not in zo and "error" not in fg:
                fg["tps_ratio"] = fg["tokens_per_s"] / zo["tokens_per_s"]
                fg["mem_ratio"] = (fg["peak_gpu_mem_bytes"] / zo["peak_gpu_mem_bytes"]
                                   if zo["peak_gpu_mem_bytes"] else None)
            rows += [zo, fg]
            args.flush()
            print(table([zo, fg], MAIN_COLS), flush=True)
    return rows


def run_cap(args) -> list[dict]:
    """Largest preset under a 24 GiB cap, largest first; host RAM decides the master format."""
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(24 * 2**30 / total)
    rows = args.sink.setdefault("cap", [])
    for model, codec, master in [("opt-30b", "bf16", "compressed-sr"), ("opt-13b", "fp32", "fp32")]:
        cfg = RunConfig(model=model, method="zo-offload", data="synthetic", device="cuda",
                        batch_size=16, seq_len=128, steps=3, amp="bf16", codec=codec,
                        master=master, lr=1e-7)
        r = measure(cfg, f"{model} under 24 GiB ({codec}/{master})")
        r.update(model=model, codec=codec, master=master)
        rows.append(r)
        args.flush()
        print(table([r], CAP_COLS), flush=True)
        if "error" not in r:
            break
    torch.cuda.set_per_process_memory_fraction(1.0)
    return rows


MAIN_COLS = [("run", "name", ""), ("tok/s", "tokens_per_s", "{:,.0f}"),
             ("x MeZO", "tps_ratio", "{:.2f}"), ("torch peak GB", "peak_gpu_mem_gb", "{:.2f}"),
             ("NVML GB", "nvml_peak_gb", "{:.2f}"), ("mem x", "mem_ratio", "{:.2f}"),
             ("step s", "step_seconds", "{:.4f}"), ("bound s", "lower_bound_s", "{:.4f}"),
             ("/bound", "vs_bound", "{:.2f}"), ("build s", "build_seconds", "{:.1f}"),
             ("error", "error", "")]
ABL_COLS = [("run", "name", ""), ("tok/s", "tokens_per_s", "{:,.0f}"),
            ("x all-on", "ratio", "{:.2f}"), ("step s", "step_seconds", "{:.4f}"), ("error", "error", "")]
CODEC_COLS = [("run", "name", ""), ("tok/s", "tokens_per_s", "{:,.0f}"),
              ("x fp32", "ratio", "{:.2f}"), ("H2D GB/step", "bytes_h2d_gb", "{:.2f}"),
              ("D2H GB/step", "bytes_d2h_gb", "{:.2f}"), ("step s", "step_seconds", "{:.4f}"),
              ("bound s", "lower_bound_s", "{:.4f}"), ("/bound", "vs_bound", "{:.2f}"),
              ("error", "error", "")]
TEL_COLS = [("run", "name", ""), ("tok/s", "tokens_per_s", "{:,.0f}"),
            ("on/off", "ratio", "{:.3f}"), ("NVML rx GB/s", "nvml_rx_gb", "{:.1f}"),
            ("engine h2d GB/s", "engine_h2d_gb", "{:.1f}"), ("rx/engine", "nvml_rx_vs_engine", "{:.3f}"),
            ("NVML tx GB/s", "nvml_tx_gb", "{:.1f}"), ("engine d2h GB/s", "engine_d2h_gb", "{:.1f}"),
            ("tx/engine", "nvml_tx_vs_engine", "{:.3f}"), ("error", "error", "")]
CAP_COLS = [("run", "name", ""), ("tok/s", "tokens_per_s", "{:,.0f}"),
            ("torch peak GB", "peak_gpu_mem_gb", "{:.2f}"), ("build s", "build_seconds", "{:.1f}"),
            ("error", "error", "")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", default="main")
    p.add_argument("--models", default="opt-125m,opt-350m,opt-1.3b,opt-2.7b,opt-6.7b,opt-13b")
    p.add_argument("--amps", default="off,bf16")
    p.add_argument("--shapes", default="16x128")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--methods", default="mezo,zo-offload",
                   help="main suite: which rows (one per process: a fresh process per row)")
    p.add_argument("--codec", help="main suite: zo-offload's codec (default: the config's, fp32)")
    p.add_argument("--master", help="main suite: zo-offload's master (default: fp32)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="main suite: cpu is a plumbing check (no PCIe rates, no bounds)")
    p.add_argument("--combos", default="fp32/fp32,bf16/compressed-sr,bf16/compressed-sr/before-sr,"
                   "fp16/compressed-sr,bf16/fp32,fp8-e4m3/fp32,fp8-e5m2/fp32",
                   help="codecs suite: codec/master[/torch-sr|/before-sr] (torch-sr: the torch path of the "
                   "fused kernel's numbers; before-sr: the rounding before the kernel)")
    p.add_argument("--name", default="zo_offload")
    args = p.parse_args()
    args.models = args.models.split(",")
    args.amps = args.amps.split(",")
    args.shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    args.methods = args.methods.split(",")
    suites = args.suite.split(",")
    if args.device == "cpu" and suites != ["main"]:
        p.error("--device cpu: the main suite only")
    t = time.perf_counter()
    bw = None
    if args.device == "cuda":
        bw = pcie_bandwidth()
        print(f"PCIe pinned: H2D {bw['h2d'] / 1e9:.1f} GB/s, D2H {bw['d2h'] / 1e9:.1f} GB/s, "
              f"both {bw['both_per_direction'] / 1e9:.1f} GB/s per direction", flush=True)
    out: dict = {"pcie": bw, "args": {k: v for k, v in vars(args).items()}}
    args.sink = out
    # after every row: a timeout keeps what ran (a CPU plumbing run saves nothing)
    args.flush = (lambda: save(args.name, out)) if args.device == "cuda" else (lambda: None)
    for suite, fn in (("main", lambda: run_main(args, bw)), ("ablation", lambda: run_ablation(args)),
                      ("codecs", lambda: run_codecs(args, bw)), ("telemetry", lambda: run_telemetry(args)),
                      ("methods", lambda: run_methods(args)), ("cap", lambda: run_cap(args))):
        if suite in suites:
            fn()
    out["seconds"] = time.perf_counter() - t
    path = save(args.name, out) if args.device == "cuda" else "nothing (a CPU plumbing run)"
    for key, cols in (("main", MAIN_COLS), ("ablation", ABL_COLS), ("codecs", CODEC_COLS),
                      ("telemetry", TEL_COLS), ("methods", MAIN_COLS), ("cap", CAP_COLS)):
        if key in out:
            print(f"\n== {key}\n" + table(out[key], cols))
    print(f"\nsaved {path} ({out['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
