"""The planner's stream_embeddings and block_slots: the engine's own device buffers, host masters
and PCIe bytes, byte for byte (tiny models built on the CPU), and llama-3.1-405b fitting a 24 GB
cap on an H100."""
from __future__ import annotations

import pytest
import torch

from workbench.config import RunConfig, compute_slots
from workbench.engine import build_engine
from workbench.engine.events import EventBus
from workbench.models.build import build_skeleton
from workbench.plan.planner import GiB, plan
from workbench.plan.memory import ends_work_bytes
from workbench.presets import PRESETS

SR = dict(codec="bf16", master="compressed-sr", amp="bf16")


def cfg_(**kw) -> RunConfig:
    base = dict(device="cuda", data="synthetic", batch_size=16, seq_len=128,
                method="zo-offload", model="tiny-llama")
    return RunConfig(**{**base, **kw})


def _engine(cfg: RunConfig):
    """The engine the GPU run would build, on the CPU (compute-dtype slots where the GPU's
    auto would choose them)."""
    skeleton, source = build_skeleton(cfg.model)
    on_cpu = cfg.replace(device="cpu", slot_dtype="compute" if compute_slots(cfg) else "fp32")
    return build_engine(skeleton, source, on_cpu, torch.device("cpu"), EventBus())


@pytest.mark.parametrize("knobs", [
    dict(stream_embeddings=True), dict(stream_embeddings=True, block_slots=2),
    dict(stream_embeddings=True, resident_blocks=4), dict(stream_embeddings=True, **SR),
    dict(stream_embeddings=True, block_slots=2, **SR),
    dict(stream_embeddings=True, block_slots=3, seq_len=8, batch_size=2, max_new_tokens=1, **SR),
    dict(stream_embeddings=True, codec="bf16", master="compressed-sr"),
    dict(stream_embeddings=True, codec="bf16", block_slots=2),
    dict(stream_embeddings=True, zo_optimizer="momentum", block_slots=2),
    dict(block_slots=2), dict(block_slots=4, codec="bf16", model="tiny-opt"),
    dict(block_slots=2, peft="lora", base_codec="int8", model="tiny-opt")])
def test_planned_device_buffers_are_the_engines_own(knobs, assert_planned):
    cfg = cfg_(**knobs)
    engine = _engine(cfg)
    try:
        actual = {k: v for k, v in engine.buffer_bytes().items() if v}
        n_slots = engine.streamer.n_slots
    finally:
        engine.close()
    assert_planned(actual, cfg)
    assert n_slots == knobs.get("block_slots", n_slots)
    if cfg.stream_embeddings:
        assert "embedding + head" not in actual


@pytest.mark.parametrize("rows", [dict(seq_len=8, batch_size=2, max_new_tokens=1), dict()])
def test_the_work_buffer_forms_are_the_engines(rows):
    """The head's form and the embedding's row form (rows, or the whole table) as planned."""
    cfg = cfg_(stream_embeddings=True, **SR, **rows)
    engine = _engine(cfg)
    tr, s = engine.streamer.transfer, engine.streamer
    try:
        got = (tr.form(s.head.layout).nbytes, tr.rows.nbytes)
    finally:
        engine.close()
    assert got == ends_work_bytes(cfg, PRESETS[cfg.model])
    assert got[1] == 4 * 64 * (144 if rows else 260)


@pytest.mark.parametrize("knobs", [dict(), dict(codec="bf16", master="compressed-sr"),
                                   dict(slot_dtype="compute", **SR), dict(codec="bf16")])
def test_host_masters_and_pcie_bytes_are_the_engines(knobs):
    """Host bytes of the streamed units and the bytes a step moves each way."""
    from workbench.data.batches import SyntheticData

    cfg = cfg_(device="cpu", stream_embeddings=True, **knobs)
    engine = _engine(cfg.replace(device="cuda"))
    data = SyntheticData(260, 16)
    try:
        host = engine.host_report()["streamed_bytes"]
        moved = []
        for t in range(3):
            engine.step(data.batch_for_step(t, 4, 0), t, 1e-3, 0.0)
            moved.append((engine.bytes_h2d, engine.bytes_d2h))
    finally:
        engine.close()
    pl = plan(cfg, calibration={"host_mem_available_bytes": 125 * GiB})
    masters = {k: v for k, v in pl.host_breakdown.items()
               if k.startswith("block masters") or "mirrors" in k}
    assert host == sum(masters.values())
    per_step = (moved[2][0] - moved[1][0], moved[2][1] - moved[1][1])
    assert per_step == (pl.h2d_bytes_per_step, pl.d2h_bytes_per_step)


#: the issue's run: full-parameter zo-offload, bf16 on the wire, a bf16 master rounded
#: stochastically, bf16 autocast, compute-dtype slots, a 24 GB cap
BIG = dict(method="zo-offload", codec="bf16", master="compressed-sr", amp="bf16",
           slot_dtype="compute", gpu_mem_limit_gb=24, device="cuda")


def test_llama_405b_fits_24_gb_on_an_h100_with_streamed_embeddings():
    resident = plan(RunConfig(model="llama-3.1-405b", **BIG), gpu="h100")
    streamed = plan(RunConfig(model="llama-3.1-405b", stream_embeddings=True, block_slots=2,
                              **BIG), gpu="h100")
    assert not resident.fits_gpu and streamed.fits_gpu
    assert streamed.nvml_gpu_mem_bytes < 20 * GiB < streamed.gpu_mem_available_bytes
    parts, p = streamed.gpu_breakdown, PRESETS["llama-3.1-405b"]
    assert parts["embedding + head"] == 0
    assert parts["block slots"] == 2 * 2 * p.block_params()  # bf16 blocks > embedding, head
    assert parts["activations"] < 1 * GiB  # no autocast copy of the 2.1 B head weight
    # every pass also moves the embedding and head (bf16) each way
    extra = 2 * (p.embed_params() + p.head_params())
    assert streamed.h2d_bytes_per_step - resident.h2d_bytes_per_step == extra


def test_deepseek_v3_does_not_fit_its_block_alone_is_too_large():
    pl = plan(RunConfig(model="deepseek-v3", stream_embeddings=True, block_slots=2, **BIG),
              gpu="h100")
    assert not pl.fits_gpu
    assert pl.gpu_breakdown["work buffer"] > 21 * GiB  # one MoE block's bf16 form


def test_the_advice_names_both_knobs_where_only_both_fit():
    """No single knob fits the 405b run: the refusal says what each gives and that the two
    together fit."""
    from workbench.plan.fit import PlanError, check_fits

    with pytest.raises(PlanError) as err:
        check_fits(RunConfig(model="llama-3.1-405b", **BIG), gpu="h100",
                   calibration={"host_mem_available_bytes": 2048 * GiB})
    text = str(err.value)
    assert "stream_embeddings=true streams the embedding and head (25.1 GiB)" in text
    assert "stream_embeddings=true block_slots=2 (19.2 GiB, fits)" in text
    with pytest.raises(PlanError) as err:  # a tied head: the knob is not offered
        check_fits(RunConfig(model="opt-175b", **{**BIG, "gpu_mem_limit_gb": 10}), gpu="h100",
                   calibration={"host_mem_available_bytes": 2048 * GiB})
    assert "stream_embeddings" not in str(err.value)


def test_fewer_slots_than_the_transfer_keeps_take_turns_on_the_link():
    """block_slots below prefetch_depth + the transfer's spare slots: each slot computes, goes
    down and comes up in turn, so a unit takes at least (compute + up alone + down alone) /
    slots. llama-3.1-8b, compute slots, streamed ends, 8 x 128 on the H100 table: 0.41 s with
    the default 3 slots, 0.50 s with 2 (measured on an H100: 0.402 and 0.458 s,
    benchmarks/results/compute_slots-llama8b-streamed*-2026-11-27.json)."""
    knobs = dict(model="llama-3.1-8b", stream_embeddings=True, slot_dtype="compute",
                 batch_size=8, **SR)
    three, two = (plan(cfg_(**knobs, block_slots=n), gpu="h100") for n in ("auto", 2))
    assert two.step_seconds > 1.15 * three.step_seconds
    assert two.step_seconds == pytest.approx(0.495, abs=0.01)
    assert three.step_seconds == pytest.approx(0.407, abs=0.01)
    assert two.gpu_breakdown["block slots"] * 3 == three.gpu_breakdown["block slots"] * 2
