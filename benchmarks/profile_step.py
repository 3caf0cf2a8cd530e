"""Where a steady step's GPU time goes, kernel by kernel and stream by stream (issue 16).

For targets a step-level figure cannot explain (zo-offload at 0.977x MeZO in fp32 while its
compute spans add up to MeZO's whole step; opt-350m bf16 zo-offload 2.8x MeZO's step): each row
runs in a fresh process, builds the engine, warms its kernels, runs ``--warmup`` steps, times
four steps (the GPU drained before and after: wall seconds per step, and the host's seconds to
enqueue one), then records ``--steps`` steps under ``torch.profiler`` and sums the trace:

* per stream: busy seconds per step by kind (GEMM, attention, the fused ZO kernel, codec
  kernels, layer norm, elementwise, copies, other) and the copies' bytes;
* the compute stream's idle time inside its span and its longest gaps, each with the kernels
  on either side (what the stream waited between);
* the CUDA runtime calls the host made (seconds and calls per step): a synchronising call
  shows here even where no kernel waits for it.

``--recipe`` adds, per method, the training recipe's own steady step in another fresh process
(``common.measure``), so engine-only and recipe step times can be told apart.

    python benchmarks/profile_step.py --model opt-1.3b --shape 16x128 --rows mezo,zo-offload
    python benchmarks/profile_step.py --model opt-350m --amp bf16 --rows mezo,zo-offload --recipe
    python benchmarks/profile_step.py --device cpu --model tiny-opt --shape 2x16   # plumbing

Saves benchmarks/results/profile_step-<gpu>-<date>.json, and with ``--traces`` each row's
Chrome trace (gzip) under $OUT (or /tmp).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from common import add_fresh_args, finish, in_fresh_process

#: kernel kind -> lower-case name fragments (first match wins, in this order)
KINDS = (("zo kernel", ("zo_kernel", "normals_kernel")),
         ("codec", ("encode", "decode", "_sr_", "codec")),
         ("attention", ("flash", "fmha", "attention", "attn")),
         ("gemm", ("gemm", "sm90_", "sm80_", "cutlass", "nvjet", "xmma", "ampere_")),
         ("layer norm", ("layer_norm", "layernorm", "rms_norm")),
         ("softmax / loss", ("softmax", "cross_entropy", "nll_loss", "log_softmax")),
         ("elementwise", ("elementwise", "vectorized", "unrolled", "reduce")))
GAP_US = 2.0  # gaps shorter than this are launch spacing, not waiting


def kind(name: str, cat: str = "kernel") -> str:
    """The kind of a GPU event: a kernel's from ``KINDS`` (else "other"); a copy's direction
    from its name ("Memcpy HtoD (Pinned -> Device)" -> "copy htod"), marked "pageable" where
    the host side is not page-locked (such a copy stages through the driver at a third of the
    speed); a memset "memset"."""
    low = name.lower()
    if cat == "gpu_memset":
        return "memset"
    if cat == "gpu_memcpy":
        words = low.split()
        return ("copy " + words[1] if len(words) > 1 else "copy") + (
            " pageable" if "pageable" in low else "")
    for label, parts in KINDS:
        if any(p in low for p in parts):
            return label
    return "other"


def summarize(events: list[dict], steps: int, top: int = 10) -> dict:
    """Sum a Chrome trace (``torch.profiler`` export: ``ts`` / ``dur`` in microseconds) of
    ``steps`` steps. Returns seconds per step: ``gpu_span_s`` (first kernel start to last kernel
    end), per stream (``args.stream``) ``busy_s``, ``span_s``, ``idle_s`` (span - busy),
    ``by_kind_s``, ``bytes`` per copy kind, ``kernels`` (count), ``gaps`` (the ``top`` longest
    gaps over ``GAP_US``: microseconds, kernel before, kernel after); ``compute_stream`` (the
    stream with the most kernel time, copies not counted); ``runtime`` (CUDA runtime calls on
    the host: seconds and calls per step, most time first)."""
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
           and "dur" in e]
    out: dict = {"steps": steps, "streams": {}, "gpu_span_s": 0.0, "compute_stream": None,
                 "runtime": {}}
    if gpu:
        first = min(e["ts"] for e in gpu)
        out["gpu_span_s"] = (max(e["ts"] + e["dur"] for e in gpu) - first) / 1e6 / steps
    per_stream: dict[str, list[dict]] = defaultdict(list)
    for e in gpu:
        per_stream[str(e.get("args", {}).get("stream", "?"))].append(e)
    for stream, es in per_stream.items():
        es.sort(key=lambda e: e["ts"])
        by_kind: dict[str, float] = defaultdict(float)
        nbytes: dict[str, float] = defaultdict(float)
        for e in es:
            k = kind(e["name"], e["cat"])
            by_kind[k] += e["dur"] / 1e6 / steps
            if e["cat"] == "gpu_memcpy":
                nbytes[k] += e.get("args", {}).get("bytes", 0) / steps
        gaps = sorted(((b["ts"] - a["ts"] - a["dur"], a["name"][:60], b["name"][:60])
                       for a, b in zip(es, es[1:]) if b["ts"] - a["ts"] - a["dur"] > GAP_US),
                      reverse=True)
        busy = sum(e["dur"] for e in es) / 1e6 / steps
        span = (es[-1]["ts"] + es[-1]["dur"] - es[0]["ts"]) / 1e6 / steps
        out["streams"][stream] = {"busy_s": busy, "span_s": span, "idle_s": span - busy,
                                  "by_kind_s": dict(sorted(by_kind.items(), key=lambda x: -x[1])),
                                  "bytes": dict(nbytes), "kernels": len(es) / steps,
                                  "gaps_over_us": sum(g for g, *_ in gaps) / 1e6 / steps,
                                  "gaps": [(round(g, 1), a, b) for g, a, b in gaps[:top]]}
    if out["streams"]:  # most kernel time: a copy stream can be busier (opt-350m bf16 offload)
        kernel_us = {st: sum(e["dur"] for e in es if e["cat"] == "kernel")
                     for st, es in per_stream.items()}
        out["compute_stream"] = max(out["streams"], key=lambda st: (
            kernel_us[st], out["streams"][st]["busy_s"]))
    calls: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for e in events:
        if e.get("cat") == "cuda_runtime" and "dur" in e:
            calls[e["name"]][0] += e["dur"] / 1e6 / steps
            calls[e["name"]][1] += 1 / steps
    out["runtime"] = dict(sorted(((k, (round(s, 6), round(n, 2))) for k, (s, n) in calls.items()),
                                 key=lambda x: -x[1][0])[:top])
    return out


def child(spec: dict, result: Path) -> None:
    """One row in this fresh process: a profiled engine (``spec["profile"]``) or the recipe's
    own steady step (``common.measure``)."""
    from workbench.config import RunConfig

    cfg = RunConfig(**spec["config"])
    if not spec.get("profile"):
        from common import measure

        result.write_text(json.dumps(measure(cfg, spec["name"]), default=str))
        return
    result.write_text(json.dumps(profile(cfg, spec), default=str))


def profile(cfg, spec: dict) -> dict:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from workbench.data.batches import SyntheticData
    from workbench.calibrate.fo import measure
    from workbench.engine import build_engine
    from workbench.engine.events import EventBus
    from workbench.engine.warmup import warm_kernels
    from workbench.models.build import build_skeleton

    cuda = cfg.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    device = torch.device(cfg.device)
    skeleton, source = build_skeleton(cfg.model)
    engine = build_engine(skeleton, source, cfg, device, EventBus(), measure=measure)
    warm, n = spec["warmup"], spec["steps"]
    try:
        warm_kernels(engine)
        data = SyntheticData(skeleton.config.vocab_size, cfg.seq_len)
        batches = [data.batch_for_step(t, cfg.batch_size, 0).to(device)
                   for t in range(warm + 4 + n)]
        for t in range(warm):
            engine.step(batches[t], t, cfg.lr, 0.0)
        sync()
        host = []
        start = time.perf_counter()
        for t in range(warm, warm + 4):
            h = time.perf_counter()
            engine.step(batches[t], t, cfg.lr, 0.0)
            host.append(time.perf_counter() - h)
        sync()
        wall = (time.perf_counter() - start) / 4
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with torch_profile(activities=activities) as prof:
            for t in range(warm + 4, warm + 4 + n):
                engine.step(batches[t], t, cfg.lr, 0.0)
            sync()
    finally:
        engine.close()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
        if spec.get("traces"):
            out_dir = Path(os.environ.get("OUT") or "/tmp")
            with open(path, "rb") as f, gzip.open(out_dir / f"trace-{spec['tag']}.json.gz",
                                                   "wb") as g:
                g.write(f.read())
    return {"name": spec["name"], "config": spec["config"], "wall_step_s": wall,
            "host_enqueue_s": statistics.median(host), **summarize(events, n)}


def row(res: dict) -> dict:
    """The table's view of a child's result."""
    if res.get("error"):
        return {"row": res.get("name"), "error": res["error"]}
    if "streams" not in res:  # a recipe row
        return {"row": res["name"], "wall ms": res.get("step_seconds", 0) * 1e3}
    comp = res["streams"].get(res["compute_stream"] or "", {})
    by = comp.get("by_kind_s", {})
    return {"row": res["name"], "wall ms": res["wall_step_s"] * 1e3,
            "host ms": res["host_enqueue_s"] * 1e3, "gpu span ms": res["gpu_span_s"] * 1e3,
            "compute busy ms": comp.get("busy_s", 0) * 1e3,
            "compute idle ms": comp.get("idle_s", 0) * 1e3,
            "gemm ms": by.get("gemm", 0) * 1e3, "attn ms": by.get("attention", 0) * 1e3,
            "zo ms": by.get("zo kernel", 0) * 1e3,
            "other ms": (comp.get("busy_s", 0) - by.get("gemm", 0) - by.get("attention", 0)
                         - by.get("zo kernel", 0)) * 1e3}


COLS = [("row", "row", ""), ("wall ms", "wall ms", "{:.2f}"), ("host ms", "host ms", "{:.2f}"),
        ("GPU span ms", "gpu span ms", "{:.2f}"), ("compute busy ms", "compute busy ms", "{:.2f}"),
        ("compute idle ms", "compute idle ms", "{:.2f}"), ("GEMM ms", "gemm ms", "{:.2f}"),
        ("attention ms", "attn ms", "{:.2f}"), ("ZO kernel ms", "zo ms", "{:.2f}"),
        ("other ms", "other ms", "{:.2f}"), ("error", "error", "")]


def specs(args) -> list[dict]:
    b, t = (int(x) for x in args.shape.split("x"))
    extra = dict(kv.split("=", 1) for kv in args.set)
    out = []
    for method in args.rows.split(","):
        cfg = {"model": args.model, "method": method, "device": args.device, "amp": args.amp,
               "batch_size": b, "seq_len": t, "data": "synthetic", "lr": 1e-7,
               **(extra if method != "mezo" else {})}
        tag = f"{args.model}-{method}-{args.amp}-{args.shape}"
        out.append({"name": f"{tag} engine", "tag": tag, "config": {**cfg, "telemetry": False},
                    "profile": True, "warmup": args.warmup, "steps": args.steps,
                    "traces": args.traces})
        if args.recipe:
            out.append({"name": f"{tag} recipe", "config": {**cfg, "steps": args.warmup + 8}})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_fresh_args(p, "profile_step", timeout=300)
    p.add_argument("--model", default="opt-1.3b")
    p.add_argument("--shape", default="16x128", help="BATCHxSEQ")
    p.add_argument("--amp", default="off")
    p.add_argument("--rows", default="mezo,zo-offload", help="methods, one row each")
    p.add_argument("--set", action="append", default=[], help="KEY=VALUE for the non-MeZO rows")
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--steps", type=int, default=3, help="profiled steps")
    p.add_argument("--recipe", action="store_true", help="add the recipe's steady step per row")
    p.add_argument("--traces", action="store_true", help="keep each Chrome trace (gzip)")
    args = p.parse_args()
    if args.row:
        child(json.loads(args.row), Path(args.result))
        return
    start = time.perf_counter()
    results = []
    for spec in specs(args):
        results.append(in_fresh_process(Path(__file__), spec, args.timeout))
        print(f"{spec['name']}: done", flush=True)
        res = results[-1]
        if "streams" in res:  # every stream's kinds; the compute stream's longest gaps
            comp = res["streams"].get(res["compute_stream"] or "", {})
            print(json.dumps({"by_stream_ms": {
                stream: {k: round(v * 1e3, 3) for k, v in st["by_kind_s"].items()}
                for stream, st in res["streams"].items()},
                "compute_gaps_us": comp.get("gaps", [])[:5],
                "runtime": dict(list(res["runtime"].items())[:6])}, indent=1))
    out = {"args": vars(args), "results": results, "rows": [row(r) for r in results]}
    finish(args, out, COLS, "seconds per step; engine rows exclude the recipe loop", start)


if __name__ == "__main__":
    sys.exit(main())
