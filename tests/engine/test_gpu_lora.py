"""CUDA-only checks of adapter runs (skipped without a GPU; run on the GPU machine)."""
import pytest
import torch

from workbench.engine.groups import digest

from test_lora import STEPS, lora_cfg, lora_run
from zo_helpers import KNOBS

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", params=[("tiny-opt", "fp32", "off"), ("tiny-opt", "bf16", "off"),
                                        ("tiny-llama", "bf16", "bf16")])
def cuda_reference(request):
    """MeZO + lora on CUDA; under amp=bf16 with base_codec=bf16 its base is held in bf16."""
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


def test_mezo_holds_a_bf16_base_in_bf16_under_bf16_amp():
    r = lora_run(lora_cfg(base_codec="bf16", amp="bf16", device="cuda"), steps=1)
    assert {f.dtype for f in r["base"][1:-1]} == {torch.bfloat16}  # blocks
    assert {r["base"][0].dtype, r["base"][-1].dtype} == {torch.float32}  # embedding, head


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
