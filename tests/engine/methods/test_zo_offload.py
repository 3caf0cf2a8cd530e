"""zo-offload equals MeZO bit for bit, for every scheduler knob."""
import pytest
import torch

from workbench.config import RunConfig
from workbench.engine.events import EventBus, OpEvent
from workbench.engine.device.streams import Streams
from workbench.presets import PRESETS

from zo_helpers import CPU_KNOBS, assert_offload_equals_mezo, mezo_reference, train


@pytest.fixture(scope="module", params=["tiny-opt", "tiny-llama"])
def reference(request):
    return mezo_reference(request.param)


@pytest.mark.parametrize("reuse, fused, resident", CPU_KNOBS)
def test_offload_equals_mezo(reference, reuse, fused, resident):
    assert_offload_equals_mezo(reference, True, reuse, fused, resident)


def test_overlap_is_a_cuda_knob():
    """Why the CPU grid leaves ``overlap`` out: on a CPU there are no streams to overlap on
    (the GPU grid in test_gpu.py covers both values)."""
    for overlap in (True, False):
        s = Streams(torch.device("cpu"), overlap)
        assert s.compute is s.upload is s.offload is None


@pytest.mark.parametrize("depth", [1, 3])
def test_prefetch_depth_keeps_equality(reference, depth):
    cfg, (ref_digest, _) = reference
    _, d, _ = train(cfg.replace(method="zo-offload", prefetch_depth=depth))
    assert d == ref_digest


@pytest.mark.parametrize("fused, factor", [(True, 1), (False, 2)])
def test_bytes_per_step_match_block_bytes(fused, factor):
    cfg = RunConfig(model="tiny-opt", method="zo-offload", fused_update=fused, resident_blocks=1)
    engine, _, _ = train(cfg, steps=4)
    preset = PRESETS["tiny-opt"]
    streamed = (preset.num_layers - 1) * preset.block_params() * 4
    # train() flushes once at the end: that pass is one more round trip when fused.
    extra = streamed if fused else 0
    assert engine.bytes_h2d == 4 * factor * streamed + extra
    assert engine.bytes_d2h == engine.bytes_h2d


def test_events_cover_every_block_in_schedule_order():
    events = []
    bus = EventBus()
    bus.subscribe(lambda e: events.append(e) if isinstance(e, OpEvent) else None)
    cfg = RunConfig(model="tiny-opt", method="zo-offload")
    train(cfg, steps=3, bus=bus)
    n = PRESETS["tiny-opt"].num_layers
    for step in range(3):
        for block in range(n):
            ops = [e for e in events if e.step == step and e.block == block]
            kinds = [e.op for e in ops]
            assert kinds.count("upload") == 1 and kinds.count("offload") == 1
            up, comp, off = (next(e for e in ops if e.op == k) for k in ("upload", "compute", "offload"))
            assert up.end <= comp.start and comp.end <= off.start  # upload -> compute -> offload
        # block i+1's upload is issued before block i computes (prefetch)
        for block in range(n - 1):
            nxt = next(e for e in events if e.step == step and e.block == block + 1 and e.op == "upload")
            cur = next(e for e in events if e.step == step and e.block == block and e.op == "compute")
            assert nxt.start <= cur.start


@pytest.mark.parametrize("amp", ["bf16", "off"])
def test_tied_head_copy_keeps_equality_under_amp(amp):
    """The tied LM head reads a copy of the weight at p in its own compute dtype (bf16 under
    amp: half the memory of an fp32 copy, and no autocast cast in the head); losses and weights
    still equal MeZO's under autocast, bit for bit."""
    from workbench.engine import build_engine
    from workbench.models.build import build_skeleton

    cfg = RunConfig(model="tiny-opt", method="mezo", lr=5e-3, weight_decay=0.1, amp=amp)
    _, ref_digest, ref_losses = train(cfg, steps=4)
    off = cfg.replace(method="zo-offload")
    _, d, losses = train(off, steps=4)
    assert losses == ref_losses and d == ref_digest
    model, source = build_skeleton(off.model)
    engine = build_engine(model, source, off, torch.device("cpu"), EventBus())
    try:
        vocab, dim = model.get_input_embeddings().weight.shape
        [buf] = engine.tied.bufs  # one query: one copy (the "-" pass reads the group)
        assert buf.shape == (vocab, dim)  # the tied weight only, no positions
        assert buf.dtype == (torch.bfloat16 if amp == "bf16" else torch.float32)
    finally:
        engine.close()


@pytest.mark.parametrize("codec, master", [("bf16", "compressed-sr"), ("fp16", "compressed-sr"),
                                           ("fp32", "fp32")])
def test_state_fingerprint_reads_compressed_blocks_by_piece(monkeypatch, codec, master):
    """A compressed-SR master's streamed blocks are read a piece at a time for the run's
    digest (never widened whole); the fingerprint equals that of the decoded groups."""
    from workbench.engine import build_engine, groups
    from workbench.models.build import build_skeleton

    monkeypatch.setattr(groups, "PIECE", 512)
    cfg = RunConfig(model="tiny-opt", method="zo-offload", codec=codec, master=master)
    model, source = build_skeleton(cfg.model)
    engine = build_engine(model, source, cfg, torch.device("cpu"), EventBus())
    try:
        flats = engine.state_flats()
        readers = [flats.reader(i) for i in range(len(flats))]
        assert (readers[0], readers[-1]) == (None, None)  # embedding and head: tensors
        assert all(r is not None for r in readers[1:-1]) == (master == "compressed-sr")
        whole = [f.clone() for f in flats]
        assert groups.fingerprint(flats, threads=2) == groups.fingerprint(whole, threads=2)
        for reader, flat in zip(readers, whole):
            if reader is not None:
                assert torch.equal(reader.sample(1021), flat[::1021])
    finally:
        engine.close()
