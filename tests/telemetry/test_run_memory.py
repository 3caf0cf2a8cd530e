"""GPU memory that belongs to the run: the reading taken before it, what figures and tables
subtract, and the order a second run of one process takes it in (fake readings, no GPU)."""
from __future__ import annotations

import gc
import math
import weakref
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from workbench.recipes import readings
from workbench.telemetry.record import RunRecord
from workbench.telemetry.sampler import gpu_memory_used
from workbench.telemetry.summary import summary_metrics, table
from workbench.ui import figures as F

GB, GiB = 1e9, 2**30


class FakeNVML:
    """Enough of pynvml for one memory reading; ``fail`` names calls that raise."""

    def __init__(self, fail: tuple[str, ...] = ()):
        self.fail, self.inits, self.shutdowns = set(fail), 0, 0

    def nvmlInit(self):
        if "nvmlInit" in self.fail:
            raise RuntimeError("fake NVML: no driver")
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("handle", i)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=5 * GiB, total=80 * GiB, free=75 * GiB)


def test_nvml_reading_before_a_run():
    nv = FakeNVML()
    assert gpu_memory_used(0, nvml_module=nv) == 5 * GiB
    assert nv.inits == nv.shutdowns == 1  # opened for the reading, closed after it
    assert math.isnan(gpu_memory_used(0, nvml_module=FakeNVML(fail=("nvmlInit",))))


def _gpu_run(name: str, peak: float, before_nvml: float, before_torch: float = 0.0
             ) -> RunRecord:
    """A GPU run as a process that ran another before it records it: NVML's used memory
    includes what was there before (a CUDA context, cached blocks), torch's counters too."""
    steps = [{"step": i, "loss": 1.0, "seconds": 0.1, "tokens": 10, "end": 0.1 * (i + 1),
              "mem_allocated": before_torch + peak * 0.8, "mem_reserved": before_torch + peak,
              "mem_peak": before_torch + peak} for i in range(10)]
    samples = [{"t (s)": 0.05 * i, "gpu mem used (bytes)": before_nvml + peak * 1.1}
               for i in range(20)]
    return RunRecord(config={"method": name, "model": "opt-1.3b", "device": "cuda"},
                     environment={"gpu mem used before run (bytes)": before_nvml,
                                  "torch allocated before run (bytes)": before_torch},
                     steps=steps, samples=samples, status="done", path=f"runs/demo/{name}",
                     summary={"peak_gpu_mem_bytes": peak})


def test_the_chart_agrees_with_the_table_for_two_runs_of_one_process():
    """The demo's order: MeZO first, then zo-offload in the same process, which starts with
    MeZO's cached memory and the CUDA context in NVML's reading. The table says 0.31x; no
    chart may draw offload above MeZO."""
    mezo = _gpu_run("mezo", peak=4 * GB, before_nvml=0.5 * GB)
    off = _gpu_run("zo-offload", peak=1.24 * GB, before_nvml=4.9 * GB, before_torch=0.2 * GB)
    rows = dict(table([mezo, off]))
    assert rows["peak GPU memory (MB)"][1].endswith("(0.31x)")
    fig = F.compare_memory([mezo, off])
    top = {}
    for t in fig.data:
        run = t.name.split()[0]
        top[run] = max(top.get(run, 0.0), float(np.nanmax(t.y)))
    assert top["zo-offload"] / top["mezo"] == pytest.approx(0.31)
    for rec, want in ((mezo, 4.4), (off, 1.24 * 1.1)):  # each dashboard: NVML less before
        nvml = next(t for t in F.memory(rec).data if t.name == "NVML")
        assert float(np.max(nvml.y)) == pytest.approx(want)
    # a live record (no summary yet): its peak less what torch held before
    live = _gpu_run("zo-offload", peak=1.24 * GB, before_nvml=4.9 * GB, before_torch=0.2 * GB)
    live.summary = {}
    assert summary_metrics(live)["peak_gpu_mem_bytes"] == pytest.approx(1.24 * GB)


def test_a_second_run_reads_its_baseline_after_the_first_is_freed(monkeypatch):
    """``readings.gpu_baseline`` on a (faked) CUDA device: the previous run's engine, unreachable but
    in a reference cycle, is collected and the cache emptied before NVML is read."""
    order: list[str] = []

    class Engine:  # an earlier run's engine, kept alive only by a cycle
        def __init__(self):
            self.me = self

        def __del__(self):
            order.append("freed")

    ref = weakref.ref(Engine())
    gc.disable()  # so that only the baseline's own collection can free it
    try:
        monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: order.append("sync"))
        monkeypatch.setattr(torch.cuda, "empty_cache", lambda: order.append("empty"))
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: 123)
        monkeypatch.setattr(readings, "gpu_memory_used",
                            lambda i: order.append("read") or 7.0 * GiB)
        got = readings.gpu_baseline(torch.device("cuda", 0))
    finally:
        gc.enable()
    assert ref() is None and order == ["freed", "sync", "empty", "read"]
    assert got == {"gpu mem used before run (bytes)": 7.0 * GiB,
                   "torch allocated before run (bytes)": 123.0}
    assert readings.gpu_baseline(torch.device("cpu")) == {}  # CPU runs: nothing to read
