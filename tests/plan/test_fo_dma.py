"""fo-offload's CPU update under DMA load (issue 41, item 3): the model by hand, the planner's
prediction moving with the rate under load, and the note for a profile without it."""
from __future__ import annotations

import math

import pytest

from workbench.config import RunConfig
from workbench.plan import dma, placement
from workbench.plan.fo import contention, fo_placement, perf_inputs
from workbench.plan.placement import Split, Subgroups
from workbench.plan.planner import plan
from workbench.plan.rates import (HOST_KEYS, gpu_profile, load_calibration, profile,
                                  save_calibration)
from workbench.presets import PRESETS

N = PRESETS["opt-1.3b"].total_params()


def _cfg(**kw) -> RunConfig:
    base = dict(model="opt-1.3b", method="fo-offload", device="cuda", amp="bf16",
                subgroup_size=50_000_000)
    return RunConfig(**{**base, **kw})


def _calib(ucd: float | None, **extra) -> dict:
    """A CUDA calibration as ``calibrate`` caches it (the H100 table's rates), with the CPU
    AdamW rate under DMA load ``ucd`` (None: an old profile, measured before it was)."""
    c = {**gpu_profile("h100"), "device": "cuda", "gpu_name": "NVIDIA H100", "method_version": 2,
         "adamw_cpu_per_s": 4.5e9, **extra}
    if ucd is not None:
        c.update(adamw_cpu_dma_per_s=ucd, adamw_cpu_dma_bps=50e9)
    return c


def test_cpu_side_under_load_by_hand():
    c = dma.Contention(Uc=4e9, Ucd=2e9, load_bps=40e9)  # twice as slow under the full load
    assert c.slowdown == pytest.approx(1.0)
    A, D = 1.0, 10e9  # 1 s alone; 10 GB of DMA: a quarter of the load over 1 s
    t = dma.cpu_seconds(A, D, c)
    u = D / (t * c.load_bps)
    assert 0 < u < 1 and t == pytest.approx(A * (1 + c.slowdown * u))  # T = A (1 + s u)
    assert t == pytest.approx((1 + math.sqrt(1 + 4 * 1 * 10e9 / 40e9)) / 2)
    # more DMA than the load the rate was measured under: the full slowdown, no more
    assert dma.cpu_seconds(A, 400e9, c) == pytest.approx(A * 2)
    assert dma.cpu_seconds(A, 0.0, c) == A and dma.cpu_seconds(A, D, None) == A
    same = dma.Contention(4e9, 4e9, 40e9)  # no slowdown measured: the rate alone
    assert dma.cpu_seconds(A, D, same) == A
    faster = dma.Contention(4e9, 5e9, 40e9)  # faster under load (noise): never sped up
    assert dma.cpu_seconds(A, D, faster) == A


def test_dma_bytes_of_each_side():
    # interleaved: (p, m, v) up and down; CPU-updated: fp32 gradient down, weight up; resident:
    # nothing crosses the link
    assert dma.dma_bytes(100, Split(0.0, 1.0, 0.0), 2, 3.0) == 100 * 24
    assert dma.dma_bytes(100, Split(0.0, 1.0, 0.0), 2, 2.0) == 100 * 16  # bf16 moments
    assert dma.dma_bytes(100, Split(1.0, 0.0, 0.0), 2, 3.0) == 100 * 6
    assert dma.dma_bytes(100, Split(1.0, 0.0, 0.0), 4, 3.0) == 100 * 8
    assert dma.dma_bytes(100, Split(0.0, 0.0, 1.0), 2, 3.0) == 0


@pytest.mark.parametrize("stride", ["auto", 3, placement.NO_GPU])
def test_the_planners_prediction_moves_with_the_rate_under_dma(stride):
    cfg = _cfg(update_stride=stride)
    alone = fo_placement(cfg, N, _calib(None), 2)
    same = fo_placement(cfg, N, _calib(4.5e9), 2)  # no slowdown: the model without contention
    assert same.predicted_s == pytest.approx(alone.predicted_s)
    got = [fo_placement(cfg, N, _calib(ucd), 2) for ucd in (4e9, 3e9, 2e9)]
    assert all(p.schedule == alone.schedule for p in got) or stride == "auto"
    times = [p.predicted_s for p in got]
    assert alone.predicted_s < times[0] < times[1] < times[2]  # slower under load: longer
    p = got[-1]  # the prediction is the slower side, the CPU side under its DMA
    cpu, gpu = p.sides(N)
    c = contention(_calib(2e9))
    load = dma.dma_bytes(N, p.split, p.inputs.word_bytes, p.inputs.state_words,
                         p.inputs.grad_bytes)
    assert p.predicted_s == pytest.approx(max(dma.cpu_seconds(cpu, load, c), gpu))
    # the plan's step time carries it too
    pl = [plan(cfg, calibration=_calib(ucd)) for ucd in (None, 2e9)]
    assert pl[1].step_seconds > pl[0].step_seconds


def test_a_resident_only_placement_moves_nothing_and_is_not_slowed():
    cfg = _cfg(update_stride=placement.NO_GPU, gpu_resident_ratio=1.0)
    alone, slow = (fo_placement(cfg, N, _calib(u), 2) for u in (None, 1e9))
    assert slow.split.resident == 1.0 and slow.predicted_s == pytest.approx(alone.predicted_s)


def test_an_old_profile_predicts_alone_and_says_so():
    cfg = _cfg(update_stride=3)
    old = plan(cfg, calibration=_calib(None))
    assert any("ignores DMA contention" in n and "adamw_cpu_dma_per_s" in n for n in old.notes)
    new = plan(cfg, calibration=_calib(3e9))
    assert not any("ignores DMA contention" in n for n in new.notes)
    assert any("slower under the link's copies" in n for n in new.notes)
    # the defaults (uncalibrated) have no rate under load either: said, not silent
    assert any("ignores DMA contention" in n for n in plan(cfg).notes)
    assert contention(_calib(None)) is None
    # a CPU run has no link: no such note
    cpu = plan(_cfg(device="cpu", update_stride=3, amp="off"))
    assert not any("DMA contention" in n for n in cpu.notes)


def test_the_profile_keys_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    save_calibration(_calib(3e9, time=1.0))
    back = load_calibration("cuda")
    assert back["adamw_cpu_dma_per_s"] == 3e9 and back["adamw_cpu_dma_bps"] == 50e9
    prof, _ = profile(_cfg(), None, back)
    assert contention(prof) == dma.Contention(4.5e9, 3e9, 50e9)
    # a GPU table keeps this host's rates, the one under load among them
    assert {"adamw_cpu_dma_per_s", "adamw_cpu_dma_bps"} <= set(HOST_KEYS)
    table, _ = profile(_cfg(), "h200", back)
    assert table["adamw_cpu_dma_per_s"] == 3e9
    # without the load's bytes/s: the both-way link rate it was measured at
    del back["adamw_cpu_dma_bps"]
    assert contention({**gpu_profile("h200"), **back}).load_bps == gpu_profile("h200")[
        "duplex_bps"]


@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_candidates_are_the_models_placements_predicted_under_load(amp):
    word = 2 if amp == "bf16" else 4
    perf = perf_inputs(_calib(None), word)
    groups = Subgroups(N, 50_000_000)
    c = dma.Contention(4.5e9, 3e9, 50e9)
    plain = placement.candidates(perf, groups, 0.0)
    under = dma.candidates(perf, groups, 0.0, c)
    assert {x.key for x in plain} == {x.key for x in under}
    assert [x.predicted_s for x in under] == sorted(x.predicted_s for x in under)
    by = {x.key: x for x in plain}
    for x in under:
        placed = placement.place_at(perf, groups, x.stride, 0.0, bool(x.cpu_downcast))
        assert x.predicted_s == pytest.approx(dma.contended(placed, groups, c).predicted_s)
        assert x.predicted_s >= by[x.key].predicted_s - 1e-12
    assert dma.candidates(perf, groups, 0.0, None) == plain
