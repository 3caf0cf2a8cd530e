"""Bottleneck verdicts on synthetic event streams with known busy times, and the planner's
next-knob advice."""
from __future__ import annotations

import math
import subprocess
import sys

import pytest

from workbench.config import RunConfig
from workbench.engine.events import OpEvent
from workbench.telemetry.advice import next_knob, planner_gpu
from workbench.telemetry.record import RunRecord
from workbench.telemetry.verdict import union_seconds, verdict

LINK = 63e9  # gen5 x16 per direction, bytes/s
CUDA = {"method": "zo-offload", "model": "opt-1.3b", "device": "cuda"}


def streamed(steps: int, step_s: float, upload: float, compute: float, offload: float = 0.0,
             cpu: float = 0.0, nbytes: int = 0, blocks: int = 4, serial: bool = False,
             samples: dict | None = None, config: dict | None = None) -> RunRecord:
    """A record whose steps each last ``step_s`` seconds, with per-block operations on each
    stream covering the given fraction of the step (``serial``: one stream after the other,
    else all starting together per block slot)."""
    events, rows = [], []
    slot = step_s / blocks
    for s in range(steps):
        t0 = s * step_s
        for b in range(blocks):
            start = t0 + b * slot
            at = start
            for op, stream, frac, size in (("upload", "upload", upload, nbytes),
                                           ("compute", "compute", compute, 0),
                                           ("offload", "offload", offload, nbytes),
                                           ("host-update", "cpu", cpu, 0)):
                if frac <= 0:
                    continue
                d = frac * slot
                begin = at if serial else start
                events.append(OpEvent(op, stream, s, b, size, begin, begin + d))
                if serial:
                    at += d
        rows.append({"step": s, "loss": 1.0, "seconds": step_s, "tokens": 100,
                     "end": t0 + step_s})
    smp = [{"t (s)": i * 0.01, **(samples or {})} for i in range(int(steps * step_s / 0.01))]
    return RunRecord(config=config or dict(CUDA), environment={"pcie peak (bytes/s)": LINK},
                     steps=rows, events=events, samples=smp, status="done")


def test_union_counts_overlaps_once():
    ev = [OpEvent("a", "s", 0, 0, 0, 0.0, 1.0), OpEvent("a", "s", 0, 1, 0, 0.5, 1.5),
          OpEvent("a", "s", 0, 2, 0, 2.0, 2.25), OpEvent("a", "s", 0, 3, 0, 2.1, 2.2)]
    assert union_seconds(ev) == pytest.approx(1.75)
    assert union_seconds([]) == 0.0


def test_pcie_bound():
    # 4 blocks per 0.1 s step; each upload moves 1.2 GB in 96% of its 25 ms slot -> 50 GB/s.
    slot = 0.025
    nbytes = int(50e9 * 0.96 * slot)
    rec = streamed(steps=5, step_s=0.1, upload=0.96, compute=0.59, offload=0.5, nbytes=nbytes)
    v = verdict(rec)
    assert v.kind == "pcie-bound", v.text
    assert v.busy["upload"] == pytest.approx(0.96, abs=1e-6)
    assert v.busy["compute"] == pytest.approx(0.59, abs=1e-6)
    assert v.upload_gbps == pytest.approx(50.0, rel=1e-3)
    assert v.steps == 4 and v.step_seconds == pytest.approx(0.1, rel=0.05)  # first step left out
    assert v.text == ("PCIe-bound: upload busy 96% of the step at 50.0 GB/s (79% of link); "
                      "compute idle 41%")


def test_pcie_bound_names_the_busier_direction():
    v = verdict(streamed(steps=3, step_s=0.1, upload=0.3, compute=0.5, offload=0.9,
                         nbytes=10**8))
    assert v.kind == "pcie-bound" and v.text.startswith("PCIe-bound: offload busy 90%")


def test_compute_bound_with_nvml_link_share():
    rec = streamed(steps=5, step_s=0.2, upload=0.36, compute=0.99, nbytes=10**8,
                   samples={"gpu util (%)": 99.0, "pcie rx (bytes/s)": 0.36 * LINK,
                            "pcie tx (bytes/s)": 0.2 * LINK})
    v = verdict(rec)
    assert v.kind == "compute-bound"
    assert v.gpu_util == pytest.approx(99.0)
    assert v.text == "compute-bound: GPU busy 99%, PCIe 36% of link"


def test_compute_bound_without_samples_uses_event_bytes():
    slot = 0.05
    nbytes = int(20e9 * 0.3 * slot)  # 20 GB/s while busy, busy 30%: 6 GB/s on average
    v = verdict(streamed(steps=4, step_s=0.2, upload=0.3, compute=0.9, nbytes=nbytes))
    assert v.kind == "compute-bound"
    assert v.text == f"compute-bound: compute busy 90% of the step, PCIe {6e9 / LINK:.0%} of link"


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_host_bound_when_every_stream_waits(device):
    rec = streamed(steps=4, step_s=0.1, upload=0.2, compute=0.3,
                   config={**CUDA, "device": device})
    v = verdict(rec)
    assert v.kind == "host-bound"
    assert v.idle == pytest.approx(0.7, abs=1e-6)
    assert "70% of the step" in v.text and "compute 30%" in v.text and "upload 20%" in v.text


def test_host_bound_on_the_cpu_stream():
    v = verdict(streamed(steps=3, step_s=0.1, upload=0.2, compute=0.3, cpu=0.95))
    assert v.kind == "host-bound"
    assert v.text == "host-bound: host threads busy 95% of the step (cpu stream); compute idle 70%"


def test_nvml_busy_gpu_with_untimed_work_is_compute_bound():
    rec = streamed(steps=4, step_s=0.1, upload=0.0, compute=0.5,
                   samples={"gpu util (%)": 97.0}, config={**CUDA, "method": "mezo"})
    v = verdict(rec)
    assert v.kind == "compute-bound" and "GPU busy 97% (NVML); timed compute 50%" in v.text


def test_serialized_streams():
    v = verdict(streamed(steps=3, step_s=0.1, upload=0.4, compute=0.45, offload=0.15,
                         nbytes=10**6, serial=True))
    assert v.kind == "serialized"
    assert "upload 40%, compute 45%, offload 15%" in v.text


def test_cpu_run_transfers_are_copies_not_pcie():
    rec = streamed(steps=3, step_s=0.1, upload=0.9, compute=0.2, nbytes=10**6,
                   config={**CUDA, "device": "cpu"})
    v = verdict(rec)
    assert v.kind == "copy-bound" and "no PCIe" in v.text


def test_unknown_without_events():
    assert verdict(RunRecord()).text == "no verdict: no step has finished yet"
    rec = RunRecord(config={"telemetry": False}, steps=[{"step": 0}])
    v = verdict(rec)
    assert v.kind == "unknown" and v.text == "no verdict: telemetry off"
    assert math.isnan(v.step_seconds)


def test_verdict_module_needs_no_ui_packages():
    code = ("import sys, workbench.telemetry.verdict, workbench.telemetry.advice; "
            "print([m for m in ('plotly', 'ipywidgets', 'anywidget') if m in sys.modules])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# --- advice -----------------------------------------------------------------------------------
def _record(**cfg) -> RunRecord:
    c = RunConfig(**{"method": "zo-offload", "device": "cuda", **cfg})
    return RunRecord(config={**c.to_dict(), "device": "cuda"},
                     environment={"gpu name": "NVIDIA H200", "host ram (bytes)": 2 * 10**12})


def test_gpu_names_map_to_the_planner_table():
    assert planner_gpu({"gpu name": "NVIDIA H200"}) == "h200"
    assert planner_gpu({"gpu name": "NVIDIA A100-SXM4-40GB"}) == "a100-40gb"
    assert planner_gpu({"gpu name": "NVIDIA GeForce RTX 4090"}) == "rtx-4090"
    assert planner_gpu({}) is None


def test_advice_on_a_pcie_bound_run_is_a_compressed_codec():
    # opt-13b under bf16 streams at the link's pace; a 24 GB cap leaves no room for residents
    a = next_knob(_record(model="opt-13b", amp="bf16", gpu_mem_limit_gb=24.0))
    assert a.changes == {"codec": "bf16", "master": "compressed-sr"} or \
        a.changes == {"codec": "fp16", "master": "compressed-sr"}, a
    # 1.50x: the bf16 master's compute-dtype slots (slot_dtype=auto) make that step
    # compute-bound at the table's uncalibrated perturbation rate
    assert 1.4 < a.gain < 2.1
    assert a.text.startswith(f"codec={a.changes['codec']} master=compressed-sr: predicted ")


def test_advice_offers_only_changes_that_fit():
    a = next_knob(_record(model="opt-13b", amp="bf16", gpu_mem_limit_gb=24.0))
    assert "resident_blocks" not in a.changes  # 40 resident blocks of opt-13b need 52 GB
    b = next_knob(_record(model="opt-1.3b", amp="bf16"))  # 139 GB: every block fits
    assert b.gain >= 1.05 and b.changes


def test_advice_when_nothing_helps():
    a = next_knob(_record(model="opt-1.3b", method="mezo", amp="bf16"))
    assert not a.changes and "no single knob" in a.text
    broken = RunRecord(config={"method": "zo-offload", "model": "/no/such/folder"})
    assert next_knob(broken).text.startswith("no planner advice")
