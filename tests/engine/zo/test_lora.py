"""peft=lora: only adapter weights train; zo-offload's frozen stream equals MeZO bit for bit and
moves the base host -> GPU only."""
import pytest
import torch

from workbench.calibrate.fo import measure
from workbench.config import ConfigError, RunConfig
from workbench.data.batches import SyntheticData
from workbench.engine import build_engine
from workbench.engine.codecs.base import base_codec
from workbench.engine.codecs.frozen_form import FrozenForm
from workbench.engine.events import EventBus, OpEvent
from workbench.engine.groups import build_layouts, digest
from workbench.models.build import build_skeleton

from zo_helpers import CPU_KNOBS

STEPS = 4


def lora_run(cfg: RunConfig, steps: int = STEPS, bus: EventBus | None = None) -> dict:
    """``steps`` steps on synthetic batches; adapter and base weights before and after, the
    losses per step ((L+, L-, g, loss) for ZO, (d, loss) forward-grad, (loss,) first-order),
    and the engine's byte counters."""
    model, source = build_skeleton(cfg.model)
    engine = build_engine(model, source, cfg, torch.device(cfg.device), bus or EventBus(), measure=measure)
    copy = lambda flats: [f.detach().cpu().clone() for f in flats]  # noqa: E731
    out = {"adapters0": copy(engine.state_flats()), "base0": copy(engine.base_flats())}
    data = SyntheticData(model.config.vocab_size, 16)
    losses = []
    for t in range(steps):
        batch = data.batch_for_step(t, 2, cfg.seed).to(torch.device(cfg.device))  # as the recipe
        o = engine.step(batch, t, cfg.lr, cfg.weight_decay)
        losses.append(tuple(float(x) for x in (o.loss_plus, o.loss_minus, o.projected_grad,
                                               o.loss) if x is not None))
    engine.flush()
    out.update(adapters=copy(engine.state_flats()), base=copy(engine.base_flats()),
               losses=losses, h2d=engine.bytes_h2d, d2h=engine.bytes_d2h,
               layouts=engine.group_layouts(), engine=engine)
    if cfg.method == "zo-offload":
        s = engine.streamer
        out["streamed_bytes"] = sum(s.transfer.host_bytes(s.blocks[i].flat)
                                    for i in range(len(s.blocks)) if i not in s.resident)
    engine.close()
    return out


def lora_cfg(**kw) -> RunConfig:
    base = dict(model="tiny-opt", method="mezo", peft="lora", lr=5e-2, weight_decay=0.1)
    return RunConfig(**{**base, **kw})


@pytest.mark.parametrize("method", ["mezo", "zo-offload", "forward-grad", "fo", "fo-offload"])
def test_only_adapters_are_perturbed_and_updated(method):
    lr = 1e-3 if method in ("fo", "fo-offload") else 5e-2  # AdamW steps are lr-sized
    r = lora_run(lora_cfg(method=method, lr=lr))
    # base bytes unchanged: embedding, every block, head
    assert len(r["base"]) == 6 and all(f.numel() for f in r["base"])
    assert all(torch.equal(a, b) for a, b in zip(r["base0"], r["base"]))
    assert all(not torch.equal(a, b) for a, b in zip(r["adapters0"], r["adapters"]))
    assert all(".lora_" in e.name for lay in r["layouts"] for e in lay.entries)
    assert len(r["layouts"]) == 4  # one adapter group per block of tiny-opt
    # q and v of 4 blocks, rank 8, hidden 64: (8 x 64 + 64 x 8) x 2 x 4
    assert sum(a.numel() for a in r["adapters"]) == 2 * 8 * 64 * 2 * 4
    if method in ("mezo", "zo-offload"):
        g = [x[2] for x in r["losses"]]
        assert g[0] == 0.0 or any(abs(v) > 0 for v in g)  # B = 0 at first: L+ == L- is allowed


@pytest.fixture(scope="module", params=[("tiny-opt", "fp32", "off"), ("tiny-opt", "bf16", "off"),
                                        ("tiny-llama", "bf16", "off"),
                                        # under autocast: matrices held in bf16 by both engines
                                        ("tiny-opt", "bf16", "bf16"),
                                        ("tiny-opt", "fp8-e4m3", "bf16"),
                                        ("tiny-llama", "int8", "bf16")], ids="-".join)
def reference(request):
    model, codec, amp = request.param
    cfg = lora_cfg(model=model, base_codec=codec, amp=amp)
    return cfg, lora_run(cfg)


@pytest.mark.parametrize("reuse, fused, resident", CPU_KNOBS)
def test_lora_offload_equals_mezo(reference, reuse, fused, resident):
    cfg, ref = reference
    r = lora_run(cfg.replace(method="zo-offload", reuse_buffers=reuse, fused_update=fused,
                             resident_blocks=resident))
    assert r["losses"] == ref["losses"]
    assert digest(r["adapters"]) == digest(ref["adapters"])
    assert digest(r["base"]) == digest(ref["base"])


def test_prefetch_depth_keeps_lora_equality(reference):
    cfg, ref = reference
    r = lora_run(cfg.replace(method="zo-offload", prefetch_depth=3))
    assert digest(r["adapters"]) == digest(ref["adapters"])


@pytest.mark.parametrize("codec, amp", [("fp32", "off"), ("bf16", "off"), ("fp8-e4m3", "off"),
                                        ("int8", "off"), ("fp32", "bf16"), ("bf16", "bf16"),
                                        ("fp8-e4m3", "bf16"), ("int8", "bf16")])
@pytest.mark.parametrize("resident", [0, 1])
def test_frozen_stream_moves_the_base_up_only(codec, amp, resident):
    """No D2H byte and no offload or update pass over the base; H2D = each step (and the final
    flush, which moves nothing) uploads every streamed block's encoded bytes once. Uploads are
    on the upload lane; a compressed block's decode is a ``codec`` span on the compute lane,
    one per upload, each before its block's compute."""
    events = []
    bus = EventBus()
    bus.subscribe(lambda e: events.append(e) if isinstance(e, OpEvent) else None)
    r = lora_run(lora_cfg(method="zo-offload", base_codec=codec, amp=amp,
                          resident_blocks=resident), bus=bus)
    assert r["d2h"] == 0
    streamed = 4 - resident
    layout = build_layouts(r["engine"].adapter)[1][0]
    assert r["streamed_bytes"] == streamed * base_codec(codec, layout).nbytes
    assert r["h2d"] == STEPS * r["streamed_bytes"] > 0
    ops = {e.op for e in events}
    assert "offload" not in ops and "upload" in ops
    uploads = [e for e in events if e.op == "upload"]
    assert len(uploads) == STEPS * streamed and {e.stream for e in uploads} == {"upload"}
    decodes = [e for e in events if e.op == "codec"]
    assert len(decodes) == (0 if codec == "fp32" else STEPS * streamed)
    assert {(e.stream, e.detail) for e in decodes} <= {("compute", "decode")}
    for d in decodes:  # each decode between its block's upload and its compute
        up = next(e for e in uploads if (e.step, e.block) == (d.step, d.block))
        comp = next(e for e in events if e.op == "compute" and (e.step, e.block) == (d.step,
                                                                                    d.block))
        assert up.end <= d.start and d.end <= comp.start


def test_lora_checkpoint_round_trip(tmp_path):
    """A snapshot of a zo-offload + lora run holds the adapters and the pending update;
    restoring it into a fresh engine continues exactly."""
    cfg = lora_cfg(method="zo-offload")
    model, source = build_skeleton(cfg.model)
    a = build_engine(model, source, cfg, torch.device("cpu"), EventBus(), measure=measure)
    data = SyntheticData(model.config.vocab_size, 16)
    for t in range(2):
        a.step(data.batch_for_step(t, 2, 0), t, cfg.lr, cfg.weight_decay)
    snap = a.snapshot(2)()
    assert snap.pending is not None and snap.names == [lay.name for lay in a.group_layouts()]
    model2, source2 = build_skeleton(cfg.model)
    b = build_engine(model2, source2, cfg, torch.device("cpu"), EventBus(), measure=measure)
    b.restore(snap)
    for e in (a, b):
        e.step(data.batch_for_step(2, 2, 0), 2, cfg.lr, cfg.weight_decay)
        e.flush()
    assert digest(a.state_flats()) == digest(b.state_flats())
    a.close()
    b.close()


def test_lora_settings_are_checked_at_once():
    with pytest.raises(ConfigError) as e:
        RunConfig(method="forward-grad", peft="lora", codec="bf16", lora_targets="q_proj,")
    assert e.value.problems == [
        "lora_targets: 'q_proj,' has an empty name",
        "codec: with peft=lora the adapters stay on the GPU and the base never goes down; set "
        "the base's format with base_codec"]
    for method in ("mezo", "zo-offload", "forward-grad", "fo", "fo-offload"):
        RunConfig(method=method, peft="lora", base_codec="int8")  # every method trains adapters
    with pytest.raises(ConfigError, match="base_codec: applies only with peft=lora"):
        RunConfig(base_codec="int8")
    with pytest.raises(ConfigError, match="base_codec: 'int4' is not one of"):
        RunConfig(peft="lora", base_codec="int4")


def test_unknown_lora_target_is_named():
    cfg = lora_cfg(lora_targets="q_proj,nonexistent")
    model, source = build_skeleton(cfg.model)
    with pytest.raises(ValueError, match="lora_targets: nonexistent matches no linear module"):
        build_engine(model, source, cfg, torch.device("cpu"), EventBus(), measure=measure)


def test_lora_targets_and_rank_shape_the_adapters():
    r = lora_run(lora_cfg(lora_targets="fc1", lora_rank=2), steps=1)
    names = {e.name.split(".")[-4] for lay in r["layouts"] for e in lay.entries}
    assert names == {"fc1"}
    # fc1: 64 -> 256 at rank 2: A (2 x 64) + B (256 x 2) per block
    assert sum(a.numel() for a in r["adapters"]) == 4 * (2 * 64 + 256 * 2)


@pytest.mark.parametrize("method", ["mezo", "zo-offload"])
def test_frozen_matrices_compute_in_bf16_under_bf16_amp(method):
    """Every block computes with its base matrices in bf16 (decoded straight into that dtype),
    its biases and norm weights in fp32 and its adapters in fp32; zo-offload's device buffers
    are one decoded block in that form and a wire per slot."""
    cfg = lora_cfg(method=method, base_codec="fp8-e4m3", amp="bf16",
                   **({"resident_blocks": 1} if method == "zo-offload" else {}))
    model, source = build_skeleton(cfg.model)
    engine = build_engine(model, source, cfg, torch.device("cpu"), EventBus(), measure=measure)
    seen: dict[int, dict[str, torch.dtype]] = {}

    def look(i: int, module) -> None:  # a pre-hook returning None leaves the inputs as they are
        seen.setdefault(i, {n: p.dtype for n, p in module.named_parameters()})

    for i, block in enumerate(engine.adapter.blocks):
        block.register_forward_pre_hook(lambda m, a, i=i: look(i, m))
    data = SyntheticData(model.config.vocab_size, 16)
    engine.step(data.batch_for_step(0, 2, 0), 0, cfg.lr, cfg.weight_decay)
    layout = build_layouts(engine.adapter)[1][0]
    buffers = engine.buffer_bytes() if method == "zo-offload" else {}
    engine.close()
    assert sorted(seen) == [0, 1, 2, 3]  # block 0 resident, 1-3 streamed
    for dtypes in seen.values():
        want = {n: torch.float32 if ".lora_" in n or n.endswith("bias") or "layer_norm" in n
                else torch.bfloat16 for n in dtypes}
        assert dtypes == want
        assert sum(d == torch.bfloat16 for d in dtypes.values()) == 6  # q k v out fc1 fc2
    if method == "zo-offload":
        form = FrozenForm(layout, torch.bfloat16)
        assert buffers["block slots"] == form.nbytes  # one decoded block serves every slot
        assert buffers["resident blocks"] == form.nbytes
        assert buffers["codec wire buffers"] == 2 * base_codec("fp8-e4m3", layout).nbytes


@pytest.mark.parametrize("codec", ["bf16", "fp8-e4m3", "int8"])
def test_a_frozen_stream_step_reads_no_tensor_on_the_host(monkeypatch, codec):
    """The decode on the compute stream reads nothing on the host (on a GPU each read is a
    sync)."""
    from test_host_sync import _batch, _no_host_reads

    cfg = lora_cfg(method="zo-offload", base_codec=codec, amp="bf16", resident_blocks=1)
    model, source = build_skeleton(cfg.model)
    engine = build_engine(model, source, cfg, torch.device("cpu"), EventBus(), measure=measure)
    try:
        for t in range(2):
            batch = _batch(model.config.vocab_size, t, padded=t == 1, device="cpu")
            with _no_host_reads(monkeypatch):
                engine.step(batch, t, 1e-3, 0.0)
    finally:
        engine.close()
