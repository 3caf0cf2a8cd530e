"""Snapshots reuse their host buffers: the second one allocates nothing and still holds exactly
the weights of its own step boundary (issue 16, part 6)."""
import pytest
import torch

from workbench.config import RunConfig
from workbench.data.batches import SyntheticData
from workbench.engine import build_engine
from workbench.engine.events import EventBus
from workbench.engine.device.pinned import HostMemory
from workbench.models.build import build_skeleton

from zo_helpers import BASE

VARIANTS = {"mezo": dict(method="mezo"),
            "zo-offload": dict(method="zo-offload"),
            "resident": dict(method="zo-offload", resident_blocks=1),
            "sr": dict(method="zo-offload", master="compressed-sr", codec="bf16"),
            "mirror": dict(method="zo-offload", codec="bf16"),
            "forward-grad": dict(method="forward-grad"),
            # a run that checkpoints allocates (and pages in) its buffers at setup
            "mezo-prepared": dict(method="mezo", checkpoint_every=1),
            "sr-prepared": dict(method="zo-offload", master="compressed-sr", codec="bf16",
                                checkpoint_every=1)}


def _expected(engine) -> list[torch.Tensor]:
    """What a snapshot must hold: each group's weights in the host master's format, taken
    independently of the snapshot path (fp32 state, re-encoded for an SR master)."""
    flats = [f.detach().clone() for f in engine.state_flats()]
    streamer = getattr(engine, "streamer", None)
    if streamer is None:
        return flats
    dtype = streamer.transfer.master_dtype
    return [f if k in (0, len(flats) - 1) or (k - 1) in streamer.resident else f.to(dtype)
            for k, f in enumerate(flats)]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_second_snapshot_allocates_no_host_buffer(variant, monkeypatch):
    allocated = []
    real_empty = HostMemory.empty

    def spy(self, n, dtype=torch.float32):  # every page-locked request goes through here
        allocated.append(n)
        return real_empty(self, n, dtype)

    monkeypatch.setattr(HostMemory, "empty", spy)
    cfg = RunConfig(**VARIANTS[variant], **BASE)
    model, source = build_skeleton(cfg.model)
    engine = build_engine(model, source, cfg, torch.device("cpu"), EventBus())
    data = SyntheticData(model.config.vocab_size, 16)
    at_setup = (len(allocated), engine_bufs(engine).allocations)
    snaps, ptrs, counts = [], [], []
    try:
        for t in range(3):
            engine.step(data.batch_for_step(t, 4, cfg.seed), t, cfg.lr, cfg.weight_decay)
            expected = _expected(engine)
            snap = engine.snapshot(t + 1)()  # the writer thread's call, made here
            # copy out what the writer would have written before the next snapshot reuses it
            snaps.append([f.clone() for f in snap.flats])
            ptrs.append([f.data_ptr() for f in snap.flats])
            counts.append((len(allocated), engine_bufs(engine).allocations))
            for got, want in zip(snap.flats, expected):
                assert got.dtype == want.dtype and torch.equal(got, want)
    finally:
        engine.close()
    if cfg.checkpoint_every:
        assert at_setup[1] > 0 and counts[0] == at_setup  # all at setup, none in a step
    else:
        assert at_setup[1] == 0 and counts[0][1] > 0  # the first snapshot allocated them
    assert counts[1] == counts[0] and counts[2] == counts[0]  # the later ones nothing
    assert ptrs[1] == ptrs[0] == ptrs[2]  # into the very same memory
    # and each snapshot held its own step's weights, not the next one's
    assert not all(torch.equal(a, b) for a, b in zip(snaps[0], snaps[2]))


def engine_bufs(engine):
    return (engine.streamer if hasattr(engine, "streamer") else engine).snapshots.buffers
