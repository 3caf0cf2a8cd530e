"""fo-offload's CPU side: subgroups handed to the update worker during the backward pass, the
worker's explicit thread count, and its errors reaching the training thread."""
from __future__ import annotations

import pytest
import torch

from workbench.calibrate.fo import measure
from workbench.config import RunConfig
from workbench.data.batches import SyntheticData
from workbench.engine import build_engine
from workbench.engine.events import EventBus, OpEvent
from workbench.engine.fo import host as fo_host
from workbench.models.build import build_skeleton


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models, 1 thread


def _engine(bus: EventBus | None = None, **knobs):
    cfg = RunConfig(model="tiny-opt", method="fo-offload", lr=1e-2, subgroup_size=6000, **knobs)
    model, source = build_skeleton(cfg.model)
    engine = build_engine(model, source, cfg, torch.device("cpu"), bus or EventBus(),
                          measure=measure)
    return engine, SyntheticData(model.config.vocab_size, 16)


@pytest.mark.parametrize("stride, ratio", [("1000000", 0.0), ("3", 0.2)])
def test_cpu_subgroups_go_to_the_worker_while_backward_runs(stride, ratio):
    engine, data = _engine(update_stride=stride, gpu_resident_ratio=ratio)
    seen: list[tuple[int, int]] = []
    submit = engine.grads.submit  # how the gradient flush hands a subgroup to the host side

    def spy(j, ready):
        seen.append((j, torch._C._current_graph_task_id()))  # -1 outside a backward pass
        submit(j, ready)

    engine.grads.submit = spy
    for t in range(2):
        seen.clear()
        engine.step(data.batch_for_step(t, 4, 0), t, 1e-2, 0.0)
        assert sorted(j for j, _ in seen) == sorted(engine.placement.schedule.cpu)  # each once
        assert all(task != -1 for _, task in seen), seen  # handed over inside backward
        # the order backward completed them in: the head's and last blocks' subgroups first
        assert [j for j, _ in seen][0] > [j for j, _ in seen][-1]
    engine.close()


def test_update_threads_sets_the_workers_team_only():
    events = []
    bus = EventBus()
    bus.subscribe(lambda e: events.append(e) if isinstance(e, OpEvent) else None)
    engine, data = _engine(bus, update_threads=2, update_stride="1000000")
    assert engine.host.threads == 2
    assert engine.host.run(torch.get_num_threads) == 2  # the worker's own team
    assert torch.get_num_threads() == 1  # the caller's is as it was
    engine.step(data.batch_for_step(0, 4, 0), 0, 1e-2, 0.0)
    assert torch.get_num_threads() == 1
    assert {e.detail for e in events if e.op == "cpu-update"} == {"2 threads"}
    engine.close()


def test_default_thread_count_leaves_a_core_for_kernel_launches_on_a_gpu():
    torch.set_num_threads(2)
    assert fo_host.default_threads(cuda=True) == 1
    assert fo_host.default_threads(cuda=False) == 2
    torch.set_num_threads(1)
    assert fo_host.default_threads(cuda=True) == 1


def test_a_failing_cpu_update_fails_the_step(monkeypatch):
    engine, data = _engine(update_stride="1000000")

    def broken(*args):
        raise RuntimeError("host update broke")

    monkeypatch.setattr(fo_host, "adamw", broken)
    with pytest.raises(RuntimeError, match="host update broke"):
        engine.step(data.batch_for_step(0, 4, 0), 0, 1e-2, 0.0)
    engine.close()  # still closes: the worker is idle, the pool shuts down
