"""adam_state_dtype=bf16: Adam's m and v in bf16 with stochastic rounding, the fp32 master kept.

The bound: each step, p equals AdamW's (fed the stored moments, upcast) to the fp32 tolerance of
``test_fo.py``, and each stored moment is within one bf16 ulp (2^-7 of its magnitude) of the
fp32 moment AdamW computes, give or take a few fp32 ulps of its two terms (where they cancel,
fused kernels on a GPU and torch's reference differ there); the rounding is unbiased (exactly, over the noise table) and the
same bits whichever side updates a subgroup, so a run replays exactly.
"""
from __future__ import annotations

import pytest
import torch

from test_fo import ATOL, LR, RTOL, WD, _engine, one_thread  # noqa: F401 (autouse fixture)
from workbench.config import ConfigError, RunConfig
from workbench.engine.fo import moments
from workbench.engine.fo.adamw import AdamW, OptState, Segment, adamw
from workbench.engine.fo.moments import PERIOD, HalfMoments, adamw_half, round_into
from workbench.plan import placement
from workbench.plan.fo import host_traffic_per_param

ULP = 2.0 ** -7  # a bf16 ulp relative to the value's magnitude, at most
CPU = torch.device("cpu")


def test_rounding_lands_on_a_neighbour_and_is_exactly_unbiased_over_the_table():
    x = torch.tensor([1.0 + 2 ** -10, -3.14159, 1e-7, 6.1e-5, -2.5e-30, 0.0, 1.0])
    table = moments._order()
    assert sorted(torch.bincount(table, minlength=1 << 16).unique().tolist()) == [PERIOD >> 16]
    for v in x.tolist():
        out = torch.empty(PERIOD, dtype=torch.bfloat16)
        round_into(torch.full((PERIOD,), v), out, table)
        got = out.double()
        down = torch.tensor(v).view(torch.int32) & ~0xFFFF  # toward zero, then one ulp out
        lo = float(down.view(torch.float32))
        hi = float((down + (1 << 16)).view(torch.float32)) if v != lo else lo
        assert set(got.unique().tolist()) <= {lo, hi}
        assert float(got.mean()) == pytest.approx(v, rel=1e-12, abs=1e-45)  # E[SR(x)] = x


def test_non_finite_moments_stay_non_finite():
    x = torch.tensor([float("inf"), float("-inf"), float("nan")])
    out = torch.empty(3, dtype=torch.bfloat16)
    round_into(x, out, torch.full((3,), 0xFFFF, dtype=torch.int32))
    assert out[0] == float("inf") and out[1] == float("-inf") and out[2].isnan()


def _state(n: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    p, g = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    m = (0.1 * torch.randn(n, generator=gen)).bfloat16()
    v = (0.01 * torch.rand(n, generator=gen)).bfloat16()
    return p, g, m, v


def test_one_update_keeps_p_exact_and_moments_within_an_ulp():
    n, opt, t = 5000, AdamW(LR, WD, 0.9, 0.999, 1e-8), torch.tensor(3.0)
    p, g, m, v = _state(n)
    segs = [Segment(0, 3000, True), Segment(3000, n, False)]
    ref = OptState(p.clone(), m.float(), v.float())
    adamw(ref, g, segs, opt, t)
    half = HalfMoments(7, CPU, 1024)  # chunks of 1024: decay runs cut at chunk edges
    got = OptState(p.clone(), m.clone(), v.clone())
    adamw_half(got, g, segs, opt, t, half, j=4)
    assert torch.equal(got.p, ref.p)  # the update reads the unrounded fp32 moments
    for stored, exact in ((got.m, ref.m), (got.v, ref.v)):
        assert stored.dtype == torch.bfloat16
        assert bool(((stored.float() - exact).abs() <= ULP * exact.abs()).all())


def test_moments_are_unbiased_over_seeds():
    n, opt, t, seeds = 2000, AdamW(LR, 0.0, 0.9, 0.999, 1e-8), torch.tensor(1.0), 400
    p, g, m, v = _state(n, 1)
    ref = OptState(p.clone(), m.float(), v.float())
    adamw(ref, g, [Segment(0, n, False)], opt, t)
    total = torch.zeros(n, dtype=torch.float64)
    for s in range(seeds):
        got = OptState(p.clone(), m.clone(), v.clone())
        adamw_half(got, g, [Segment(0, n, False)], opt, t, HalfMoments(s, CPU, n), j=0)
        total += got.m.double()
    err = (total / seeds - ref.m.double()).abs()
    # one rounding's error has std <= ulp / 2; the mean of 400 within 6 sigma
    assert bool((err <= 6 * ULP * ref.m.abs().double() / (2 * seeds ** 0.5) + 1e-30).all())


def test_fo_refuses_bf16_moments():
    with pytest.raises(ConfigError, match="adam_state_dtype: 'bf16' does not apply to method=fo"):
        RunConfig(method="fo", adam_state_dtype="bf16")
    with pytest.raises(ConfigError, match="adam_state_dtype"):
        RunConfig(method="fo-offload", adam_state_dtype="fp16")


def _cfg(**kw) -> RunConfig:
    return RunConfig(**{**dict(model="tiny-opt", method="fo-offload", lr=LR, weight_decay=WD,
                               adam_state_dtype="bf16", subgroup_size=5000), **kw})


def _run(cfg: RunConfig, steps: int, check=None) -> list[torch.Tensor]:
    """p, m, v after ``steps`` steps; ``check(engine, before, t)`` after each step."""
    engine, data = _engine(cfg)
    for t in range(steps):
        before = [x.clone() for x in (torch.cat(engine.state_flats()), engine.flat.m,
                                      engine.flat.v)]
        engine.step(data.batch_for_step(t, 4, cfg.seed).to(cfg.device), t, LR, WD)
        if check:
            check(engine, before, t + 1)
    out = [torch.cat(engine.state_flats()).clone(), engine.flat.m.clone(), engine.flat.v.clone()]
    engine.close()
    return out


def _within_bound_of_torch_adamw(engine, before, t: int) -> None:
    """torch.optim.AdamW, its state the stored moments before the step and fed the engine's
    gradients: p within the fp32 tolerance, each stored moment within one bf16 ulp."""
    p0, m0, v0 = before
    g = torch.cat(engine.grad_flats())
    got_p = torch.cat(engine.state_flats())
    f = engine.flat
    for lay, o in zip(f.layouts, f.offsets):
        for lo, hi, wd in ((o, o + lay.n_decay, WD), (o + lay.n_decay, o + lay.numel, 0.0)):
            if hi <= lo:
                continue
            w = torch.nn.Parameter(p0[lo:hi].clone())
            w.grad = g[lo:hi].clone()
            c = engine.cfg
            opt = torch.optim.AdamW([w], lr=LR, betas=(c.adam_beta1, c.adam_beta2),
                                    eps=c.adam_eps, weight_decay=wd, foreach=False)
            opt.state[w] = {"step": torch.tensor(float(t - 1)),
                            "exp_avg": m0[lo:hi].float(), "exp_avg_sq": v0[lo:hi].float()}
            opt.step()
            torch.testing.assert_close(got_p[lo:hi], w.detach(), atol=ATOL, rtol=RTOL)
            gi, b1, b2 = g[lo:hi], c.adam_beta1, c.adam_beta2
            # fp32 rounding of the moment's two terms (a few ulps of each; where they cancel,
            # the kernels' FMA order shows), then one bf16 ulp of the stochastic rounding
            terms = (b1 * m0[lo:hi].float().abs() + (1 - b1) * gi.abs(),
                     b2 * v0[lo:hi].float() + (1 - b2) * gi * gi)
            for stored, exact, term in ((f.m[lo:hi], opt.state[w]["exp_avg"], terms[0]),
                                        (f.v[lo:hi], opt.state[w]["exp_avg_sq"], terms[1])):
                err = 2.0 ** -20 * term
                bound = ULP * (exact.abs() + err) + err + 1e-30
                assert bool(((stored.float() - exact).abs() <= bound).all())


@pytest.mark.parametrize("stride, ratio", [("1000000", 0.0), ("-2", 0.2), ("1", 0.0)])
def test_bf16_moments_each_step_within_the_bound_of_torch_adamw(stride, ratio):
    _run(_cfg(update_stride=stride, gpu_resident_ratio=ratio), 4, _within_bound_of_torch_adamw)


@pytest.mark.gpu
@pytest.mark.parametrize("amp, stride, ratio", [("bf16", "-2", 0.2), ("off", "2", 0.0),
                                                ("bf16", "1000000", 0.0)])
def test_cuda_bf16_moments_each_step_within_the_bound_of_torch_adamw(monkeypatch, amp, stride,
                                                                     ratio):
    """On a GPU: CPU side, slots in pieces and residents round the moments within the bound."""
    monkeypatch.setattr(placement, "SLOT_PIECE", 3000)
    _run(_cfg(device="cuda", amp=amp, update_stride=stride, gpu_resident_ratio=ratio), 4,
         _within_bound_of_torch_adamw)


def test_every_schedule_and_a_replay_give_the_same_bits(monkeypatch):
    """The rounding depends on (seed, Adam step, subgroup, element) only: CPU side, "GPU"
    side in slot pieces, residents and a second run all store the same p, m, v."""
    monkeypatch.setattr(placement, "SLOT_PIECE", 3000)
    runs = [_run(_cfg(update_stride=s, gpu_resident_ratio=r), 3)
            for s, r in (("1000000", 0.0), ("1", 0.0), ("-2", 0.3), ("1000000", 0.0))]
    assert runs[0][1].dtype == torch.bfloat16
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))


def test_planner_counts_bf16_moments():
    assert host_traffic_per_param("fp32", False) == 36  # issue 41's figure
    assert host_traffic_per_param("bf16", False) == 28
    assert host_traffic_per_param("bf16", True) == 32
    assert placement.state_words("bf16") == 2.0 and placement.state_words("fp32") == 3.0
    perf = placement.PerfInputs(3e9, 35e9, 2e9, 8.7e9)
    half = placement.PerfInputs(3e9, 35e9, 2e9, 8.7e9, state_words=2.0)
    # cheaper swaps: a larger GPU share balances the two sides
    assert placement.balance_ratio(*half.rates, **half.shape) < placement.balance_ratio(
        *perf.rates, **perf.shape)
    from workbench.plan.planner import plan
    kw = dict(model="opt-1.3b", method="fo-offload", device="cuda", amp="bf16")
    full, small = (plan(RunConfig(**kw, adam_state_dtype=d, cpu_adamw="torch"), gpu="h100")
                   for d in ("fp32", "bf16"))
    n = full.params
    assert full.host_breakdown["fp32 master, m, v, grads"] == 16 * n
    assert small.host_breakdown["fp32 master, bf16 m, v, fp32 grads"] == 12 * n
    # the one-pass CPU AdamW keeps the gradients in bf16 (2 B), as backward wrote them
    one = plan(RunConfig(**kw, cpu_adamw="one-pass"), gpu="h100")
    assert one.host_breakdown["fp32 master, m, v, bf16 grads"] == 14 * n
    assert one.d2h_bytes_per_step < full.d2h_bytes_per_step
    assert any("28 B per CPU-updated parameter" in s or "32 B per" in s for s in small.notes)
