"""peft=lora for forward-grad, fo and fo-offload: the adapters' jvp is the exact directional
derivative over the adapters, the frozen stream carries it unchanged, and first-order adapter
training overfits a few examples on both first-order engines alike."""
import pytest
import torch

from workbench.calibrate.fo import measure
from workbench.config import RunConfig
from workbench.data.batches import SyntheticData
from workbench.engine import build_engine
from workbench.engine.events import EventBus, OpEvent
from workbench.engine.groups import digest
from workbench.engine.objective import label_loss
from workbench.engine.zo.step import step_seed
from workbench.models.build import build_skeleton

from test_lora import lora_cfg, lora_run
from zo_helpers import CPU_KNOBS

THREADS = torch.get_num_threads()


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run fastest on one thread, and a loaded CI machine does not thrash (results
    do not depend on the thread count here: every comparison is within one process)."""
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(THREADS)


@pytest.mark.parametrize("name", ["tiny-opt", "tiny-llama"])
@pytest.mark.parametrize("codec", ["fp32", "int8"])
def test_adapter_jvp_equals_autograd_gradient_dot_v(name, codec):
    """d of one forward-grad + lora step (a trained adapter, so B != 0) equals the gradient of
    the loss w.r.t. the adapters by backprop through MeZO + lora's model, dotted with v."""
    cfg = lora_cfg(model=name, method="forward-grad", base_codec=codec, lr=0.0)
    batch = SyntheticData(260, 16).batch_for_step(0, 4, 0)
    model, source = build_skeleton(name)
    engine = build_engine(model, source, cfg, torch.device("cpu"), EventBus(), measure=measure)
    # B = 0 at initialisation makes d of every A zero: start both from the same nonzero B.
    gen = torch.Generator().manual_seed(7)
    start = [torch.randn(f.shape, generator=gen) * 0.05 for f in engine.state_flats()]
    engine.load_state_flats(start)
    d = float(engine.step(batch, 0, 0.0, 0.0).projected_grad)
    engine.close()
    ref_model, ref_source = build_skeleton(name)
    ref = build_engine(ref_model, ref_source, cfg.replace(method="mezo"), torch.device("cpu"),
                       EventBus(), measure=measure)
    ref.load_state_flats(start)
    params = []
    for g in ref.groups:
        params.append([torch.nn.Parameter(v) for v in g.layout.views(g.flat)])
        g.layout.bind(params[-1])
    logits = ref_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    last = batch.attention_mask.sum(1) - 1
    label_loss(logits[torch.arange(4), last], batch).backward()
    seed = step_seed(cfg.seed, 0)
    expected = 0.0
    for g, ps in zip(ref.groups, params):
        grads = torch.cat([p.grad.reshape(-1) for p in ps])
        expected += float(grads @ engine.ops.z(g.layout.numel, seed, g.layout.gid))
    ref.close()
    assert abs(d - expected) <= 1e-5 * max(1.0, abs(expected))
    assert abs(expected) > 1e-3


@pytest.fixture(scope="module", params=["tiny-opt", "tiny-llama"])
def fg_reference(request):
    """forward-grad + lora with every block resident (nothing streamed): the reference."""
    cfg = lora_cfg(model=request.param, method="forward-grad", lr=1e-3, resident_blocks=4)
    return cfg, lora_run(cfg)


@pytest.mark.parametrize("reuse, fused, resident", CPU_KNOBS)
def test_streamed_adapter_jvp_equals_resident(fg_reference, reuse, fused, resident):
    cfg, ref = fg_reference
    r = lora_run(cfg.replace(reuse_buffers=reuse, fused_update=fused, resident_blocks=resident,
                             prefetch_depth=2 if resident == 2 else 1))
    assert r["losses"] == ref["losses"]
    assert digest(r["adapters"]) == digest(ref["adapters"])
    assert digest(r["base"]) == digest(ref["base"]) == digest(ref["base0"])
    assert r["d2h"] == 0


def test_forward_grad_lora_fits_a_batch_up_only():
    """One fixed batch: the loss falls along exact directional derivatives over the adapters,
    while the base only ever comes up (jvp and upload on the timeline, no offload)."""
    events = []
    bus = EventBus()
    bus.subscribe(lambda e: events.append(e) if isinstance(e, OpEvent) else None)
    cfg = lora_cfg(model="tiny-llama", method="forward-grad", base_codec="bf16")
    model, source = build_skeleton(cfg.model)
    engine = build_engine(model, source, cfg, torch.device("cpu"), bus, measure=measure)
    batch = SyntheticData(260, 16).batch_for_step(0, 8, 0)
    losses = [float(engine.step(batch, t, 1e-2, 0.0).loss) for t in range(40)]
    d2h = engine.bytes_d2h
    engine.close()
    ops = {e.op for e in events}
    assert {"jvp", "upload"} <= ops and "offload" not in ops and d2h == 0
    assert sum(losses[-5:]) / 5 < 0.9 * sum(losses[:5]) / 5


def _fixed_batch_losses(cfg: RunConfig, steps: int) -> list[float]:
    model, source = build_skeleton(cfg.model)
    engine = build_engine(model, source, cfg, torch.device("cpu"), EventBus(), measure=measure)
    batch = SyntheticData(model.config.vocab_size, 16).batch_for_step(0, 4, cfg.seed)
    out = [float(engine.step(batch, t, cfg.lr, cfg.weight_decay).loss) for t in range(steps)]
    engine.close()
    return out


@pytest.mark.parametrize("model", ["tiny-opt", "tiny-llama"])
def test_first_order_lora_overfits_a_few_examples_alike(model):
    """AdamW on the adapters alone drives the loss of 4 examples far down, and fo-offload
    (adapters' optimizer state on the host) follows fo step for step."""
    cfg = lora_cfg(model=model, method="fo", lr=1e-2, weight_decay=0.0)
    fo = _fixed_batch_losses(cfg, 30)
    off = _fixed_batch_losses(cfg.replace(method="fo-offload", update_stride="-2",
                                          subgroup_size=4096), 30)
    assert off == pytest.approx(fo, rel=1e-4, abs=1e-5)
    assert fo[-1] < 0.25 * fo[0]
