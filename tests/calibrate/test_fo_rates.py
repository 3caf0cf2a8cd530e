"""The performance model's calibration: repeated runs of the step's own operations, summarised
by their median (not the first run, not the mean, not the fastest), with the spread recorded;
and the engine's calibration leaves the training state untouched."""
from __future__ import annotations

import statistics

import pytest
import torch

from workbench.calibrate.fo import measure
from workbench.config import RunConfig
from workbench.engine import build_engine
from workbench.engine.events import EventBus, InfoEvent
from workbench.calibrate import fo as fo_calibrate
from workbench.models.build import build_skeleton
from workbench.plan import placement


class FakeStopwatch:
    """Returns scripted seconds, one per call in call order, and runs each probe it times."""

    def __init__(self, seconds: list[float]):
        self.seconds, self.calls = list(seconds), []

    def __call__(self, probe: fo_calibrate.Probe) -> float:
        probe.run()
        self.calls.append(probe)
        return self.seconds.pop(0)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models, 1 thread


def test_calibrate_uses_the_median_of_the_timed_repetitions():
    runs = {"a": 0, "b": 0}

    def bump(name):
        runs[name] += 1

    probes = {"a": fo_calibrate.Probe(1000, lambda: bump("a")),
              "b": fo_calibrate.Probe(10, lambda: bump("b"))}
    # Per probe: one warm-up (left out), then 5 timed runs. First timed != median != mean.
    a = [50.0, 8.0, 1.0, 2.0, 100.0, 4.0]
    b = [0.1, 0.5, 0.4, 0.3, 0.2, 0.9]
    watch = FakeStopwatch(a + b)
    rates = fo_calibrate.time_probes(probes, watch, reps=5, warmup=1)
    assert runs == {"a": 6, "b": 6} and not watch.seconds
    assert rates["a"].seconds == tuple(a[1:]) and rates["b"].seconds == tuple(b[1:])
    assert rates["a"].median_s == 4.0 and rates["a"].per_s == pytest.approx(1000 / 4.0)
    assert rates["a"].per_s != pytest.approx(1000 / 8.0)  # not the first timed run
    assert rates["a"].per_s != pytest.approx(1000 / statistics.mean(a[1:]))  # not the mean
    assert rates["a"].per_s != pytest.approx(1000 / 1.0)  # not the fastest
    assert rates["a"].spread == pytest.approx((100.0 - 1.0) / 4.0)
    assert rates["b"].per_s == pytest.approx(10 / 0.4)
    assert rates["b"].spread == pytest.approx((0.9 - 0.2) / 0.4)
    d = rates["a"].as_dict()
    assert d["seconds"] == a[1:] and d["median_s"] == 4.0 and d["n"] == 1000


def _engine(cfg: RunConfig, bus: EventBus | None = None):
    model, source = build_skeleton(cfg.model)
    return build_engine(model, source, cfg, torch.device("cpu"), bus or EventBus(),
                        measure=measure)


@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_engine_calibration_times_each_step_operation_on_one_subgroup(amp):
    cfg = RunConfig(model="tiny-opt", method="fo-offload", amp=amp, subgroup_size=5000)
    infos = {}
    bus = EventBus()
    bus.subscribe(lambda e: infos.__setitem__(e.key, e.value) if isinstance(e, InfoEvent) else None)
    engine = _engine(cfg, bus)
    names = ["B", "Bd", "Ug", "Uc"] + (["Dc"] if amp == "bf16" else [])
    assert sorted(engine.calibration) == sorted(names)
    for name in names:  # what the engine recorded: every repetition and the spread
        got = infos["fo_calibration"][name]
        assert got["n"] == engine.flat.sub and len(got["seconds"]) == fo_calibrate.REPS
        assert got["per_s"] == pytest.approx(engine.flat.sub / statistics.median(got["seconds"]))
        assert infos["fo_perf_inputs"]["spread"][name] == pytest.approx(got["spread"])
    # Again with scripted times: the model's inputs are subgroup / median seconds.
    reps = fo_calibrate.REPS
    script, medians = [], {}
    for i, name in enumerate(names):
        times = [1.0] + [(i + 1) * x for x in (3.0, 1.0, 5.0, 2.0, 9.0)][:reps]
        script += times
        medians[name] = statistics.median(times[1:])
    watch = FakeStopwatch(script)
    rates = measure(engine.parts, watch)
    assert len(watch.calls) == len(names) * (1 + reps)
    assert all(p.n == engine.flat.sub for p in watch.calls)
    perf = placement.inputs(rates, engine.word)
    for name, got in (("B", perf.B), ("Ug", perf.Ug), ("Uc", perf.Uc)):
        assert got == pytest.approx(engine.flat.sub / medians[name])
    if amp == "bf16":
        assert perf.Dc == pytest.approx(engine.flat.sub / medians["Dc"])
    else:
        assert perf.Dc == float("inf")
    engine.close()


@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_engine_calibration_leaves_the_state_bit_for_bit(amp):
    cfg = RunConfig(model="tiny-opt", method="fo-offload", amp=amp, subgroup_size=7000,
                    update_stride="2", lr=1e-2)
    engine = _engine(cfg)
    from workbench.data.batches import SyntheticData

    data = SyntheticData(engine.adapter.model.config.vocab_size, 16)
    for t in range(2):  # non-zero m and v, so an update that is not a no-op would show
        engine.step(data.batch_for_step(t, 4, 0), t, 1e-2, 0.1)
    engine.sync()
    f = engine.flat
    before = [t.clone() for t in (f.p32, f.m, f.v, f.g, f.w)]
    measure(engine.parts)
    after = (f.p32, f.m, f.v, f.g, f.w)
    # bits, not values: g32 is never written where the GPU updates (its gradients stay there),
    # so it holds whatever the allocator gave, nan patterns included, and nan != nan
    for a, b in zip(before, after):
        assert torch.equal(a.view(torch.int16 if a.element_size() == 2 else torch.int32),
                           b.view(torch.int16 if b.element_size() == 2 else torch.int32))
    assert float(f.m.abs().max()) > 0  # the check had something to see
    engine.close()
