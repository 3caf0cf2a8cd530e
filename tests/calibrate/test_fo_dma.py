"""The CPU update timed under DMA load (issue 41, item 3). No GPU here: a host memcpy thread
stands in for the link's pinned copies (``HostCopies``, only in these tests); on CUDA
``PinnedTraffic`` makes real copies up and down the link."""
from __future__ import annotations

import statistics
import threading
import time
from functools import partial

import pytest
import torch

from workbench.calibrate import fo as fo_calibrate
from workbench.calibrate import machine
from workbench.calibrate.fo import measure
from workbench.config import RunConfig
from workbench.engine import build_engine
from workbench.engine.events import EventBus, InfoEvent
from workbench.models.build import build_skeleton
from workbench.plan import dma

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models, 1 thread


class HostCopies:
    """A host memcpy thread in the place of DMA: copies a buffer ``copies`` times (fixed bytes
    a use) while the with-block runs; ``moved`` gets (bytes, seconds); ``running`` is set while
    the thread copies (tests check the probe ran under it)."""

    def __init__(self, numel: int = 1 << 16, copies: int = 8):
        self.src, self.dst = torch.randn(numel), torch.empty(numel)
        self.copies, self.moved, self.estimates = copies, [], []
        self.running = threading.Event()

    def __call__(self, seconds: float):
        self.estimates.append(seconds)
        return _Copying(self)


class _Copying:
    def __init__(self, load: HostCopies):
        self.load = load

    def _copy(self):
        t0 = time.perf_counter()
        for _ in range(self.load.copies):
            self.load.dst.copy_(self.load.src)
        self.seconds = time.perf_counter() - t0

    def __enter__(self):
        self.load.running.set()
        self.thread = threading.Thread(target=self._copy)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.thread.join()
        self.load.running.clear()
        nbytes = 2 * 4 * self.load.src.numel() * self.load.copies  # read + write
        self.load.moved.append((nbytes, self.seconds))
        return False


class Watch:
    """Scripted seconds in call order; notes whether the load was running for each probe."""

    def __init__(self, seconds: list[float], load: HostCopies):
        self.seconds, self.load, self.loaded = list(seconds), load, []

    def __call__(self, probe):
        self.loaded.append(self.load.running.is_set())
        probe.run()
        return self.seconds.pop(0)


def _engine(cfg: RunConfig, bus: EventBus, load=None):
    model, source = build_skeleton(cfg.model)
    return build_engine(model, source, cfg, torch.device("cpu"), bus,
                        measure=partial(measure, load=load) if load else measure)


def _infos(bus: EventBus) -> dict:
    infos: dict = {}
    bus.subscribe(lambda e: infos.__setitem__(e.key, e.value) if isinstance(e, InfoEvent)
                  else None)
    return infos


@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_the_cpu_update_is_timed_alone_then_under_the_load(amp):
    cfg = RunConfig(model="tiny-opt", method="fo-offload", amp=amp, subgroup_size=5000)
    load = HostCopies()
    engine = _engine(cfg, EventBus(), load)
    assert {"Uc", "Ucd", "Xd"} <= set(engine.calibration)
    reps, warm = fo_calibrate.REPS, fo_calibrate.WARMUP
    names = ["B", "Bd", "Ug", "Uc"] + (["Dc"] if amp == "bf16" else [])
    uc = [2.0, 1.0, 3.0, 2.0, 4.0][:reps]  # Uc alone: median 2 s
    script = [x for name in names for x in [1.0] * warm + (uc if name == "Uc" else [1.0] * reps)]
    ucd = [9.0, 3.0, 1.0, 5.0, 4.0, 6.0][:warm + reps]  # under load: median of timed 4 s
    load.moved.clear()
    load.estimates.clear()
    watch = Watch(script + ucd, load)
    rates = measure(engine.parts, watch, load=load)
    n = engine.flat.sub
    assert rates["Uc"].per_s == pytest.approx(n / 2.0)
    assert rates["Ucd"].per_s == pytest.approx(n / statistics.median(ucd[warm:]))
    assert rates["Ucd"].seconds == tuple(ucd[warm:])
    # the load ran around each timed update under it, and only there
    assert watch.loaded == [False] * (len(names) * (warm + reps)) + [True] * (warm + reps)
    assert load.estimates == [2.0] * (warm + reps)  # sized from Uc alone
    # Xd: the load's bytes a repetition and its bytes/s (the median of the timed ones)
    moved = load.moved[warm:]
    assert len(load.moved) == warm + reps and rates["Xd"].n == moved[0][0]
    assert rates["Xd"].per_s == pytest.approx(statistics.median(b / s for b, s in moved))
    c = dma.of_rates(rates)
    assert c == dma.Contention(n / 2.0, n / 4.0, rates["Xd"].per_s) and c.slowdown == 1.0
    engine.close()


def test_the_engine_predicts_under_the_measured_load_and_says_when_it_cannot():
    cfg = RunConfig(model="tiny-opt", method="fo-offload", amp="bf16", subgroup_size=5000,
                    update_stride="3")
    bus = EventBus()
    infos = _infos(bus)
    plain = _engine(cfg, bus)  # a CPU-only machine: no load, no rate under it
    assert plain.contention is None and "ignores DMA contention" in infos["fo_contention"]["note"]
    assert not {"Ucd", "Xd"} & set(plain.calibration)
    plain.close()
    bus = EventBus()
    infos = _infos(bus)
    engine = _engine(cfg, bus, HostCopies())
    c = engine.contention
    assert c is not None and infos["fo_contention"]["Ucd"] == c.Ucd
    assert infos["fo_calibration"]["Ucd"]["per_s"] == pytest.approx(c.Ucd)
    placed = engine.placement
    cpu, gpu = dma.sides(placed, engine.flat.numel, c)
    assert placed.predicted_s == pytest.approx(max(cpu, gpu))
    assert infos["fo_update_predicted_s"] == placed.predicted_s
    assert infos["fo_perf_inputs"]["predicted_cpu_s"] == pytest.approx(cpu)
    engine.close()


def test_the_machine_calibration_times_adamw_under_the_load(monkeypatch):
    """``_cpu_under_dma`` as a CUDA calibration runs it, the pinned copies replaced by the
    memcpy thread (this machine has no GPU)."""
    loads = []

    def stand_in(device, link_bps):
        loads.append((device, link_bps))
        return HostCopies()

    monkeypatch.setattr(fo_calibrate, "PinnedTraffic", stand_in)
    got = machine._cpu_under_dma("cpu", True, {"h2d_bps": 25e9, "adamw_cpu_per_s": 1e9})
    assert loads == [("cpu", 25e9)]
    assert set(got) == {"adamw_cpu_dma_per_s", "adamw_cpu_dma_bps"}
    assert got["adamw_cpu_dma_per_s"] > 0 and got["adamw_cpu_dma_bps"] > 0
