"""End-of-run and checkpoint paths hold at most one parameter group at a time on the host
(issue 21, part 0): the save's digest and norm and the ranks' quick digest (streamed blocks read
by piece: not even one decoded block), and a resume from a checkpoint (one group).

Peak host bytes are measured with the torch profiler (every CPU allocation and free, in order)
and tracemalloc (Python / numpy buffers, e.g. a ``tobytes`` copy, the digest threads' fp64
buffers), on a small OPT with 12 blocks streamed from bf16 host masters (compressed-sr): the
whole model decoded to fp32 is 14 groups, one group is one block (437 KiB), hashed in 55 pieces
by 3 threads.
"""
from __future__ import annotations

import hashlib
import tracemalloc

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from workbench import distributed
from workbench.config import RunConfig
from workbench.engine import groups
from workbench.engine.checkpoint import latest_checkpoint, read_checkpoint
from workbench.presets import PRESETS, Preset
from workbench.recipes.train import TrainRecipe

DEEP = Preset("opt", 96, 12, 4, 384, 260, 512, "byte")  # 12 blocks of 0.11 M parameters
PIECE = 2048  # elements hashed at once in these tests (a block is 55 pieces)
THREADS = 3


def tree_digest(flats) -> str:
    """The digest's definition, computed here: SHA-256 over the SHA-256 digests of
    ``PIECE``-element slices of each group's fp32 bytes (copied to bytes: the eager way)."""
    leaves = []
    for flat in flats:
        data = flat.numpy().tobytes()
        leaves += [hashlib.sha256(data[i:i + 4 * PIECE]).digest()
                   for i in range(0, len(data), 4 * PIECE)]
    return hashlib.sha256(b"".join(leaves)).hexdigest()


def peak_bytes(fn) -> tuple[int, int]:
    """(torch CPU peak, Python peak) bytes allocated on top of what lived before ``fn``."""
    tracemalloc.start()
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
        py_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    live = top = 0
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += e.self_cpu_memory_usage  # + allocations, - frees, in time order
        top = max(top, live)
    return top, py_peak


@pytest.fixture
def trained(tmp_path, monkeypatch):
    monkeypatch.setitem(PRESETS, "deep-opt", DEEP)
    monkeypatch.setattr(groups, "PIECE", PIECE)  # several pieces per block, hashed at once
    monkeypatch.setattr(groups, "default_threads", lambda: THREADS)  # parallel on 2 cores too
    cfg = RunConfig(model="deep-opt", method="zo-offload", device="cpu", data="synthetic",
                    batch_size=2, seq_len=8, steps=2, codec="bf16", master="compressed-sr", rng="torch",
                    sample_hz=0, eval_samples=0, checkpoint_every=1, lr=1e-3)
    recipe = TrainRecipe(cfg, tmp_path / "run", progress=False)
    recipe.setup()
    recipe.train()
    yield recipe
    recipe.cleanup()


def test_save_decodes_one_block_at_a_time(trained):
    lays = trained.engine.group_layouts()
    group = max(lay.nbytes for lay in lays)  # fp32 bytes of the largest group
    model = sum(lay.nbytes for lay in lays)
    assert model > 10 * group  # the bound below separates "one group" from "the model"
    # Independent reference: every group decoded at once, hashed here piece by piece.
    eager = [f.clone() for f in trained.engine.state_flats()]
    want = tree_digest(eager)
    assert sum(-(-f.numel() // PIECE) for f in eager) > 40 * len(eager)  # many pieces each
    want_norm = float(torch.cat(eager).double().pow(2).sum()) ** 0.5
    # The probe sees the eager way: the whole model at once (so the bound below can fail).
    assert peak_bytes(lambda: [f.clone() for f in trained.engine.state_flats()])[0] >= model
    trained.out_dir = None  # the run.json / trace writers' Python heap is not the digest's:
    trained.session = None  # (the run directory's session writes them; it is still closed)
    torch_peak, py_peak = peak_bytes(trained.save)
    rec = trained.record
    assert rec.param_digest == want and rec.param_norm == pytest.approx(want_norm, rel=1e-12)
    # No decoded block at all: each streamed block is read a piece at a time into buffers
    # reused from block to block (``PieceReader``), so torch allocates nothing block-sized.
    assert torch_peak < group / 4, (torch_peak, group, model)
    # The probe sees the piece buffers (threads + 1 of 8 KiB), the threads' fp64 cast buffers
    # (einsum's: 3 x 32 KiB here), and no bytes copy of a group on the Python heap.
    assert 2 * 8 * PIECE < py_peak < group / 2, (py_peak, group)


def test_rank_digest_check_decodes_only_its_samples(trained):
    """The ranks' in-sync check widens only every 1021st element of a bf16 block: no decoded
    block (decoding opt-6.7b whole stalled 2-GPU bf16-SR runs ~14 s at each check)."""
    group = max(lay.nbytes for lay in trained.engine.group_layouts())
    found = []
    torch_peak, _ = peak_bytes(lambda: found.append(
        distributed.quick_digest(trained.engine.state_flats())))
    assert torch_peak < group / 100, (torch_peak, group)
    assert found[0] == tree_digest(f.clone()[::1021] for f in trained.engine.state_flats())


def test_resume_reads_one_group_at_a_time(trained):
    engine, root = trained.engine, trained.out_dir / "checkpoints"
    trained.checkpointer.wait()
    path = latest_checkpoint(root)
    lays = engine.group_layouts()
    snap = read_checkpoint(path, [l.name for l in lays], [l.numel for l in lays])
    assert isinstance(snap.flats, groups.LazyFlats)  # nothing read yet
    group = max(lay.nbytes for lay in lays)
    torch_peak, _ = peak_bytes(lambda: engine.restore(snap))
    # The profiler counts safetensors' file mapping of a shard (read-only, file-backed: only
    # the pages of the group read become resident) plus one group as fp32; loading every
    # group first, as before, holds the whole model in fp32 (> model).
    shard = max(f.stat().st_size for f in path.glob("*.safetensors"))
    model = sum(lay.nbytes for lay in lays)
    assert torch_peak < shard + 1.5 * group < model
    got = groups.digest(engine.state_flats())
    assert got == tree_digest(snap.flats)  # the restored weights are the checkpoint's
