"""Shared benchmark plumbing: run a config through the real recipe, print tables, save JSON.

Results go to benchmarks/results/<name>-<gpu>-<date>.json (and to $OUT when the device tool
runs us), with the GPU name, library versions and date beside the numbers.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from workbench.config import RunConfig  # noqa: E402
from workbench.telemetry.environment import environment  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def measure(cfg: RunConfig, name: str = "", digest: bool = False) -> dict:
    """One run through the training recipe (no eval, no run directory); its summary plus the
    NVML peak, the per-step compute / transfer times seen in the stream events, each step's
    loss and projected gradient, and with ``digest`` the final weights' digest."""
    from workbench.recipes.train import TrainRecipe

    torch.cuda.empty_cache()
    recipe = TrainRecipe(cfg, out_dir=None, progress=False)
    t = time.perf_counter()
    try:
        recipe.setup()
        recipe.dev_data = None  # speed runs: no eval
        recipe.train()
        rec = recipe.save(digest_params=digest)
    except torch.OutOfMemoryError as e:
        return {"name": name, "error": f"out of memory: {str(e).splitlines()[0]}"}
    except Exception as e:  # keep the rest of the table; the error is in the JSON
        traceback.print_exc()
        return {"name": name, "error": repr(e)}
    finally:
        recipe.cleanup()
    s = dict(rec.summary)
    s["wall_seconds"] = time.perf_counter() - t
    s["losses"] = [r.get("loss") for r in rec.steps]
    s["projected_grads"] = [r.get("projected_grad") for r in rec.steps]
    if digest:
        s["param_digest"] = rec.param_digest
    nvml = [x.get("gpu mem used (bytes)") for x in rec.samples]
    nvml = [v for v in nvml if v is not None and math.isfinite(v)]
    s["nvml_peak_bytes"] = max(nvml) if nvml else None
    timed_steps = rec.steps[s.get("warmup_steps", 1):]  # the steady steps (telemetry/steady.py)
    timed = {r["step"] for r in timed_steps}
    comp = [e.seconds for e in rec.events if e.op in ("compute", "jvp") and e.step in timed]
    s["compute_seconds_per_step"] = sum(comp) / max(len(timed), 1) if comp else None
    # PCIe seen by NVML over the timed steps vs the engine's own bytes / time.
    if timed_steps and rec.steps[0].get("end") is not None:
        t0, t1 = rec.steps[0]["end"], timed_steps[-1]["end"]
        window = [x for x in rec.samples if t0 <= (x.get("t (s)") or -1) <= t1]
        for key, out_key in (("pcie rx (bytes/s)", "nvml_rx"), ("pcie tx (bytes/s)", "nvml_tx")):
            vals = [x[key] for x in window if x.get(key) is not None and math.isfinite(x[key])]
            s[out_key] = sum(vals) / len(vals) if vals else None
        secs = sum(r["seconds"] for r in timed_steps)
        s["engine_h2d"] = sum(r.get("bytes_h2d", 0) for r in timed_steps) / secs if secs else None
        s["engine_d2h"] = sum(r.get("bytes_d2h", 0) for r in timed_steps) / secs if secs else None
    for key in ("peak_gpu_mem_bytes", "nvml_peak_bytes", "nvml_rx", "nvml_tx", "engine_h2d",
                "engine_d2h", "bytes_h2d", "bytes_d2h"):
        if s.get(key) is not None:
            s[key.replace("_bytes", "") + "_gb"] = s[key] / 1e9  # GB = 1e9 bytes (GB/s for rates)
    s["name"] = name
    s["config"] = {k: v for k, v in cfg.to_dict().items() if k in (
        "method", "model", "batch_size", "seq_len", "amp", "codec", "master", "overlap",
        "reuse_buffers", "fused_update", "resident_blocks", "prefetch_depth", "steps")}
    return s


def add_bound(row: dict, bw: dict, compute_s: float | None) -> None:
    """The row's lower bound max(compute, bytes each way / PCIe both ways) and its distance."""
    row["transfer_bound_s"] = max(row["bytes_h2d"], row["bytes_d2h"]) / bw["both_per_direction"]
    row["lower_bound_s"] = max(compute_s or 0.0, row["transfer_bound_s"])
    row["vs_bound"] = row["step_seconds"] / row["lower_bound_s"]


def pcie_bandwidth(nbytes: int = 1 << 30) -> dict:
    """Pinned H2D, D2H and both at once (bytes/s per direction)."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    host2 = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dev2 = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    def timed(fn, reps=3):
        fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / reps

    h2d = nbytes / timed(lambda: dev.copy_(host, non_blocking=True))
    d2h = nbytes / timed(lambda: host.copy_(dev, non_blocking=True))

    def both():
        with torch.cuda.stream(s1):
            dev.copy_(host, non_blocking=True)
        with torch.cuda.stream(s2):
            host2.copy_(dev2, non_blocking=True)

    both_dir = nbytes / timed(both)
    return {"h2d": h2d, "d2h": d2h, "both_per_direction": both_dir}


def save(name: str, payload: dict) -> Path:
    gpu = torch.cuda.get_device_name(0).replace(" ", "-") if torch.cuda.is_available() else "cpu"
    day = dt.date.today().isoformat()
    payload = {"benchmark": name, "environment": environment("cuda" if torch.cuda.is_available()
                                                              else "cpu"), **payload}
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}-{gpu}-{day}.json"
    text = json.dumps(payload, indent=1, default=str)
    path.write_text(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], path.name).write_text(text)
    return path


def watch_tree(proc: subprocess.Popen, peak: dict, gpu_index: int | None = None) -> None:
    """Until ``proc`` exits, every 0.5 s: the peak summed RSS and PSS of it and its children
    (``peak["rss"]``, ``peak["pss"]``, bytes) and, with ``gpu_index``, that GPU's used memory as
    NVML sees it (``peak["nvml"]``; ``peak["nvml_error"]`` when NVML cannot be read) and what
    it was before ``proc`` could start CUDA (``peak["nvml_base"]``, read first: importing torch
    takes the child longer). The base holds the driver's reserve that NVML counts as used (about
    0.5 GB on an idle H100) and any other process's memory, this one's included."""
    import psutil

    handle = nv = None
    if gpu_index is not None:
        try:
            import pynvml as nv
            nv.nvmlInit()
            handle = nv.nvmlDeviceGetHandleByIndex(gpu_index)
        except Exception as e:  # noqa: BLE001 - the row then says NVML was not read
            peak["nvml_error"] = f"{type(e).__name__}: {e}"
    if handle is not None:
        peak["nvml_base"] = nv.nvmlDeviceGetMemoryInfo(handle).used
    root = psutil.Process(proc.pid)
    while proc.poll() is None:
        rss = pss = 0
        try:
            for q in [root, *root.children(recursive=True)]:
                mem = q.memory_full_info()
                rss, pss = rss + mem.rss, pss + mem.pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
        peak["rss"], peak["pss"] = max(peak.get("rss", 0), rss), max(peak.get("pss", 0), pss)
        if handle is not None:
            peak["nvml"] = max(peak.get("nvml", 0), nv.nvmlDeviceGetMemoryInfo(handle).used)
        time.sleep(0.5)

def table(rows: list[dict], cols: list[tuple[str, str, str]]) -> str:
    """rows of dicts -> aligned text; cols: (header, key, format)."""
    out = [[h for h, _, _ in cols]]
    for r in rows:
        line = []
        for _, key, fmt in cols:
            v = r.get(key)
            line.append("-" if v is None else (fmt.format(v) if fmt else str(v)))
        out.append(line)
    widths = [max(len(row[i]) for row in out) for i in range(len(cols))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in out)


def in_fresh_process(script: Path, spec: dict, timeout: float) -> dict:
    """``spec`` run by ``script --row SPEC --result FILE`` in a new Python process (no kernels,
    allocator pools or pinned memory carried over from an earlier row); the JSON it wrote, or
    the error (the table goes on). ``process_seconds``: import + build + steps + teardown."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "row.json"
        cmd = [sys.executable, str(Path(script).resolve()), "--row", json.dumps(spec),
               "--result", str(result)]
        t = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=Path(script).resolve().parent, capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"name": spec.get("name"), "error": f"timed out after {timeout:.0f} s"}
        wall = time.perf_counter() - t
        if proc.returncode != 0 or not result.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return {"name": spec.get("name"),
                    "error": f"exit {proc.returncode}: {' | '.join(tail)}"}
        out = json.loads(result.read_text())
    out["process_seconds"] = wall
    return out


def add_fresh_args(p: argparse.ArgumentParser, name: str, timeout: float) -> None:
    """The options every fresh-process benchmark takes (``--row`` / ``--result``: internal, the
    child's side of ``in_fresh_process``)."""
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--timeout", type=float, default=timeout, help="seconds per run")
    p.add_argument("--name", default=name)
    p.add_argument("--row", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)


def finish(args: argparse.Namespace, out: dict, cols: list, note: str, start: float) -> None:
    """Save ``out`` (on a GPU), then print its rows' table, ``note`` and where it went."""
    out["seconds"] = time.perf_counter() - start
    saved = save(args.name, out) if args.device == "cuda" else "nothing (a CPU plumbing run)"
    print("\n" + table(out["rows"], cols))
    print(f"\n{note}\nsaved {saved} ({out['seconds']:.0f} s)")
