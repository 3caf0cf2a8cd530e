"""fo-offload's placement model (``plan/placement.py``): Equation 1 by hand, the schedules it
places, the stride it picks, and that the planner and the engine take their decision from this
one model."""
from __future__ import annotations

import math

import pytest

from workbench.config import RunConfig
from workbench.plan import placement
from workbench.plan.fo import backward, fo_placement, grad_bytes, perf_inputs, subgroup_size
from workbench.plan.placement import PerfInputs, Subgroups, make_schedule
from workbench.plan.planner import plan
from workbench.plan.rates import gpu_profile
from workbench.presets import PRESETS


def test_stride_model_is_equation_1_by_hand():
    G = 1e9
    # The paper's V100 example: B 3, Ug 35, Uc 2, Dc 8.7 G params/s.
    B, Ug, Uc, Dc = 3 * G, 35 * G, 2 * G, 8.7 * G
    k = (3 / B + 1 / Ug) / (1 / Uc + 1 / Dc - 1 / (2 * B))
    assert placement.balance_ratio(B, Ug, Uc, Dc) == pytest.approx(k, rel=1e-12)
    assert k == pytest.approx(2.294, abs=1e-3)
    # k = 2.29 CPU : GPU; the schedules around it are 2 : 1 (stride 3) and 3 : 1 (stride 4).
    a, b, c = 1 / Uc + 1 / Dc, 3 / B + 1 / Ug, 1 / (2 * B)
    t3 = max(2 / 3 * a, b / 3 + 2 / 3 * c)  # 0.454 ns / parameter
    t4 = max(3 / 4 * a, b / 4 + 3 / 4 * c)  # 0.461 ns / parameter
    assert t3 < t4 and placement.stride(B, Ug, Uc, Dc) == 3
    split = placement.Split(cpu=2 / 3, gpu=1 / 3)
    assert placement.predict_update_seconds(10**9, split, B, Ug, Uc, Dc) == pytest.approx(1e9 * t3)
    # The H200 machine: GPU path faster (k < 1) -> m of every m + 1 subgroups on the GPU.
    B, Ug, Uc, Dc = 55e9 / 4, 112 * G, 0.76 * G, 5 * G
    k = (3 / B + 1 / Ug) / (1 / Uc + 1 / Dc - 1 / (2 * B))
    assert k == pytest.approx(0.1535, abs=1e-4)  # 1/k = 6.51: m = 6 or 7
    a, b, c = 1 / Uc + 1 / Dc, 3 / B + 1 / Ug, 1 / (2 * B)
    t6 = max(a / 7, 6 / 7 * b + c / 7)
    t7 = max(a / 8, 7 / 8 * b + c / 8)
    assert t7 < t6 and placement.stride(B, Ug, Uc, Dc) == -7
    # fp32 compute weights: nothing downcast (Dc = inf), 4-byte uploads.
    k32 = (3 / B + 1 / Ug) / (1 / Uc - 1 / B)
    assert placement.balance_ratio(B, Ug, Uc, math.inf, word_bytes=4) == pytest.approx(k32)
    # A CPU faster than the link can carry its results: nothing goes to the GPU.
    assert placement.stride(1 * G, 100 * G, 50 * G, math.inf, word_bytes=4) == placement.NO_GPU
    assert placement.gpu_fraction(-7) == pytest.approx(7 / 8)
    assert placement.gpu_fraction(3) == pytest.approx(1 / 3)


def test_schedule_places_subgroups_as_algorithm_1():
    s = make_schedule(10, 3, 0.2)
    assert list(s.resident) == [8, 9] and s.gpu == (2, 5) and s.cpu == (7, 6, 4, 3, 1, 0)
    s = make_schedule(9, -2, 0.0)  # 2 of every 3 on the GPU
    assert s.gpu == (0, 1, 3, 4, 6, 7) and s.cpu == (8, 5, 2)
    s = make_schedule(4, placement.NO_GPU, 0.0)
    assert s.gpu == () and s.cpu == (3, 2, 1, 0)
    assert make_schedule(5, 1, 1.0).cpu == ()


@pytest.mark.parametrize("stride", [2, 3, 10, -2, -3, -7])
def test_fewer_is_the_next_stride_with_a_smaller_gpu_share(stride):
    nxt = placement.fewer(stride)
    assert placement.gpu_fraction(nxt) < placement.gpu_fraction(stride)
    between = [s for s in (*range(-20, 0), *range(1, 21))
               if placement.gpu_fraction(nxt) < placement.gpu_fraction(s)
               < placement.gpu_fraction(stride)]
    assert between == []  # no schedule skipped
    assert placement.fewer(1) == 2


def test_place_picks_the_faster_downcast_site_and_names_its_record():
    G = 1e9
    perf = PerfInputs(55e9 / 4, 112 * G, 0.76 * G, 5 * G, word_bytes=2)
    groups = Subgroups(100_000_000, 2_000_000)
    best = placement.place(perf, groups, "auto", 0.0)
    sites = [placement.place(perf, groups, "auto", 0.0, down) for down in (False, True)]
    assert best.predicted_s == min(s.predicted_s for s in sites)
    assert best.cpu_downcast == (sites[1].predicted_s < sites[0].predicted_s)
    assert best.inputs == perf.at_site(best.cpu_downcast)
    assert best.split == groups.split(best.schedule)
    assert sum((best.split.cpu, best.split.gpu, best.split.resident)) == pytest.approx(1.0)
    cpu_s, gpu_s = best.sides(groups.numel)
    assert best.predicted_s == pytest.approx(max(cpu_s, gpu_s))
    fixed = placement.place(perf, groups, 3, 0.25, cpu_downcast=False)
    assert fixed.schedule.stride == 3 and len(fixed.schedule.resident) == 12
    assert not fixed.cpu_downcast and fixed.inputs.Dc == math.inf
    fp32 = placement.place(PerfInputs(perf.B, perf.Ug, perf.Uc, math.inf, 4), groups, 3, 0.0,
                           cpu_downcast=True)
    assert not fp32.cpu_downcast  # fp32 weights have nothing to downcast


def test_subgroups_cut_the_range_and_the_slots_cut_the_subgroups(monkeypatch):
    g = Subgroups(10_500, 2_000)
    assert g.count == 6 and g.bounds(5) == (10_000, 10_500) and g.numel_of(5) == 500
    monkeypatch.setattr(placement, "SLOT_PIECE", 800)
    pieces = g.pieces(make_schedule(6, 2, 0.0))  # subgroups 1, 3, 5 on the GPU
    assert [p for p in pieces if p[0] == 5] == [(5, 10_000, 10_500)]
    assert [p for p in pieces if p[0] == 1] == [(1, 2000, 2800), (1, 2800, 3600),
                                                (1, 3600, 4000)]


@pytest.mark.parametrize("amp", ["off", "bf16"])
@pytest.mark.parametrize("stride", ["auto", 3, -2])
def test_the_planner_takes_the_engines_placement(amp, stride):
    """One model: the planner's fo-offload time is the placement model's prediction at the
    profile's rates, and its PCIe bytes follow that placement's split."""
    cfg = RunConfig(model="opt-1.3b", method="fo-offload", device="cuda", amp=amp,
                    update_stride=stride, gpu_resident_ratio=0.1)
    prof, n = gpu_profile("h200"), PRESETS["opt-1.3b"].total_params()
    word = 2 if amp == "bf16" else 4
    placed = fo_placement(cfg, n, prof, word)
    again = placement.place(perf_inputs(prof, word, "fp32", grad_bytes(cfg)),
                            Subgroups(n, subgroup_size(cfg, n)),
                            stride, 0.1)
    assert placed == again
    pl = plan(cfg, gpu="h200")
    # The plan's placement follows its backward pass (2/3 of forward + backward's compute).
    placed = fo_placement(cfg, n, prof, word, backward(prof, pl.compute_seconds * 2 / 3))
    s = placed.split
    assert pl.h2d_bytes_per_step == int(n * (12 * s.gpu + placed.inputs.word_bytes * s.cpu))
    assert pl.d2h_bytes_per_step == int(n * (12 * s.gpu + grad_bytes(cfg) * s.cpu))
    assert any(f"stride {placed.schedule.stride}" in note for note in pl.notes)
