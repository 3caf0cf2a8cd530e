"""Telemetry's cost bounded per step: above SPAN_LIMIT subgroups, one span per phase."""
from __future__ import annotations

import re
from collections import Counter, defaultdict

import pytest

from workbench.config import RunConfig
from workbench.engine.events import EventBus, OpEvent
from workbench.engine.fo import spans
from workbench.engine.fo.spans import PER_SUBGROUP, PHASE

from test_fo import _engine, one_thread  # noqa: F401 (autouse fixture)

STEPS = 3


def _events(size: int, stride: str = "2") -> tuple[list[OpEvent], int]:
    """Every OpEvent of STEPS steps at ``size``, and the subgroup count."""
    got: list[OpEvent] = []
    bus = EventBus()
    bus.subscribe(lambda e: got.append(e) if isinstance(e, OpEvent) else None)
    cfg = RunConfig(model="tiny-opt", method="fo-offload", subgroup_size=size,
                    update_stride=stride, gpu_resident_ratio=0.1, lr=1e-3)
    engine, data = _engine(cfg, bus)
    for t in range(STEPS):
        engine.step(data.batch_for_step(t, 4, 0), t, 1e-3, 0.0)
    count = engine.flat.groups.count
    engine.close()
    return got, count


def _per_step(events: list[OpEvent]) -> Counter:
    return Counter(e.step for e in events if e.op in PER_SUBGROUP)


def test_spans_per_step_are_bounded_whatever_the_subgroup_count():
    few, n_few = _events(2048)
    many, n_many = _events(1024)
    assert n_few > spans.SPAN_LIMIT and n_many > 2 * n_few - 2  # both merged, one twice as cut
    for events in (few, many):
        per_step = _per_step(events)
        assert set(per_step) == set(range(STEPS))
        assert max(per_step.values()) <= len(PER_SUBGROUP)  # one span per phase at most
        assert all(e.block == PHASE for e in events if e.op in PER_SUBGROUP)
        assert {"cpu-update", "upload-weights", "gpu-update", "prefetch", "flush-out",
                "grad-d2h"} <= {e.op for e in events}
    assert _per_step(few) == _per_step(many)  # the same phases, however finely cut
    # spans of the other operations still come one per block
    assert Counter(e.op for e in many if e.op == "forward")["forward"] >= STEPS * 3


@pytest.mark.parametrize("stride", ["2", "1000000"])
def test_a_phase_sums_its_subgroups(monkeypatch, stride):
    """The same run with merging and without: each phase's bytes are the sum of its subgroups'
    spans, it says how many it covers, it spans them all (host clock), and its busy time is at
    most its extent."""
    merged, n = _events(1024, stride)
    monkeypatch.setattr(spans, "SPAN_LIMIT", 10**9)
    fine, _ = _events(1024, stride)
    per_op: dict = defaultdict(lambda: [0, 0])
    for e in fine:
        if e.op in PER_SUBGROUP:
            assert e.block >= 0  # not merged: one span per subgroup
            per_op[e.step, e.op][0] += e.nbytes
            per_op[e.step, e.op][1] += 1
    phases = {(e.step, e.op): e for e in merged if e.op in PER_SUBGROUP}
    assert set(phases) == set(per_op)
    for key, e in phases.items():
        nbytes, count = per_op[key]
        assert e.nbytes == nbytes
        assert int(re.search(r"(\d+) subgroups", e.detail).group(1)) == count
        busy = float(re.search(r"([\d.]+) s busy", e.detail).group(1))
        assert 0 <= busy <= e.end - e.start + 1e-6
    if stride == "1000000":  # all but the 10% residents on the CPU side
        assert all(per_op[t, "cpu-update"][1] == n - int(0.1 * n) for t in range(STEPS))
        assert all("thread" in phases[t, "cpu-update"].detail for t in range(STEPS))
