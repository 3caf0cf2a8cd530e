"""update_stride="auto": the model's candidates, one timed step each, the fastest kept."""
from __future__ import annotations

import pytest

from workbench.config import RunConfig
from workbench.engine.events import EventBus, InfoEvent
from workbench.engine.fo import trial as fo_trial
from workbench.engine.fo.trial import ScheduleTrial
from workbench.plan import placement
from workbench.plan.placement import Candidate

from test_fo import _check_against_adamw, _engine, one_thread  # noqa: F401 (autouse fixture)

A, B, C = (Candidate(3, False, 0.1, 0.33), Candidate(placement.NO_GPU, False, 0.2, 0.0),
           Candidate(placement.NO_GPU, True, 0.3, 0.0))


def _engine_with_infos(cfg: RunConfig):
    """An fo-offload engine, its data, and a dict that collects its InfoEvents by key."""
    infos: dict = {}
    bus = EventBus()
    bus.subscribe(lambda e: infos.__setitem__(e.key, e.value) if isinstance(e, InfoEvent)
                  else None)
    engine, data = _engine(cfg, bus)
    return engine, data, infos


def test_trial_warms_up_then_times_each_candidate_once_and_keeps_the_fastest():
    trial = ScheduleTrial([A, B, C], warmup=1)
    assert trial.current == A and not trial.done
    assert trial.record(9.0) == A  # the warm-up step: not compared
    assert trial.record(0.30) == B
    assert trial.record(0.25) == C
    assert trial.record(0.28) == B and trial.done  # the winner
    assert trial.seconds == [0.30, 0.25, 0.28]
    summary = trial.summary()
    assert summary["chosen"] == 1
    assert [c["step_s"] for c in summary["candidates"]] == [0.30, 0.25, 0.28]
    assert [c["downcast"] for c in summary["candidates"]] == ["gpu", "gpu", "cpu"]
    with pytest.raises(RuntimeError, match="over"):
        trial.record(0.1)


def test_a_tie_goes_to_the_least_gpu_memory_then_to_the_earlier_candidate():
    trial = ScheduleTrial([A, B, C], warmup=0)
    for s in (1.00, 1.02, 1.02):  # B and C within TIE of A, with no GPU-side share
        trial.record(s)
    assert trial.winner == B  # fewer GPU parameters than A; as few as C, and earlier
    trial = ScheduleTrial([A, B], warmup=0)
    for s in (1.00, 1.00 * (1 + fo_trial.TIE) + 0.01):  # B just outside the tie
        trial.record(s)
    assert trial.winner == A
    with pytest.raises(ValueError, match="candidate"):
        ScheduleTrial([])


def test_a_candidate_that_does_not_fit_is_skipped_and_listed():
    """A placement the GPU cannot hold (out of memory when placed) is skipped, not fatal: the
    trial goes on to the next, and the record says which did not fit."""
    trial = ScheduleTrial([A, B, C], warmup=0)
    assert trial.record(0.30) == B
    assert trial.skip() == C  # B could not be placed
    assert trial.record(0.40) == A and trial.done  # the winner of those timed
    rows = trial.summary()["candidates"]
    assert [r["out_of_memory"] for r in rows] == [False, True, False]
    assert rows[1]["step_s"] is None
    only = ScheduleTrial([A], warmup=0)
    with pytest.raises(RuntimeError, match="no candidate placement fits"):
        only.skip()


@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_candidates_hold_the_models_pick_and_never_need_more_gpu(amp):
    engine, _ = _engine(RunConfig(model="tiny-opt", method="fo-offload", amp=amp,
                                  update_stride="7", subgroup_size=5000))
    cands = engine.candidates(0.0)
    pick = engine.plan("auto", 0.0)
    sched, split, down = pick.schedule, pick.split, pick.cpu_downcast
    tried = {(c.stride, bool(c.cpu_downcast)): c for c in cands}
    assert tried[sched.stride, down].predicted_s == pytest.approx(pick.predicted_s)  # its pick
    assert [c.predicted_s for c in cands] == sorted(c.predicted_s for c in cands)
    assert all(c.gpu_share <= split.gpu + split.resident for c in cands)
    assert placement.NO_GPU in {c.stride for c in cands}
    if sched.stride != placement.NO_GPU:  # and the next schedule with fewer GPU subgroups
        assert (placement.fewer(sched.stride), down) in tried
    assert len({(c.stride, c.cpu_downcast) for c in cands}) == len(cands)
    assert {c.cpu_downcast for c in cands} <= ({False, True} if amp == "bf16" else {None})
    engine.close()


class _Scripted(ScheduleTrial):
    """Reports scripted step times (the last candidate fastest) instead of the clock's."""

    def record(self, seconds: float, update_s: float | None = None) -> Candidate:
        n = len(self.candidates)
        fake = 1.0 if self._warm_left else 0.5 + 0.1 * (n - 1 - self._at)
        return super().record(fake, update_s)


@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_auto_tries_every_candidate_then_runs_the_winner_and_stays_exact(monkeypatch, amp):
    monkeypatch.setattr(fo_trial, "ScheduleTrial", _Scripted)
    cfg = RunConfig(model="tiny-opt", method="fo-offload", amp=amp, update_stride="auto",
                    subgroup_size=5000, lr=1e-2, weight_decay=0.1)
    # Equal to torch AdamW across every placement change (warm-up, each candidate, winner).
    _check_against_adamw(cfg, steps=6)
    engine, data, infos = _engine_with_infos(cfg)
    cands = engine.candidates(0.0)
    assert len(cands) >= 2 and engine.trying
    seen, t = [], 0
    while engine.trying or t == 0 or seen[-1] != seen[-2]:
        engine.step(data.batch_for_step(t, 4, 0), t, 1e-3, 0.0)
        now = engine.placement  # the placement it ran
        seen.append((now.schedule.stride, now.cpu_downcast))
        t += 1
        assert t < 30
    # After the warm-up the candidates are the model's anew (refitted to that step): the
    # record lists what ran, in order.
    tried = infos["fo_trial"]["candidates"]
    want = [(c["stride"], c["downcast"] == "cpu") for c in tried]
    assert want[0] == (cands[0].stride, bool(cands[0].cpu_downcast))
    assert len(want) >= 2
    # two warm-up steps (the second fits the model), one each, then the winner
    assert seen[:len(want) + 3] == [want[0], want[0], *want, want[-1]]
    assert not engine.trying
    assert infos["fo_trial"]["chosen"] == len(want) - 1
    assert infos["fo_stride"] == want[-1][0]  # the last placement published is the winner
    engine.close()


def test_a_given_stride_runs_no_trial():
    engine, data = _engine(RunConfig(model="tiny-opt", method="fo-offload", update_stride="2",
                                     subgroup_size=5000))
    assert not engine.trying
    engine.step(data.batch_for_step(0, 4, 0), 0, 1e-3, 0.0)
    assert engine.placement.schedule.stride == 2
    engine.close()


def test_the_record_lists_predicted_and_measured_update_per_schedule():
    trial = ScheduleTrial([A, B, C], warmup=1)
    trial.record(9.0, 5.0)  # the warm-up: not recorded
    for s, u in ((0.30, 0.11), (0.25, 0.15), (0.28, None)):  # C: no update phase timed
        trial.record(s, u)
    rows = trial.summary()["candidates"]
    assert [r["update_s_predicted"] for r in rows] == [0.1, 0.2, 0.3]
    assert [r["predicted_s"] for r in rows] == [0.1, 0.2, 0.3]
    assert [r["update_s_measured"] for r in rows] == [0.11, 0.15, None]
    assert rows[0]["prediction_error"] == pytest.approx((0.1 - 0.11) / 0.11)
    assert rows[1]["prediction_error"] == pytest.approx((0.2 - 0.15) / 0.15)
    assert rows[2]["prediction_error"] is None
    # within 15%: A (-9%) yes, B (+33%) no; C unknown
    assert trial.summary()["within"] == [1, 2]
    assert fo_trial.error(1.0, 0.0) is None and fo_trial.error(1.15, 1.0) == pytest.approx(0.15)


@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_an_auto_run_records_each_schedules_measured_update(amp):
    """The real trial on a CPU: every candidate's step times its update phase (``timeline.py``)
    and the record pairs it with the model's prediction."""
    cfg = RunConfig(model="tiny-opt", method="fo-offload", amp=amp, update_stride="auto",
                    subgroup_size=5000)
    engine, data, infos = _engine_with_infos(cfg)
    cands = engine.candidates(0.0)
    t = 0
    while engine.trying:
        engine.step(data.batch_for_step(t, 4, 0), t, 1e-3, 0.0)
        t += 1
    rows = infos["fo_trial"]["candidates"]
    assert len(rows) >= 2 and t == len(rows) + 2  # two warm-ups, then one step each
    assert rows[0]["stride"] == cands[0].stride  # after the warm-up: the refitted model's
    model = infos["fo_trial"]["model"]  # refitted to every step: warm-up and each candidate
    assert len(model["steps"]) == t - 1 and model["backward"]["seconds"] > 0
    # the flush's rate: the calibrated one, or more where a step showed more
    grad = engine.flat.g.element_size()  # bytes of a flushed gradient
    assert model["backward"]["d2h_bps"] >= grad * engine.calibration["Bd"].per_s
    for row in rows:
        assert row["update_s_predicted"] > 0
        assert row["update_s_measured"] > 0 and row["update_s_measured"] < row["step_s"]
        assert row["prediction_error"] == pytest.approx(
            (row["update_s_predicted"] - row["update_s_measured"]) / row["update_s_measured"])
    assert infos["fo_trial"]["within"][1] == len(rows)
    engine.close()


def test_skipping_the_last_candidates_still_adds_the_later_ones():
    """``then``'s candidates come after the first ones however the last of those ended: timed,
    or skipped (out of memory, over the cap); the trial then ends on the winner."""
    trial = ScheduleTrial([A, B], warmup=0, then=lambda best: [C])
    assert trial.record(0.30) == B
    assert trial.skip(over_cap=True) == C and not trial.done  # then's C after the skipped B
    assert trial.record(0.20) == C and trial.done
    rows = trial.summary()["candidates"]
    assert [r["over_cap"] for r in rows] == [False, True, False]
    assert [r["out_of_memory"] for r in rows] == [False, False, False]


def test_under_a_cap_an_auto_run_skips_what_does_not_fit_and_stays_exact(monkeypatch):
    """A (fake) cap on the CPU that only all-CPU placements fit: the trial starts with the
    leanest, lists the others as over the cap, ends, and the run stays AdamW-exact."""
    monkeypatch.setattr(fo_trial.Proposals, "capped", property(lambda self: True))
    monkeypatch.setattr(fo_trial.Proposals, "measured", lambda self, c: None)
    monkeypatch.setattr(fo_trial.Proposals, "fits", lambda self, c: c.gpu_share == 0)
    # The model as calibrated (not refitted to the CPU's steps): its candidates have GPU shares.
    monkeypatch.setattr(fo_trial.Proposals, "observe", lambda self, *a: None)
    cfg = RunConfig(model="tiny-opt", method="fo-offload", amp="bf16", update_stride="auto",
                    subgroup_size=5000, lr=1e-2, weight_decay=0.1)
    _check_against_adamw(cfg, steps=6)
    engine, data, infos = _engine_with_infos(cfg)
    assert engine.placement.split.gpu == 0  # the leanest first
    for t in range(8):
        engine.step(data.batch_for_step(t, 4, 0), t, 1e-3, 0.0)
    assert not engine.trying and engine.placement.split.gpu == 0
    rows = infos["fo_trial"]["candidates"]
    assert all(r["over_cap"] == (r["gpu_share"] > 0) for r in rows)
    assert any(r["over_cap"] for r in rows) and all(r["step_s"] is None for r in rows
                                                    if r["over_cap"])
    engine.close()
