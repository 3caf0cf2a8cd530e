"""subgroup_size="auto" (the default): the sizes ``plan/auto.py`` proposes, tried with the
stride."""
from __future__ import annotations

import pytest

from workbench.config import ConfigError, RunConfig, parse_value
from workbench.engine.events import EventBus, InfoEvent
from workbench.engine.fo import trial as fo_trial
from workbench.plan import auto
from workbench.engine.fo.trial import ScheduleTrial
from workbench.plan.auto import SIZES, subgroup_sizes
from workbench.plan.placement import Candidate

from test_fo import _check_against_adamw, _engine, one_thread  # noqa: F401 (autouse fixture)

M = 1_000_000


class _Scripted(ScheduleTrial):
    """Reports scripted step times, each candidate 10% faster than the one before (the last
    tried the fastest, however many ``then`` adds)."""

    def record(self, seconds: float, update_s: float | None = None) -> Candidate:
        return super().record(9.0 if self._warm_left else 0.9 ** self._at, update_s)


def test_the_sizes_auto_proposes():
    assert subgroup_sizes(6_700 * M, True) == SIZES == (50 * M, 25 * M, 100 * M)
    assert subgroup_sizes(400 * M, True) == (50 * M, 25 * M)  # 8 subgroups at least
    assert subgroup_sizes(135 * M, True) == (8 * M,)  # one size: no size trial
    assert subgroup_sizes(60 * M, True) == (7_500_000,)  # below 8 x 8 M: 8 subgroups
    assert subgroup_sizes(10 * M, True) == (1_250_000,)  # a small model: 8 subgroups
    assert subgroup_sizes(3000, True) == (1024,)
    assert subgroup_sizes(6_700 * M, False) == (50 * M,)  # a CPU run: one size, no trial
    assert subgroup_sizes(3000, False) == (3000,)


def test_auto_is_the_default_and_a_number_still_works():
    assert RunConfig().subgroup_size == "auto"
    assert RunConfig(method="fo-offload", subgroup_size="5000").subgroup_size == 5000
    assert parse_value("subgroup_size", "auto") == "auto"
    assert parse_value("subgroup_size", "2000000") == 2_000_000
    with pytest.raises(ConfigError, match=r"subgroup_size: 100 is outside \[1024"):
        RunConfig(method="fo-offload", subgroup_size=100)
    with pytest.raises(ConfigError, match="subgroup_size: 'big' is not 'auto'"):
        RunConfig(method="fo-offload", subgroup_size="big")


def test_a_cpu_run_takes_one_size_and_no_trial():
    engine, data = _engine(RunConfig(model="tiny-opt", method="fo-offload", update_stride="2"))
    assert engine.sizes == (engine.flat.numel,) and engine.flat.sub == engine.flat.numel
    assert not engine.trying
    engine.close()


def _record(cfg: RunConfig, steps: int):
    infos: dict = {}
    bus = EventBus()
    bus.subscribe(lambda e: infos.__setitem__(e.key, e.value) if isinstance(e, InfoEvent)
                  else None)
    engine, data = _engine(cfg, bus)
    ran = []
    for t in range(steps):
        engine.step(data.batch_for_step(t, 4, 0), t, 1e-3, 0.0)
        ran.append((engine.placement.schedule.stride, engine.flat.sub))
    return engine, infos, ran


@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_auto_tries_the_best_stride_at_each_other_size_and_stays_exact(monkeypatch, amp):
    """Strides at the first size, then the winner at each other size (the last one scripted
    fastest), the run record listing all; AdamW-exact through every re-cut."""
    monkeypatch.setattr(auto, "subgroup_sizes", lambda numel, cuda: (5000, 3000, 8000))
    monkeypatch.setattr(fo_trial, "ScheduleTrial", _Scripted)
    cfg = RunConfig(model="tiny-opt", method="fo-offload", amp=amp, lr=1e-2, weight_decay=0.1)
    _check_against_adamw(cfg, steps=8)
    engine, infos, ran = _record(cfg, 12)
    cands = infos["fo_trial"]["candidates"]
    sizes = [c["subgroup_size"] for c in cands]
    assert sizes[-2:] == [3000, 8000] and set(sizes[:-2]) == {5000}
    strides = {c["stride"] for c in cands[-3:]}
    assert len(strides) == 1  # the first size's winner (scripted: its last) at each other size
    assert infos["fo_trial"]["chosen"] == len(cands) - 1  # scripted: the last tried is fastest
    assert ran[-1] == (cands[-1]["stride"], 8000) and not engine.trying
    assert infos["fo_perf_inputs"]["subgroup_size"] == 8000  # the kept placement, published last
    assert sorted({n for _, n in ran}) == [3000, 5000, 8000]
    engine.close()


def test_a_given_stride_with_auto_sizes_tries_the_sizes_only(monkeypatch):
    monkeypatch.setattr(auto, "subgroup_sizes", lambda numel, cuda: (5000, 3000))
    engine, infos, ran = _record(RunConfig(model="tiny-opt", method="fo-offload",
                                           update_stride="2"), 4)
    cands = infos["fo_trial"]["candidates"]
    assert [(c["stride"], c["subgroup_size"]) for c in cands] == [(2, 5000), (2, 3000)]
    assert {s for s, _ in ran} == {2}
    engine.close()


def test_resident_shares_that_fit_a_memory_limit():
    """opt-6.7b under bf16 with a 40 GB cap and the 21.9 GB peak issue 41 measured for auto:
    15.9 GB spare at 14 B a resident parameter (fp32 p, m, v + a bf16 gradient) is 17%, so
    15% and 5% are tried; bf16 moments (10 B) fit 20% and 10%; nothing fits a full GPU."""
    n, budget, peak = 6_700 * M, int(40e9), int(21.9e9)
    spare = auto.gpu_spare(budget, peak)
    assert spare == budget - peak - auto.MARGIN
    assert auto.resident_bytes(12, 2) == 14 and auto.resident_bytes(8, 2) == 10
    assert auto.resident_shares(spare, n, 14, 4 * 50 * M) == (0.15, 0.05)
    assert auto.resident_shares(spare, n, 10, 4 * 50 * M) == (0.2, 0.1)
    assert auto.resident_shares(auto.gpu_spare(budget, int(39e9)), n, 14) == ()
    assert auto.resident_shares(10**15, 1000, 14) == (1.0, 0.5)


def test_auto_tries_the_resident_shares_that_fit_and_records_them(monkeypatch):
    """A fake GPU budget (CPU run): after the strides, the best at each share that fits."""
    monkeypatch.setattr(fo_trial, "ScheduleTrial", _Scripted)
    monkeypatch.setattr(fo_trial.Proposals, "more_to_try", property(lambda self: True))
    per = 14 - 2  # fp32 weights: 12 B of p, m, v + a 4 B gradient = 16 B a resident
    monkeypatch.setattr(fo_trial.Proposals, "gpu_spare",
                        lambda self: int(0.32 * self.numel * (per + 4)) + 4 * self.sizes[0])
    cfg = RunConfig(model="tiny-opt", method="fo-offload", subgroup_size=5000, lr=1e-2,
                    weight_decay=0.1)
    _check_against_adamw(cfg, steps=8)
    engine, infos, ran = _record(cfg, 10)
    assert infos["fo_gpu_budget"]["shares"] == [0.3, 0.15]
    cands = infos["fo_trial"]["candidates"]
    assert [c["gpu_resident_ratio"] for c in cands[-2:]] == [0.3, 0.15]
    assert all(c["gpu_resident_ratio"] == 0 for c in cands[:-2])
    assert infos["fo_trial"]["chosen"] == len(cands) - 1  # scripted: the last is fastest
    assert engine.resident_ratio == 0.15 and len(engine.placement.schedule.resident) > 0
    engine.close()
