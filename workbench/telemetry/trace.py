"""Chrome-trace export (open ``trace.json`` in Perfetto or chrome://tracing).

One track per stream with a slice per operation, plus counter tracks for GPU memory and PCIe
throughput from the samples and per-step loss.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from workbench.engine.events import EMBED, HEAD
from workbench.telemetry.record import RunRecord, atomic_write

STREAM_ORDER = ("upload", "compute", "offload", "update", "checkpoint", "cpu", "optimizer")
COUNTERS = {"gpu mem used (bytes)": "GPU memory used (GB)", "pcie rx (bytes/s)": "PCIe RX (GB/s)",
            "pcie tx (bytes/s)": "PCIe TX (GB/s)", "gpu util (%)": "GPU utilisation (%)"}


def block_label(block: int) -> str:
    return {EMBED: "embed", HEAD: "head"}.get(block, f"block {block}")


def trace_events(rec: RunRecord) -> list[dict]:
    """The trace as a list of Chrome trace events (times in microseconds)."""
    streams = sorted({e.stream for e in rec.events},
                     key=lambda s: (STREAM_ORDER.index(s) if s in STREAM_ORDER else 99, s))
    tid = {s: i + 1 for i, s in enumerate(streams)}
    out: list[dict] = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": rec.name}}]
    out += [{"ph": "M", "pid": 1, "tid": t, "name": "thread_name", "args": {"name": s}}
            for s, t in tid.items()]
    for e in rec.events:
        out.append({"ph": "X", "pid": 1, "tid": tid[e.stream], "cat": e.op,
                    "name": f"{e.op} {block_label(e.block)}" + (f" {e.detail}" if e.detail else ""),
                    "ts": e.start * 1e6, "dur": max(e.end - e.start, 0.0) * 1e6,
                    "args": {"step": e.step, "block": e.block, "bytes": e.nbytes}})
    for s in rec.samples:
        t = s.get("t (s)")
        if t is None or not math.isfinite(t):
            continue
        for key, name in COUNTERS.items():
            v = s.get(key, math.nan)
            if v is not None and math.isfinite(v):
                scale = 1.0 if "%" in key else 1e-9
                out.append({"ph": "C", "pid": 1, "name": name, "ts": t * 1e6,
                            "args": {"value": v * scale}})
    for row in rec.steps:
        if row.get("loss") is not None and row.get("end") is not None:
            out.append({"ph": "C", "pid": 1, "name": "loss", "ts": row["end"] * 1e6,
                        "args": {"value": row["loss"]}})
    return out


def write_trace(rec: RunRecord, path: str | Path) -> Path:
    path = Path(path)
    text = json.dumps({"traceEvents": trace_events(rec), "displayTimeUnit": "ms"})
    atomic_write(path, text.encode("utf-8"))
    return path
