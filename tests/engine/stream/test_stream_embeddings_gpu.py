"""stream_embeddings and block_slots on CUDA, three streams: MeZO's bits with the fp32 transfer,
the fp32-slot run's with compute-dtype slots (the span kernel filling the embedding's rows),
and two slots per transfer kind ending as one stream does (no race: an upload waits for the
offload of its slot's last unit)."""
from __future__ import annotations

import pytest
import torch

from workbench.config import RunConfig
from workbench.engine.groups import Entry, GroupLayout
from workbench.engine.zo.chain import ChainRunner, replay_fp32
from workbench.engine.zo.perturb import PendingUpdate, ZOOps
from workbench.engine.zo.step import shift
from zo_helpers import train

pytestmark = pytest.mark.gpu
PLAIN = dict(model="tiny-llama", lr=5e-3, weight_decay=0.1, device="cuda")
ROWS = dict(PLAIN, method="zo-offload", codec="bf16", master="compressed-sr", amp="bf16",
            stream_embeddings=True, batch_size=2, seq_len=8, max_new_tokens=1)
#: (overlap, reuse_buffers, fused_update, resident_blocks, prefetch_depth, block_slots)
KNOBS = [(True, True, True, 0, 1, "auto"), (True, True, True, 0, 1, 2),
         (False, True, True, 0, 1, "auto"), (True, False, True, 0, 1, "auto"),
         (True, True, False, 0, 1, 2), (True, True, True, 2, 2, 3), (True, False, False, 4, 1, 2)]


@pytest.fixture(scope="module")
def mezo():
    return train(RunConfig(method="mezo", **PLAIN), steps=6)[1:]


@pytest.mark.parametrize("overlap, reuse, fused, resident, depth, slots", KNOBS)
def test_streamed_embeddings_equal_mezo_on_cuda(mezo, overlap, reuse, fused, resident, depth,
                                                slots):
    cfg = RunConfig(method="zo-offload", stream_embeddings=True, overlap=overlap,
                    reuse_buffers=reuse, fused_update=fused, resident_blocks=resident,
                    prefetch_depth=depth, block_slots=slots, **PLAIN)
    assert train(cfg, steps=6)[1:] == mezo


@pytest.mark.parametrize("variant", [dict(), dict(seq_len=64), dict(block_slots=2),
                                     dict(fused_update=False), dict(overlap=False),
                                     dict(prefetch_depth=2, reuse_buffers=False),
                                     dict(resident_blocks=2, block_slots=2),
                                     dict(master="compressed"), dict(codec="fp16", amp="fp16"),
                                     dict(queries=2), dict(rng="torch")])
def test_compute_slots_with_streamed_embeddings_equal_fp32_slots_on_cuda(variant):
    cfg = RunConfig(**{**ROWS, **variant})
    _, d32, out32 = train(cfg.replace(slot_dtype="fp32"), steps=4)
    engine, d16, out16 = train(cfg.replace(slot_dtype="compute"), steps=4)
    assert type(engine.streamer.transfer).__name__ == "ComputeSlotTransfer"
    assert engine.streamer.transfer.rows.whole == (cfg.seq_len == 64)
    assert (d16, out16) == (d32, out32)


@pytest.mark.parametrize("transfer", [
    dict(), dict(codec="bf16"), dict(codec="bf16", master="compressed-sr"),
    dict(codec="bf16", master="compressed-sr", amp="bf16", slot_dtype="compute"),
    dict(codec="bf16", master="compressed-sr", amp="bf16", slot_dtype="compute",
         stream_embeddings=True)])
@pytest.mark.parametrize("depth", [1, 2])
def test_fewest_block_slots_are_race_free(transfer, depth):
    """block_slots = prefetch_depth + 1 on three streams ends with the one-stream run's digest
    and losses, and the default slot count's (batches long enough for the streams to race)."""
    cfg = RunConfig(**{**PLAIN, "method": "zo-offload", "prefetch_depth": depth, **transfer})
    one = train(cfg.replace(overlap=False, block_slots=depth + 1), steps=5, batch_size=16)[1:]
    assert train(cfg.replace(block_slots=depth + 1), steps=5, batch_size=16)[1:] == one
    assert train(cfg, steps=5, batch_size=16)[1:] == one


def test_span_kernel_equals_the_fp32_path_row_by_row():
    """Every prefix of a visit's operations: the rows the span kernel fills equal the fp32
    Triton path's values of those rows (repeated and out-of-order rows too)."""
    dev = torch.device("cuda")
    ops = ZOOps("philox", dev)
    V, D, P = 50_003, 64, 64
    n = V * D + P
    lay = GroupLayout("embed", [Entry("tok", (), (V, D), 0, V * D),
                                Entry("norm", (), (P,), V * D, P)], n, V * D)
    master = (torch.randn(n, device=dev) * 0.02).to(torch.bfloat16)
    upd = PendingUpdate(11, torch.tensor([0.7, -1.3], device=dev), 1e-3, 0.1)
    chain = [("update", upd), ("perturb", 5, 1e-3), ("perturb", 5, -2e-3),
             ("update", shift(ops, 5, 1e-3))]
    runner = ChainRunner(ops, "bf16", True, torch.bfloat16)
    assert runner.kernel is not None
    ids = torch.randint(0, V, (8, 33), device=dev)
    ids[0, :3] = torch.tensor([V - 1, 0, V - 1])
    for k in range(len(chain) + 1):
        rows, tail = torch.empty(ids.numel() * D, device=dev), torch.empty(P, device=dev)
        runner.fill_spans(master, lay, chain[:k], [
            (ids.reshape(-1) * D, D, rows),
            (torch.tensor([V * D], device=dev), P, tail)])
        want = replay_fp32(ops, master, lay, chain[:k])
        assert torch.equal(rows.view(-1, D), want[:V * D].view(V, D)[ids.reshape(-1)]), k
        assert torch.equal(tail, want[V * D:]), k


@pytest.mark.parametrize("variant", [dict(), dict(slot_dtype="fp32"), dict(
    codec="fp32", master="fp32", amp="off", slot_dtype="auto")])
def test_steady_steps_never_sync_and_compile_nothing(variant):
    """Under sync debug mode "error" (``test_host_sync.py``): the row fill's ids, compact
    indices and span starts stay on the device; ``warm_kernels`` compiled the span kernel."""
    from test_host_sync import _batch, _compiled, _steps_without_sync

    from workbench.engine import build_engine
    from workbench.engine.codecs import sr_kernel
    from workbench.engine.zo import chain_kernel, kernels
    from workbench.engine.events import EventBus
    from workbench.engine.warmup import warm_kernels
    from workbench.models.build import build_skeleton

    cfg = RunConfig(**{**ROWS, "slot_dtype": "compute", **variant})
    skeleton, source = build_skeleton(cfg.model)
    engine = build_engine(skeleton, source, cfg, torch.device("cuda"), EventBus())
    try:
        assert warm_kernels(engine) > 0
        every = (kernels.zo_kernel, kernels.normals_kernel, sr_kernel.sr_kernel,
                 chain_kernel.chain_kernel, chain_kernel.span_kernel)
        compiled = _compiled(kernels=every)
        for t in range(2):
            engine.step(_batch(260, t, padded=t == 1, device="cuda"), t, 1e-3, 0.0)
        assert compiled is None or _compiled(kernels=every) == compiled
        _steps_without_sync(engine, 260)
    finally:
        engine.close()
