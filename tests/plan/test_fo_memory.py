"""fo-offload's GPU memory by part (``plan/fo_memory.py``): the engine allocates what the plan
counts, the gradient queue is bounded as counted, and a cap gets the fastest placement that
fits, in the plan and in the engine's trial."""
from __future__ import annotations

import pytest
import torch

from workbench.calibrate.fo import measure
from workbench.config import RunConfig
from workbench.engine import build_engine
from workbench.engine.events import EventBus
from workbench.engine.fo import trial as fo_trial
from workbench.engine.fo.grads import GradFlush
from workbench.models.build import build_skeleton
from workbench.plan import fo_memory
from workbench.plan.fo_memory import QUEUE_BYTES, device_parts, leaner_strides
from workbench.plan.placement import NO_GPU, STATE_BYTES, Candidate, PerfInputs, Split
from workbench.plan.planner import CONTEXT_BYTES, plan

GiB = 2 ** 30
HOST = {"host_mem_available_bytes": 125 * GiB}


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


@pytest.mark.parametrize("amp", ["bf16", "off"])
@pytest.mark.parametrize("stride, resident", [(2, 0.25), (NO_GPU, 0.0), (-3, 0.0)])
def test_the_engine_allocates_the_parts_the_plan_counts(amp, stride, resident):
    """Every buffer a placement allocates, part by part, equals ``device_parts`` for the
    placement's split (tiny-opt on the CPU: the same buffers as on a GPU)."""
    torch.set_num_threads(1)
    cfg = RunConfig(model="tiny-opt", method="fo-offload", amp=amp, subgroup_size=4096,
                    update_stride=str(stride), gpu_resident_ratio=resident, telemetry=False)
    model, source = build_skeleton(cfg.model)
    engine = build_engine(model, source, cfg, torch.device("cpu"), EventBus(), measure=measure)
    try:
        word, g, placed = engine.word, engine.gpu, engine.placement
        got = {"compute weights": _nbytes(engine.flat.w),
               "gradients kept for the GPU": _nbytes(g.kept.buffer),
               "resident optimizer share": _nbytes(*(g.residents or ()), g._res_g),
               "subgroups in flight": _nbytes(*(t for slot in g.slots for t in slot)),
               "gradient upcast staging": _nbytes(*(engine.grads.upcast or ())),
               "weight upload slot": _nbytes(engine.host.slot)}
        parts = device_parts(engine.flat.numel, word, STATE_BYTES["fp32"], placed.split,
                             engine.flat.sub, word == 2 and not placed.cpu_downcast,
                             engine.flat.g.element_size())
        queued = parts.pop("gradients queued for the link")
        assert got == parts
        assert queued == min(QUEUE_BYTES, round(word * engine.flat.numel * placed.split.cpu))
    finally:
        engine.close()


class _Event:
    def __init__(self, log: list, name: str):
        self.log, self.name = log, name

    def synchronize(self) -> None:
        self.log.append(self.name)


def test_backward_waits_for_the_link_past_the_queue_bound():
    """``_bound_queue``: the oldest queued gradients are waited for, in order, until at most
    ``QUEUE_BYTES`` wait; the newest is never waited for (it was just enqueued)."""
    flush = GradFlush.__new__(GradFlush)
    flush._queue, flush._queued, flush.waits = __import__("collections").deque(), 0, 0
    log: list = []
    third = QUEUE_BYTES // 3
    for name in "abc":
        flush._bound_queue(_Event(log, name), third)
    assert log == [] and flush._queued == 3 * third <= QUEUE_BYTES
    flush._bound_queue(_Event(log, "d"), third)  # 4 thirds > the bound: the oldest waited for
    assert log == ["a"] and flush._queued == 3 * third and flush.waits == 1
    flush._bound_queue(_Event(log, "e"), 2 * QUEUE_BYTES)  # one huge group: all before it
    assert log == ["a", "b", "c", "d"] and flush._queued == 2 * QUEUE_BYTES


def test_leaner_strides_go_down_to_all_on_the_cpu():
    assert leaner_strides(-3, 10) == [-3, -2, 2, 3, 4, 5, 6, 7, 8, 9, 10, NO_GPU]
    assert leaner_strides(3, 4) == [3, 4, NO_GPU]
    assert leaner_strides(NO_GPU, 4) == [NO_GPU]


def test_a_cap_plans_the_fastest_placement_that_fits():
    """opt-6.7b, bf16, 8 x 128 on the H100 table: uncapped the model's pick keeps 80% of the
    gradients on the GPU (8+ GiB); under a 22 GB cap the plan takes a leaner stride whose
    parts fit, and says so; the leanest (all on the CPU) fits where nothing else does; a cap
    below even that is refused with the leanest estimate."""
    base = dict(model="opt-6.7b", method="fo-offload", amp="bf16", batch_size=8, seq_len=128,
                device="cuda", cpu_adamw="torch")  # fp32 gradients: the thresholds below
    free = plan(RunConfig(**base), gpu="h100", calibration=HOST)
    assert free.gpu_breakdown["gradients kept for the GPU"] > 8 * GiB

    def kept(gb: float):
        pl = plan(RunConfig(**base, gpu_mem_limit_gb=gb), gpu="h100", calibration=HOST)
        return pl, pl.gpu_breakdown["gradients kept for the GPU"]

    p22, k22 = kept(22)
    assert p22.fits_gpu and 0 < k22 < 2 * GiB
    assert p22.nvml_gpu_mem_bytes <= 22e9
    assert any("gpu_mem_limit_gb=22 leaves room for" in n for n in p22.notes)
    p30, k30 = kept(30)
    assert p30.fits_gpu and k22 < k30 < free.gpu_breakdown["gradients kept for the GPU"]
    p21, k21 = kept(21)  # nearly all on the CPU: weights, a queue, staging, activations
    assert p21.fits_gpu and k21 < 0.1 * GiB
    p20, k20 = kept(20)
    assert not p20.fits_gpu and k20 == 0  # refused with the leanest placement's estimate
    assert p20.nvml_gpu_mem_bytes > 20e9


def _proposals(monkeypatch, limit: float, numel: int = 6_700_000_000):
    cfg = RunConfig(model="opt-6.7b", method="fo-offload", amp="bf16", gpu_mem_limit_gb=limit,
                    device="cuda")
    from workbench.plan import fo as plan_fo
    from workbench.plan.rates import profile

    prof, _ = profile(cfg, "h100", None)
    perf = plan_fo.perf_inputs(prof, 2)
    props = fo_trial.Proposals(perf, numel, 2, (50_000_000,), cfg, torch.device("cpu"),
                               EventBus())
    monkeypatch.setattr(fo_trial.Proposals, "capped", property(lambda self: True))
    return props


def test_under_a_cap_the_trial_starts_lean_and_skips_what_does_not_fit(monkeypatch):
    """Proposals under a (fake) cap: the least GPU share first; after its step, a candidate
    fits when the measured base + its parts + the margin stay within the cap; ``more`` adds
    the stride with the most GPU subgroups that fits."""
    props = _proposals(monkeypatch, 22.0)
    cands = [Candidate(3, False, 1.0, 1 / 3, 50_000_000), Candidate(NO_GPU, False, 2.0, 0.0,
                                                                    50_000_000),
             Candidate(4, False, 1.5, 0.25, 50_000_000)]
    assert [c.gpu_share for c in props.first(cands)] == [0.0, 0.25, 1 / 3]
    assert props.fits(cands[0])  # nothing measured yet
    budget = int(22e9) - CONTEXT_BYTES
    lean = props.parts(cands[1])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: lean + GiB)
    props.measured(cands[1])
    assert props.base == GiB
    room = budget - props.base - fo_memory_margin()
    for c in cands:
        assert props.fits(c) == (props.parts(c) <= room)
    assert props.fits(cands[1]) and not props.fits(cands[0])  # 1/3 kept: 4.4 GB more
    more = props.more(cands[1])
    fit = [c for c in more if c.resident == 0 and c.stride != NO_GPU]
    assert len(fit) == 1 and props.fits(fit[0])
    leaner = props.candidate(fit[0].stride - 1 if fit[0].stride > 2 else 2, False, 50_000_000)
    assert fit[0].stride == 2 or not props.fits(leaner)  # the most GPU share that fits


def fo_memory_margin() -> int:
    from workbench.plan import auto

    return auto.MARGIN


def test_the_parts_of_a_candidate_are_its_placements():
    """``Proposals.parts`` of a candidate: ``device_parts`` of its split, size and site."""
    props = fo_trial.Proposals.__new__(fo_trial.Proposals)
    props.numel, props.word = 1_000_000, 2
    props.cfg = RunConfig(method="fo-offload", amp="bf16")
    c = Candidate(4, False, 1.0, 0.25, 100_000)
    for grad in (4, 2):  # fp32 gradients (upcast on the GPU), bf16 (the one-pass CPU AdamW)
        props.perf = PerfInputs(1.0, 1.0, 1.0, 1.0, grad_bytes=grad)
        assert props.parts(c) == sum(device_parts(1_000_000, 2, 12, Split(0.75, 0.25, 0.0),
                                                  100_000, True, grad).values())
    assert fo_memory.QUEUE_BYTES == 1 << 30


def test_plan_through_the_cli_takes_the_placement_a_cap_leaves_room_for(tmp_path):
    """What a user sees: ``plan`` for fo-offload under a cap names the share that fits and
    the GPU memory fits; far below, it is refused with the leanest placement's estimate."""
    import json
    import os
    import subprocess
    import sys

    def cli(gb: float):
        env = {**os.environ, "WORKBENCH_CACHE": str(tmp_path)}
        return subprocess.run(
            [sys.executable, "-m", "workbench", "plan", "--gpu", "h100", "--json", "--set",
             "model=opt-6.7b", "--set", "method=fo-offload", "--set", "amp=bf16", "--set",
             "device=cuda", "--set", "cpu_adamw=torch", "--set", f"gpu_mem_limit_gb={gb}"],
            capture_output=True, text=True, env=env)

    r = cli(22)
    d = json.loads(r.stdout)
    assert d["fits_gpu"] and d["nvml_gpu_mem_bytes"] <= 22e9
    assert any("gpu_mem_limit_gb=22 leaves room for" in n for n in d["notes"])
    assert 0 < d["gpu_breakdown"]["gradients kept for the GPU"] < 5 * GiB  # uncapped: 10+
    low = json.loads(cli(18).stdout)
    assert not low["fits_gpu"] and low["gpu_breakdown"]["gradients kept for the GPU"] == 0
