"""fo-offload's update phase after a backward pass the CPU side works through (``plan/overlap.py``)
and the model refitted to measured steps (``plan/dma.py::refit``)."""
from __future__ import annotations

import pytest

from workbench.plan import dma, overlap, placement
from workbench.plan.fo_memory import QUEUE_BYTES
from workbench.plan.overlap import Backward
from workbench.plan.placement import PerfInputs, Subgroups

N = 6_700_000_000
PERF = PerfInputs(B=13.4e9, Ug=55e9, Uc=4.5e9, Dc=12e9, word_bytes=2)
GROUPS = Subgroups(N, 50_000_000)


def _placed(stride: int, resident: float = 0.0, down: bool = False):
    return placement.place_at(PERF, GROUPS, stride, resident, down)


@pytest.mark.parametrize("stride,resident,down", [(3, 0.0, False), (2, 0.2, True),
                                                  (placement.NO_GPU, 0.0, False), (-2, 0.0, True)])
def test_with_no_head_start_it_is_the_papers_model(stride, resident, down):
    """A backward that ends at once and a link as fast both ways as one: the CPU side is its
    whole work (plus its last subgroup's upload), the GPU side exactly ``placement.sides``."""
    placed = _placed(stride, resident, down)
    cpu_s, gpu_s = placed.sides(N)
    bwd = Backward(0.0, 1e30, None)
    cpu, gpu = overlap.sides(placed, GROUPS, cpu_s, bwd)
    size = GROUPS.size
    up_one = size * placed.inputs.word_bytes / (4 * placed.inputs.B) if placed.schedule.cpu else 0
    assert cpu == pytest.approx(cpu_s + up_one, rel=1e-3)
    assert gpu == pytest.approx(gpu_s, rel=1e-9)


def _simulated_cpu_end(placed, groups: Subgroups, cpu_s: float,
                       bwd: Backward) -> tuple[float, float]:
    """An independent event simulation: backward produces every subgroup's gradients at an even
    pace, last subgroup first; the CPU subgroups' gradients go down one after another at
    d2h_bps (first in, first out), backward waiting while more than QUEUE_BYTES wait; the CPU
    takes each once it is down. Returns (CPU end, backward end), seconds from backward's start."""
    n = groups.count
    cpu = set(placed.schedule.cpu)
    per_cpu = cpu_s / sum(groups.numel_of(j) for j in cpu)
    t_prod, link_free, cpu_free, queue = 0.0, 0.0, 0.0, []
    for j in reversed(range(n)):
        t_prod += bwd.seconds * groups.numel_of(j) / groups.numel
        if j not in cpu:
            continue
        nbytes = 4 * groups.numel_of(j)
        # backward waits until what is queued ahead (not yet down) is within QUEUE_BYTES
        while queue and sum(b for _, b in queue) + nbytes > QUEUE_BYTES:
            done, _ = queue.pop(0)
            t_prod = max(t_prod, done)
        queue = [(d, b) for d, b in queue if d > t_prod]
        link_free = max(link_free, t_prod) + nbytes / bwd.d2h_bps
        queue.append((link_free, nbytes))
        cpu_free = max(cpu_free, link_free) + per_cpu * groups.numel_of(j)
    return cpu_free, t_prod


@pytest.mark.parametrize("stride", [2, 3, 6, placement.NO_GPU])
@pytest.mark.parametrize("bwd_s", [0.07, 0.4, 1.5])
@pytest.mark.parametrize("groups", [GROUPS, Subgroups(1_300_000_000, 120_000_000)],
                         ids=["even", "short-last"])  # 11 subgroups, the last 100 M
def test_the_cpu_sides_head_start_matches_an_event_simulation(stride, bwd_s, groups):
    """Tens of subgroups or more (the model spreads the landings evenly: with a few large
    ones the first one's own backward and flush, which it leaves out, matter)."""
    placed = placement.place_at(PERF, groups, stride, 0.0, False)
    cpu_s = max(placed.sides(groups.numel)[0], 1e-9)
    bwd = Backward(bwd_s, 50e9, 85e9)
    cpu_end, bwd_end = _simulated_cpu_end(placed, groups, cpu_s, bwd)
    finishes = overlap.cpu_finishes(placed, groups, cpu_s, bwd)
    assert finishes[-1] == pytest.approx(cpu_end, rel=0.03)
    assert overlap.backward_end(placed, groups.numel, bwd) == pytest.approx(bwd_end, rel=0.05,
                                                                            abs=0.01)


@pytest.mark.parametrize("groups", [GROUPS, Subgroups(1_000_000_000, 400_000_000)],
                         ids=["even", "three"])  # 400 M, 400 M, 200 M
def test_a_backward_longer_than_the_cpu_work_leaves_only_the_last_subgroup(groups):
    placed = placement.place_at(PERF, groups, placement.NO_GPU, 0.0, False)
    cpu_s = placed.sides(groups.numel)[0]
    bwd = Backward(3 * cpu_s, 1e30, None)
    cpu, _ = overlap.sides(placed, groups, cpu_s, bwd)
    # the last in processing order: subgroup 0, a full one (its own size, not numel / count)
    per = cpu_s * groups.size / groups.numel
    up = groups.size * placed.inputs.word_bytes / (4 * PERF.B)  # fp32 up: downcast on the GPU
    assert cpu == pytest.approx(per + up, rel=1e-3)


def test_the_link_both_ways_slows_the_interleaved_swap():
    placed = _placed(3)
    cpu_s = placed.sides(N)[0]
    one_way = 4 * PERF.B
    _, gpu_fast = overlap.sides(placed, GROUPS, cpu_s, Backward(0.1, 50e9, 2 * one_way))
    _, gpu_slow = overlap.sides(placed, GROUPS, cpu_s, Backward(0.1, 50e9, one_way))
    swap = placed.split.gpu * N * 12
    assert gpu_slow - gpu_fast == pytest.approx(swap / (one_way / 2) - swap / one_way, rel=1e-6)


def test_auto_takes_the_fastest_predicted_stride_once_backward_is_known():
    c = dma.Contention(PERF.Uc, PERF.Uc / 1.5, 85e9)
    bwd = Backward(0.2, 50e9, 85e9)
    best = dma.place(PERF, GROUPS, "auto", 0.0, False, c, bwd)
    for k in dma.strides(GROUPS.count):
        assert best.predicted_s <= dma.place(PERF, GROUPS, k, 0.0, False, c, bwd).predicted_s
    cands = dma.candidates(PERF, GROUPS, 0.0, c, bwd)
    assert cands[0].stride == best.schedule.stride or cands[0].predicted_s <= best.predicted_s
    assert all(x.gpu_share <= best.split.gpu + 1e-12 or x.cpu_downcast for x in cands)


def test_refit_recovers_the_cpu_rate_and_its_slowdown_from_steps():
    c = dma.Contention(9e9, 3e9, 80e9)  # calibrated: wrong by far
    uc, s = 5e9, 0.6  # the truth the steps follow: y = (1 + s u) / Uc
    steps = [(u, (1 + s * u) / uc) for u in (0.3, 0.5, 0.9)]
    got_uc, got = dma.refit(c, 9e9, steps)
    assert got_uc == pytest.approx(uc) and got.slowdown == pytest.approx(s)
    assert got.load_bps == c.load_bps
    # One step (or loads too close to tell s): the rate alone, the calibrated slowdown kept.
    one_uc, one = dma.refit(c, 9e9, steps[:1])
    assert one.slowdown == pytest.approx(c.slowdown)
    assert (1 + one.slowdown * 0.3) / one_uc == pytest.approx(steps[0][1])
    # A fit that says more load is faster is not taken.
    odd_uc, odd = dma.refit(c, 9e9, [(0.2, 3e-10), (0.9, 2e-10)])
    assert odd.slowdown == pytest.approx(c.slowdown)
    # No load measured (a CPU machine): the steps' mean rate.
    assert dma.refit(None, 9e9, [(0.0, 2e-10), (0.0, 4e-10)]) == (pytest.approx(1 / 3e-10), None)
    assert dma.refit(c, 9e9, []) == (9e9, c)


def test_a_flush_bound_backward_shows_the_flush_rate():
    """A backward that waited on the flush took at least (flushed - queue) / rate: from its
    length the rate is at least (flushed - queue) / seconds; a short flush says nothing."""
    placed = _placed(placement.NO_GPU)
    rate = 45e9
    bwd = Backward(0.05, rate)
    ended = overlap.backward_end(placed, N, bwd)
    assert overlap.flush_rate_shown(placed, N, ended) == pytest.approx(rate)
    assert overlap.flush_rate_shown(placed, N, 2 * ended) == pytest.approx(rate / 2)
    lean = placement.place_at(PERF, GROUPS, 2, 0.99, False)  # almost all resident
    assert overlap.flush_rate_shown(lean, N, 0.1) == 0.0
    assert overlap.flush_rate_shown(placed, N, 0.0) == 0.0
