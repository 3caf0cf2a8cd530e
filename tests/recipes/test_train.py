"""The training recipe in process: a run that cannot fit is refused first; force overrides."""
from __future__ import annotations

import types

import psutil
import pytest

from workbench.config import RunConfig
from workbench.plan.fit import PlanError
from workbench.recipes.train import run

TINY = dict(model="tiny-opt", data="synthetic", steps=3, batch_size=2, seq_len=8, sample_hz=0.0)


def test_a_run_that_cannot_fit_is_refused_before_anything_and_force_overrides(tmp_path,
                                                                               monkeypatch):
    vm = psutil.virtual_memory()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: vm._replace(available=256 << 20))
    monkeypatch.setattr(psutil.Process, "memory_info",
                        lambda self: types.SimpleNamespace(rss=256 << 20))
    cfg = RunConfig(**TINY)
    with pytest.raises(PlanError, match=r"host memory: mezo on tiny-opt needs .* short by"):
        run(cfg, tmp_path / "r", progress=False)
    assert not (tmp_path / "r").exists()  # refused before anything was written
    rec = run(cfg, tmp_path / "r", progress=False, force=True)
    assert rec.status == "done" and len(rec.steps) == 3


def test_a_run_that_cannot_fit_is_refused_before_its_tokenizer_is_read(tmp_path, monkeypatch):
    """The fit check is arithmetic; the tokenizer may need the Hub (minutes of retries offline),
    so a too-big run with real data is refused without touching it."""
    import workbench.recipes.inputs as train_mod  # where the run reads its inputs

    def no_tokenizer(*_):
        raise AssertionError("the tokenizer was read before the fit check")

    monkeypatch.setattr(train_mod, "load_tokenizer", no_tokenizer)
    cfg = RunConfig(model="opt-175b", method="zo-offload", data="embedded", steps=3,
                    data_dir=str(tmp_path / "empty"), sample_hz=0.0)
    with pytest.raises(PlanError, match=r"host memory: zo-offload on opt-175b needs"):
        run(cfg, tmp_path / "r", progress=False)
    assert not (tmp_path / "r").exists()


def test_a_run_records_its_plan_when_it_starts(tmp_path):
    """run.json holds the plan made at the start (what the figures draw), equal to planning
    the run's own settings; a forced run records it too."""
    from workbench.plan.planner import plan
    from workbench.telemetry.record import RunRecord

    cfg = RunConfig(**TINY)
    run(cfg, tmp_path / "r", progress=False)
    saved = RunRecord.load(tmp_path / "r", telemetry=False).info["plan"]
    want = plan(cfg).to_dict()
    keep = ("params", "peak_gpu_mem_bytes", "pinned_host_bytes", "h2d_bytes_per_step",
            "tokens_per_step", "step_seconds", "host_breakdown")
    assert {k: saved[k] for k in keep} == {k: want[k] for k in keep}
    assert saved["method"] == "mezo" and saved["model"] == "tiny-opt"
