"""Compute-dtype block slots on CUDA: the chain kernel against the fp32 path's own kernels,
and whole runs bit-equal to fp32 slots under each scheduler knob."""
from __future__ import annotations

import pytest
import torch

from workbench.config import RunConfig
from workbench.engine.codecs.frozen_form import FrozenForm
from workbench.engine.codecs.wire import get_codec
from workbench.engine.groups import Entry, GroupLayout
from workbench.engine.zo.chain import ChainRunner, replay_fp32
from workbench.engine.zo.perturb import PendingUpdate, ZOOps
from workbench.engine.zo.step import shift
from zo_helpers import train

pytestmark = pytest.mark.gpu
SR = dict(method="zo-offload", codec="bf16", master="compressed-sr", amp="bf16", lr=5e-3,
          weight_decay=0.1, device="cuda")


def _layout(n_mat: int, n: int) -> GroupLayout:
    entries = [Entry("w", (), (n_mat,), 0, n_mat), Entry("b", (), (n - n_mat,), n_mat, n - n_mat)]
    return GroupLayout("block.3", entries, n, n_mat)


@pytest.mark.parametrize("half, sr", [("bf16", True), ("fp16", False)])
def test_chain_kernel_equals_the_fp32_kernels_step_by_step(half, sr):
    """Every prefix of a visit's operations (a two-direction update, perturbations, a restore
    fused as an update): the form equals the fp32 Triton path's value cast as autocast casts
    it, and the last write equals that value encoded as the SR transfer encodes it."""
    dev = torch.device("cuda")
    ops = ZOOps("philox", dev)
    n, n_mat = 1_000_003, 999_000
    lay = _layout(n_mat, n)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[half]
    master = (torch.randn(n, device=dev) * 0.02).to(dtype)
    upd = PendingUpdate(11, torch.tensor([0.7, -1.3], device=dev), 1e-3, 0.1)
    chain = [("update", upd), ("perturb", 5, 1e-3), ("perturb", 5, -2e-3),
             ("update", shift(ops, 5, 1e-3)), ("perturb", 9, 1e-3), ("perturb", 9, -2e-3),
             ("perturb", 9, 1e-3)]
    runner = ChainRunner(ops, half, sr, torch.bfloat16)
    form = FrozenForm(lay, torch.bfloat16)
    buf = form.empty(dev)
    for k in range(1, len(chain) + 1):
        runner.fill_form(master, lay, chain[:k], form, buf)
        want = replay_fp32(ops, master, lay, chain[:k])
        mats, tail = form.parts(buf)
        assert torch.equal(mats, want[:n_mat].to(torch.bfloat16)), k
        assert torch.equal(tail, want[n_mat:]), k
    want = replay_fp32(ops, master, lay, chain)
    expect = torch.empty(2 * n, dtype=torch.uint8, device=dev)
    get_codec(half).encode(want, expect, sr_seed=1234 if sr else None)
    runner.write_master(master, lay, chain, 1234)
    assert torch.equal(master.view(torch.uint8), expect)


KNOBS = [(True, True, True, 0), (False, True, True, 0), (True, False, True, 0),
         (True, True, False, 0), (True, True, True, 2), (True, False, False, 4)]


@pytest.mark.parametrize("model", ["tiny-opt", "tiny-llama"])
@pytest.mark.parametrize("overlap, reuse, fused, resident", KNOBS)
def test_compute_slots_equal_fp32_slots_on_cuda(model, overlap, reuse, fused, resident):
    cfg = RunConfig(**SR, model=model, overlap=overlap, reuse_buffers=reuse,
                    fused_update=fused, resident_blocks=resident)
    _, d32, out32 = train(cfg.replace(slot_dtype="fp32"), steps=4)
    engine, d16, out16 = train(cfg.replace(slot_dtype="auto"), steps=4)  # auto: compute here
    assert type(engine.streamer.transfer).__name__ == "ComputeSlotTransfer"
    assert (d16, out16) == (d32, out32)


@pytest.mark.parametrize("variant", [dict(queries=3), dict(queries=3, estimator="one-sided"),
                                     dict(master="compressed"), dict(codec="fp16", amp="fp16"),
                                     dict(rng="torch")])
def test_compute_slots_variants_on_cuda(variant):
    cfg = RunConfig(**{**SR, **variant}, model="tiny-llama")
    _, d32, out32 = train(cfg.replace(slot_dtype="fp32"), steps=4)
    _, d16, out16 = train(cfg.replace(slot_dtype="compute"), steps=4)
    assert (d16, out16) == (d32, out32)


def test_no_block_sized_allocation_inside_compute_slot_steps():
    from test_gpu import _allocations_inside_steps

    big, grown, before, after = _allocations_inside_steps(reuse_buffers=True, **SR)
    assert not big, f"block-sized allocations inside steps: {big}"
    assert after["num_device_alloc"] == before["num_device_alloc"], grown
