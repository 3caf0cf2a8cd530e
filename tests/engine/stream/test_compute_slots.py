"""Compute-dtype block slots (``slot_dtype=compute``): the slot keeps the 2-byte master and the
forward computes from the chain's form, bit-equal to the fp32-slot run (CPU here; the chain
kernel on CUDA in ``tests/engine/test_gpu.py``)."""
from __future__ import annotations

import pytest
import torch

from workbench.config import ConfigError, RunConfig, compute_slots
from workbench.engine.events import EventBus
from zo_helpers import BASE, assert_replay_exact, train

SR = dict(method="zo-offload", codec="bf16", master="compressed-sr", amp="bf16", lr=5e-3,
          weight_decay=0.1)
#: knobs that change what the chain records or when blocks move, each against fp32 slots
VARIANTS = {"tiny-opt": dict(), "unfused": dict(fused_update=False),
            "fresh-buffers-resident": dict(reuse_buffers=False, resident_blocks=1),
            "depth-2": dict(prefetch_depth=2), "nearest": dict(master="compressed")}
#: the rest of the grid (``-m slow``; each also runs on CUDA in test_compute_slots_gpu.py)
SLOW_VARIANTS = {"queries-2": dict(queries=2),
                 "one-sided": dict(queries=3, estimator="one-sided"),
                 "fp16": dict(codec="fp16", amp="fp16"), "tiny-llama": dict(model="tiny-llama")}


@pytest.mark.parametrize("variant", [pytest.param(v, id=k) for k, v in VARIANTS.items()] + [
    pytest.param(v, id=k, marks=pytest.mark.slow) for k, v in SLOW_VARIANTS.items()])
def test_compute_slots_equal_fp32_slots(variant):
    """Losses, projected gradients and the final digest equal the fp32-slot run's, bit for bit,
    and the streamed blocks never held fp32 on the device."""
    cfg = RunConfig(**{**SR, **variant})
    _, d32, out32 = train(cfg.replace(slot_dtype="fp32"), steps=3)
    engine, d16, out16 = train(cfg.replace(slot_dtype="compute"), steps=3)
    assert out16 == out32
    assert d16 == d32
    assert type(engine.streamer.transfer).__name__ == "ComputeSlotTransfer"


def test_evaluation_reads_the_master_through_the_form():
    """A read-only pass (evaluation, generation) sees the unperturbed weights: the final hidden
    states equal the fp32-slot engine's after the same steps."""
    from workbench.engine import build_engine
    from workbench.models.build import build_skeleton

    ids = torch.randint(0, 200, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    hidden = []
    for slots in ("fp32", "compute"):
        cfg = RunConfig(**SR, slot_dtype=slots)
        model, source = build_skeleton(cfg.model)
        engine = build_engine(model, source, cfg, torch.device("cpu"), EventBus())
        from workbench.data.batches import SyntheticData

        data = SyntheticData(model.config.vocab_size, 16)
        for t in range(2):
            engine.step(data.batch_for_step(t, 4, cfg.seed), t, cfg.lr, cfg.weight_decay)
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
            hidden.append(engine.streamed_forward(ids, mask))
        engine.close()
    assert torch.equal(hidden[0], hidden[1])


def test_device_buffers_are_half_the_fp32_slots():
    """Per slot 2 B per parameter (the master as it is), no wires, one work buffer in the
    forward's form; the planner counts exactly these bytes."""
    from workbench.engine import build_engine
    from workbench.models.build import build_skeleton
    from workbench.plan.planner import plan

    cfg = RunConfig(**SR, slot_dtype="compute", data="synthetic")
    model, source = build_skeleton(cfg.model)
    engine = build_engine(model, source, cfg, torch.device("cpu"), EventBus())
    try:
        got = {k: v for k, v in engine.buffer_bytes().items() if v}
        nb = engine.streamer.slot_numel
        form = engine.streamer.transfer.form(engine.streamer.blocks[0].layout)
    finally:
        engine.close()
    assert got["block slots"] == 3 * 2 * nb  # prefetch_depth 1 + 2 spare, bf16
    assert got["work buffer"] == form.nbytes < 4 * nb
    assert "codec wire buffers" not in got
    planned = plan(cfg.replace(device="cuda"), gpu="h200").gpu_breakdown
    assert got == {k: planned[k] for k in got}


@pytest.mark.parametrize("variant", ["compute", pytest.param("compute-unfused",
                                                           marks=pytest.mark.slow)])
def test_replay_through_fp32_slots_is_exact(variant, tmp_path):
    """The checkpoint replay computes in fp32 slots; a run in compute-dtype slots is restored
    to its exact bits between snapshots."""
    knobs = dict(fused_update=False) if variant.endswith("unfused") else {}
    assert_replay_exact(RunConfig(**{**BASE, **SR, "lr": BASE["lr"], "weight_decay":
                                     BASE["weight_decay"]}, slot_dtype="compute", **knobs),
                        tmp_path)


def test_resume_is_exact_and_may_switch_slots(tmp_path):
    """A run resumed from a checkpoint ends with the straight run's digest, also when the
    resumed half runs in the other slot dtype (the knob is resumable: the bits are the same)."""
    from workbench.recipes.train import run

    cfg = RunConfig(**{**BASE, **SR}, steps=8, slot_dtype="compute")
    straight = run(cfg, tmp_path / "straight", progress=False)
    run(cfg.replace(steps=4, checkpoint_every=2), tmp_path / "resumed", progress=False)
    resumed = run(cfg.replace(checkpoint_every=2, slot_dtype="fp32"), tmp_path / "resumed",
                  progress=False, resume=True)
    assert resumed.param_digest == straight.param_digest


def test_auto_chooses_compute_on_a_gpu_only_where_it_applies():
    base = RunConfig(**SR)
    assert compute_slots(base.replace(device="cuda"))
    assert not compute_slots(base)  # auto on the CPU: fp32 (nothing to save there)
    assert not compute_slots(base.replace(device="cuda", zo_optimizer="momentum"))
    assert not compute_slots(base.replace(device="cuda", amp="off"))
    assert not compute_slots(base.replace(device="cuda", queries=2))  # slower there: fp32
    assert compute_slots(base.replace(device="cuda", queries=2, slot_dtype="compute"))
    assert not compute_slots(RunConfig(method="zo-offload", device="cuda"))


def test_compute_where_it_cannot_apply_is_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        RunConfig(method="zo-offload", slot_dtype="compute", zo_optimizer="adam")
    (line,) = err.value.problems
    assert line.startswith("slot_dtype: compute needs master=compressed or compressed-sr")
    assert "amp=bf16 or fp16" in line and "zo_optimizer=sgd" in line
    with pytest.raises(ConfigError, match="slot_dtype: 'compute' does not apply to method=mezo"):
        RunConfig(method="mezo", slot_dtype="compute")


def test_through_the_cli_compute_slots_train_the_same_weights_in_less_memory(tmp_path):
    """What the README says, the way a user meets it: ``run`` with ``slot_dtype=compute`` ends
    with the fp32-slot run's weights; ``plan`` shows the work buffer and fewer GPU bytes, and
    refuses compute where it cannot apply in one line."""
    import json
    import subprocess
    import sys

    common = ["method=zo-offload", "codec=bf16", "master=compressed-sr", "amp=bf16", "steps=3",
              "batch_size=2", "seq_len=16", "eval_samples=8", "data=synthetic", "eval_every=0"]

    def cli(cmd, settings, *extra):
        args = [a for kv in settings for a in ("--set", kv)]
        return subprocess.run([sys.executable, "-m", "workbench", cmd, *extra, *args],
                              capture_output=True, text=True, timeout=300)

    digests = []
    for slots in ("fp32", "compute"):
        r = cli("run", [*common, f"slot_dtype={slots}"], "--out", str(tmp_path / slots),
                "--quiet")
        assert r.returncode == 0, r.stderr
        digests.append(json.loads((tmp_path / slots / "run.json").read_text())["param_digest"])
    assert digests[0] == digests[1] and digests[0]
    gpu = ["device=cuda", "model=opt-1.3b"] + common[:4]
    plans = [cli("plan", [*gpu, f"slot_dtype={s}"], "--gpu", "h100") for s in ("fp32", "compute")]
    assert all(p.returncode == 0 for p in plans), plans[0].stderr
    def gib(out: str, item: str) -> float:
        return float(out.split(item)[1].split("GiB")[0]) if item in out else 0.0

    held = [gib(p.stdout, "block slots") + gib(p.stdout, "codec wire buffers")
            + gib(p.stdout, "work buffer") for p in plans]
    assert "work buffer" in plans[1].stdout and "codec wire buffers" in plans[0].stdout
    assert abs(held[1] / held[0] - 2 / 3) < 0.02  # 3 x 2 B + 2 B against 2 x 4 B + 2 x 2 B
    assert gib(plans[1].stdout, "torch peak") < gib(plans[0].stdout, "torch peak")
    r = cli("plan", ["method=zo-offload", "slot_dtype=compute"])
    assert r.returncode == 2
    assert [l for l in r.stderr.splitlines() if l.strip()] == [
        "error: slot_dtype: compute needs master=compressed or compressed-sr (this run has "
        "master=fp32) and amp=bf16 or fp16 (this run has amp=off); use slot_dtype=fp32 or auto"]
