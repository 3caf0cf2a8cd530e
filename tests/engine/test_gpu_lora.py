"""CUDA-only checks of adapter runs (skipped without a GPU; run on the GPU machine)."""
import pytest
import torch

from workbench.calibrate.fo import measure
from workbench.engine import build_engine
from workbench.engine.codecs import base as base_codecs
from workbench.engine.codecs.frozen_form import FrozenForm
from workbench.engine.events import EventBus
from workbench.engine.groups import digest
from workbench.models.build import build_skeleton

from test_lora import STEPS, lora_cfg, lora_run
from zo_helpers import KNOBS

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", params=[("tiny-opt", "fp32", "off"), ("tiny-opt", "bf16", "off"),
                                        ("tiny-llama", "bf16", "bf16"),
                                        ("tiny-opt", "fp8-e4m3", "bf16"),
                                        ("tiny-llama", "int8", "bf16")])
def cuda_reference(request):
    """MeZO + lora on CUDA; under amp=bf16 its base matrices are held in bf16 (the fused
    fp8 / int8 decode at setup, as zo-offload's before each block)."""
    model, codec, amp = request.param
    cfg = lora_cfg(model=model, base_codec=codec, amp=amp, device="cuda")
    return cfg, lora_run(cfg)


@pytest.mark.parametrize("overlap, reuse, fused, resident", KNOBS)
def test_lora_offload_equals_mezo_on_cuda(cuda_reference, overlap, reuse, fused, resident):
    cfg, ref = cuda_reference
    r = lora_run(cfg.replace(method="zo-offload", overlap=overlap, reuse_buffers=reuse,
                             fused_update=fused, resident_blocks=resident))
    assert r["losses"] == ref["losses"]
    assert digest(r["adapters"]) == digest(ref["adapters"])
    assert digest(r["base"]) == digest(ref["base"])
    assert r["d2h"] == 0


@pytest.mark.parametrize("codec", ["bf16", "fp8-e4m3", "int8"])
def test_mezo_holds_base_matrices_in_bf16_under_bf16_amp(codec):
    cfg = lora_cfg(base_codec=codec, amp="bf16", device="cuda")
    model, source = build_skeleton(cfg.model)
    engine = build_engine(model, source, cfg, torch.device("cuda"), EventBus(), measure=measure)
    try:
        blocks, ends = engine.frozen[1:-1], [engine.frozen[0], engine.frozen[-1]]
        assert {g.form.dtype for g in blocks} == {torch.bfloat16}
        params = dict(engine.adapter.blocks[0].named_parameters())
        assert {(p.dtype, p.is_cuda) for n, p in params.items()
                if p.dim() == 2 and ".lora_" not in n} == {(torch.bfloat16, True)}
        assert {p.dtype for p in params.values() if p.dim() == 1} == {torch.float32}
        assert all(g.form is None and g.flat.dtype == torch.float32 for g in ends)
        n = sum(g.layout.numel for g in blocks)
        assert sum(g.flat.numel() for g in blocks) < 2.1 * n  # ~2 B per base weight, was 4
    finally:
        engine.close()


@pytest.mark.parametrize("codec", ["fp8-e4m3", "int8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fused_decode_equals_the_torch_path_bit_for_bit(codec, dtype):
    """The Triton decode into a form (CUDA) gives the bits of the torch path (CPU): fp8 / int8
    widened, times its fp32 scale, rounded once; over several kernel blocks, a matrix prefix
    ending inside an fp8 chunk, rows of magnitudes 1e-4 .. 10."""
    from test_base_codecs import layout, weights

    assert base_codecs.fused() is not None  # the kernel path is what runs on CUDA
    lay = layout([(300, 257), (257, 300), (17, 33), (300,), (257,)])
    x = weights(lay, seed=3)
    codec_, form = base_codecs.base_codec(codec, lay), FrozenForm(lay, dtype)
    wire = torch.empty(codec_.nbytes, dtype=torch.uint8)
    codec_.encode(x, wire)
    out = {}
    for device in ("cpu", "cuda"):
        buf = form.empty(device)
        codec_.decode_form(wire.to(device), *form.parts(buf))
        out[device] = [part.cpu().view(torch.uint8) for part in form.parts(buf)]  # the bits
    assert all(torch.equal(a, b) for a, b in zip(out["cpu"], out["cuda"]))


@pytest.mark.parametrize("codec", ["fp8-e4m3", "int8"])
def test_frozen_stream_is_warmed_and_never_syncs(codec):
    """From an empty kernel cache, ``warm_kernels`` compiles every decode the steps launch, and
    steady steps run under sync debug mode "error" (no stream or device sync, no pageable
    copy)."""
    from test_host_sync import _batch, _compiled, _steps_without_sync

    from workbench.engine.codecs import base_kernels
    from workbench.engine.warmup import warm_kernels

    decodes = (base_kernels.fp8_kernel, base_kernels.rows_kernel)
    compiled = lambda clear=False: _compiled(clear, decodes)  # noqa: E731

    compiled(clear=True)
    cfg = lora_cfg(method="zo-offload", base_codec=codec, amp="bf16", device="cuda")
    model, source = build_skeleton(cfg.model)
    engine = build_engine(model, source, cfg, torch.device("cuda"), EventBus(), measure=measure)
    vocab = model.config.vocab_size
    try:
        warm_kernels(engine)
        before = compiled()
        assert before is None or before > 0
        for t in range(2):  # warm-up steps: allocator growth, cuBLAS handles
            engine.step(_batch(vocab, t, padded=t == 1, device="cuda"), t, 1e-3, 0.0)
        _steps_without_sync(engine, vocab)
        assert compiled() == before  # nothing compiled after the warm-up
    finally:
        engine.close()


@pytest.mark.parametrize("codec", ["fp8-e4m3", "int8"])
def test_compressed_base_streams_on_cuda_with_no_d2h(codec):
    r = lora_run(lora_cfg(method="zo-offload", base_codec=codec, device="cuda", amp="bf16"))
    assert r["d2h"] == 0 and r["h2d"] == STEPS * r["streamed_bytes"]
    assert all(torch.equal(a, b) for a, b in zip(r["base0"], r["base"]))


@pytest.fixture(scope="module", params=[("tiny-opt", "fp32", "off"), ("tiny-llama", "int8", "bf16")])
def fg_cuda_reference(request):
    """forward-grad + lora on CUDA with every block resident (nothing streamed)."""
    model, codec, amp = request.param
    cfg = lora_cfg(model=model, method="forward-grad", base_codec=codec, amp=amp, device="cuda",
                   lr=1e-3, resident_blocks=4)
    return cfg, lora_run(cfg)


@pytest.mark.parametrize("overlap, reuse, fused, resident", KNOBS)
def test_forward_grad_lora_streamed_equals_resident_on_cuda(fg_cuda_reference, overlap, reuse,
                                                            fused, resident):
    cfg, ref = fg_cuda_reference
    r = lora_run(cfg.replace(overlap=overlap, reuse_buffers=reuse, fused_update=fused,
                             resident_blocks=resident))
    assert r["losses"] == ref["losses"]
    assert digest(r["adapters"]) == digest(ref["adapters"])
    assert digest(r["base"]) == digest(ref["base"]) == digest(ref["base0"])
    assert r["d2h"] == 0


@pytest.mark.parametrize("amp, codec", [("off", "fp32"), ("bf16", "bf16"), ("bf16", "fp8-e4m3")])
def test_first_order_lora_on_cuda_trains_the_adapters_only(amp, codec):
    """fo and fo-offload + lora on CUDA: the base bytes are unchanged, the adapters move, and
    the two engines' losses agree (fo-offload's adapters' AdamW state lives on the host)."""
    base = lora_cfg(method="fo", amp=amp, base_codec=codec, device="cuda", lr=1e-3)
    fo = lora_run(base)
    off = lora_run(base.replace(method="fo-offload", update_stride="-2", subgroup_size=4096))
    for r in (fo, off):
        assert all(torch.equal(a, b) for a, b in zip(r["base0"], r["base"]))
        assert all(not torch.equal(a, b) for a, b in zip(r["adapters0"], r["adapters"]))
    tol = dict(rel=2e-2) if amp == "bf16" else dict(rel=1e-4, abs=1e-5)  # bf16 compute weights
    assert [x[-1] for x in off["losses"]] == pytest.approx([x[-1] for x in fo["losses"]], **tol)
