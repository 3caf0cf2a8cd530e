"""Nothing in a training step waits for the GPU.

On the CPU: a step must not read a tensor's value on the host (``bool``, ``item``, ``int``,
``tolist``, ``nonzero``: on a GPU each is a sync). Hugging Face's mask code did, twice a step;
on the meta device, where no value exists, the block context must still build. On the GPU:
steps after warm-up run under ``torch.cuda.set_sync_debug_mode("error")``, and no Triton kernel
compiles after the warm-up.
"""
from contextlib import contextmanager

import pytest
import torch

from workbench.config import RunConfig
from workbench.data.batches import Batch, SyntheticData
from workbench.engine import build_engine
from workbench.engine.events import EventBus
from workbench.engine.warmup import warm_kernels
from workbench.models.adapter import BlockAdapter
from workbench.models.build import build_skeleton

#: (method, codec, master, amp): every engine and transfer kind of a ZO step
CONFIGS = [("mezo", "fp32", "fp32", "off"), ("zo-offload", "fp32", "fp32", "off"),
           ("zo-offload", "bf16", "compressed-sr", "bf16"),
           ("zo-offload", "fp16", "compressed-sr", "fp16"), ("zo-offload", "bf16", "fp32", "bf16"),
           ("zo-offload", "fp8-e4m3", "fp32", "bf16"), ("forward-grad", "fp32", "fp32", "off")]
HOST_READS = ("__bool__", "item", "__int__", "__float__", "__index__", "tolist", "nonzero")


def _batch(vocab: int, step: int, padded: bool, device: str) -> Batch:
    """A synthetic batch of 4 x 24; with ``padded`` two rows end early (right padding)."""
    b = SyntheticData(vocab, 24).batch_for_step(step, 4, 0)
    mask = b.attention_mask.clone()
    if padded:
        mask[1, 15:] = 0
        mask[3, 7:] = 0
    return Batch(b.input_ids, mask, b.labels, b.label_ids).to(device)


@contextmanager
def _no_host_reads(monkeypatch):
    def forbidden(name):
        def read(self, *args, **kwargs):
            raise AssertionError(f"a step read a tensor on the host: Tensor.{name}")
        return read

    with monkeypatch.context() as m:
        for name in HOST_READS:
            m.setattr(torch.Tensor, name, forbidden(name))
        yield


@pytest.mark.parametrize("model", ["tiny-opt", "tiny-llama"])
@pytest.mark.parametrize("method, codec, master, amp", CONFIGS)
def test_a_step_reads_no_tensor_on_the_host(monkeypatch, model, method, codec, master, amp):
    cfg = RunConfig(model=model, method=method, codec=codec, master=master)
    skeleton, source = build_skeleton(model)
    engine = build_engine(skeleton, source, cfg, torch.device("cpu"), EventBus())
    try:
        for t in range(3):  # step 0 has no pending update, later ones do
            batch = _batch(skeleton.config.vocab_size, t, padded=t % 2 == 1, device="cpu")
            with _no_host_reads(monkeypatch):
                engine.step(batch, t, 1e-3, 0.0)
    finally:
        engine.close()


@pytest.mark.parametrize("model", ["tiny-opt", "tiny-llama"])
@pytest.mark.parametrize("padded", [False, True])
def test_block_context_builds_on_meta_tensors(model, padded):
    """Meta tensors have no values: any host read raises. The context is built once for a
    batch and reused by a second pass over it."""
    skeleton, _ = build_skeleton(model)  # meta weights
    adapter = BlockAdapter(skeleton)
    batch = _batch(skeleton.config.vocab_size, 0, padded, "meta")
    assert batch.padded is padded
    with torch.no_grad():
        hidden, ctx = adapter.embed(batch)
        again, ctx2 = adapter.embed(batch)
        for block in adapter.blocks:
            hidden = adapter.run_block(block, hidden, ctx)
        logits = adapter.head(hidden, ctx)
    assert ctx2 is ctx and again.shape == hidden.shape and logits.shape == (4, 260)
    mask = ctx.kwargs["attention_mask"]
    assert (mask is None) == (not padded)  # unpadded: SDPA's causal path, no mask


def test_context_is_rebuilt_for_another_batch():
    skeleton, _ = build_skeleton("tiny-opt")
    adapter = BlockAdapter(skeleton)
    a, b = (_batch(260, 0, p, "meta") for p in (False, True))
    with torch.no_grad():
        _, ca = adapter.embed(a)
        _, cb = adapter.embed(b)
    assert ca is not cb and ca.kwargs["attention_mask"] is None
    assert cb.kwargs["attention_mask"] is not None


# --- on the GPU -----------------------------------------------------------------------------
def _compiled(clear: bool = False, kernels: tuple | None = None) -> int | None:
    """Triton kernel variants this process holds of ``kernels`` (default: the ZO and SR ones;
    None: this Triton keeps them elsewhere); ``clear`` forgets them first, so the next launch
    of each compiles (or loads) it again."""
    from workbench.engine.codecs import sr_kernel as codec_kernels
    from workbench.engine.zo import kernels as zo_kernels

    total = 0
    for fn in kernels or (zo_kernels.zo_kernel, zo_kernels.normals_kernel,
                          codec_kernels.sr_kernel):
        caches = getattr(fn, "device_caches", None)
        if caches is None:
            return None
        for cache in caches.values():
            if clear:
                cache[0].clear()
            total += len(cache[0])
    return total


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["tiny-opt", "tiny-llama"])
@pytest.mark.parametrize("method, codec, master, amp", CONFIGS)
def test_steps_after_warmup_never_sync_on_cuda(model, method, codec, master, amp):
    """Three steady steps (padded and unpadded batches) under sync debug mode "error": any
    stream or device synchronisation, ``.item()`` or pageable copy raises."""
    cfg = RunConfig(model=model, method=method, codec=codec, master=master, amp=amp,
                    device="cuda")
    skeleton, source = build_skeleton(model)
    engine = build_engine(skeleton, source, cfg, torch.device("cuda"), EventBus())
    vocab = skeleton.config.vocab_size
    try:
        warm_kernels(engine)
        for t in range(2):  # warm-up steps: allocator growth, cuBLAS handles, first launches
            engine.step(_batch(vocab, t, padded=t == 1, device="cuda"), t, 1e-3, 0.0)
        compiled = _compiled()
        _steps_without_sync(engine, vocab)
        assert compiled is None or _compiled() == compiled  # warm_kernels left nothing to compile
    finally:
        engine.close()


def _steps_without_sync(engine, vocab: int) -> None:
    """Steps 2-4 (padded and unpadded batches) under sync debug mode "error"."""
    batches = [_batch(vocab, t, padded=t % 2 == 0, device="cuda") for t in range(2, 5)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for t, batch in zip(range(2, 5), batches):
            engine.step(batch, t, 1e-3, 0.0)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.parametrize("method, codec, master, amp", CONFIGS)
def test_warmup_compiles_every_kernel_the_steps_launch(method, codec, master, amp):
    """From an empty kernel cache, ``warm_kernels`` alone (no step yet) leaves steps and a
    flush nothing to compile."""
    if _compiled(clear=True) is None:
        pytest.skip("this Triton version keeps its kernel cache elsewhere")
    cfg = RunConfig(model="tiny-opt", method=method, codec=codec, master=master, amp=amp,
                    device="cuda")
    skeleton, source = build_skeleton(cfg.model)
    engine = build_engine(skeleton, source, cfg, torch.device("cuda"), EventBus())
    try:
        assert warm_kernels(engine) > 0
        before = _compiled()
        for t in range(3):
            engine.step(_batch(skeleton.config.vocab_size, t, False, "cuda"), t, 1e-3, 0.01)
        engine.flush()
        torch.cuda.synchronize()
        assert _compiled() == before
    finally:
        engine.close()
