"""A frozen block's device form: matrices in the compute dtype, tail in fp32; it computes exactly
what autocast computes from the block's fp32 values."""
import pytest
import torch

from workbench.data.batches import SyntheticData
from workbench.engine import build_engine
from workbench.engine.codecs.base import round_trip
from workbench.engine.codecs.frozen_form import FrozenForm, matrix_dtype
from workbench.engine.events import EventBus
from workbench.engine.storage import Group, materialise
from workbench.models.build import build_skeleton

from test_base_codecs import layout, weights
from test_lora import lora_cfg


def test_matrix_dtype_follows_amp_for_compressed_codecs_only():
    assert matrix_dtype("bf16", "fp8-e4m3") == torch.bfloat16
    assert matrix_dtype("fp16", "bf16") == torch.float16
    assert matrix_dtype("off", "int8") == torch.float32
    assert matrix_dtype("bf16", "fp32") is None  # the exact base stays one fp32 flat


def test_form_layout_by_hand():
    """(48 x 40) + (40 x 48) + (7 x 13) matrices = 3931 elements in bf16 (7862 B, padded to
    7872), then the 88-element fp32 tail."""
    lay = layout([(48, 40), (40, 48), (7, 13), (48,), (40,)])
    form = FrozenForm(lay, torch.bfloat16)
    assert (form.n_mat, form.tail_at, form.nbytes) == (3931, 7872, 7872 + 4 * 88)
    buf = form.empty("cpu")
    mats, tail = form.parts(buf)
    assert (mats.dtype, mats.numel(), tail.dtype, tail.numel()) == (torch.bfloat16, 3931,
                                                                    torch.float32, 88)
    views = form.views(buf)
    assert [v.shape for v in views] == [e.shape for e in lay.entries]
    assert [v.dtype for v in views] == [torch.bfloat16] * 3 + [torch.float32] * 2
    assert views[3].data_ptr() == buf.data_ptr() + 7872  # the tail starts 16-byte aligned
    assert FrozenForm(lay, torch.float32).nbytes == 15728 + 4 * 88  # 4 x 3931 B, padded


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fill_rounds_matrices_to_nearest_and_keeps_the_tail(dtype):
    lay = layout([(48, 40), (40, 48), (7, 13), (48,), (40,)])
    x = weights(lay)
    form = FrozenForm(lay, dtype)
    buf = form.empty("cpu")
    form.fill(buf, x)
    y = form.to_fp32(buf)
    n = lay.n_decay
    assert torch.equal(y[:n], x[:n].to(dtype).float())  # what autocast's cast gives
    assert torch.equal(y[n:], x[n:])
    assert not torch.equal(y[:n], x[:n])  # it does round


def _losses(cfg, as_fp32: bool, steps: int = 2) -> list[tuple[float, float]]:
    """mezo + lora losses; ``as_fp32``: each form-held base block rebound first to the fp32
    values its codec decodes to (``round_trip``, before any cast), so autocast casts the
    matrices in every pass (the reference)."""
    model, source = build_skeleton(cfg.model)
    engine = build_engine(model, source, cfg, torch.device("cpu"), EventBus())
    forms = [g for g in engine.frozen if g.form is not None]
    assert len(forms) == 4  # every block of the tiny models
    if as_fp32:
        for g in forms:
            flat = materialise(g.layout, source, cfg.seed, torch.device("cpu"))
            round_trip(cfg.base_codec, g.layout, flat)
            assert not torch.equal(flat, g.values())  # the form holds them rounded
            Group(g.layout, flat).bind()
    data = SyntheticData(model.config.vocab_size, 16)
    out = []
    for t in range(steps):
        o = engine.step(data.batch_for_step(t, 2, cfg.seed), t, cfg.lr, cfg.weight_decay)
        out.append((float(o.loss_plus), float(o.loss_minus)))
    engine.close()
    return out


@pytest.mark.parametrize("model, codec, amp", [("tiny-opt", "fp8-e4m3", "bf16"),
                                               ("tiny-opt", "int8", "fp16"),
                                               ("tiny-llama", "int8", "bf16"),
                                               ("tiny-llama", "bf16", "fp16")])
def test_form_computes_what_autocast_computes_from_fp32(model, codec, amp):
    """The reference: the same decoded values in fp32, cast by autocast in each pass."""
    cfg = lora_cfg(model=model, base_codec=codec, amp=amp)
    assert _losses(cfg, as_fp32=False) == _losses(cfg, as_fp32=True)


@pytest.mark.parametrize("codec", ["fp8-e4m3", "int8", "bf16", "fp16"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_host_decode_to_fp32_equals_the_form_the_block_computes_with(codec, dtype):
    """``FrozenTransfer.to_fp32`` (digests, checkpoints: decode in place, round the matrices)
    gives exactly the values of ``decode_form`` into the device form, read back as fp32."""
    from workbench.engine.stream.frozen_transfer import FrozenTransfer

    lay = layout([(48, 40), (40, 48), (7, 13), (48,), (40,)])
    tr = FrozenTransfer(codec, [lay], torch.device("cpu"), None, dtype)
    host = tr.host_storage(lay)
    tr.store_fp32(host, weights(lay))
    form = FrozenForm(lay, dtype)
    buf = form.empty("cpu")
    host.codec.decode_form(host.buf, *form.parts(buf))
    assert torch.equal(tr.to_fp32(host), form.to_fp32(buf))


def test_round_in_pieces_covers_the_whole_matrix_prefix():
    lay = layout([(48, 40), (40, 48), (7, 13), (48,), (40,)])
    x = weights(lay)
    y = x.clone()
    FrozenForm(lay, torch.bfloat16).round_(y, piece=1000)  # 4 pieces, the last one ragged
    n = lay.n_decay
    assert torch.equal(y[:n], x[:n].to(torch.bfloat16).float()) and torch.equal(y[n:], x[n:])


@pytest.mark.parametrize("codec", ["fp8-e4m3", "int8", "bf16", "fp16", "fp32"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_frozen_block_read_by_ranges_equals_its_fp32_values(codec, dtype, monkeypatch):
    """``FrozenTransfer.reader``: any ranges starting on a 256-element chunk (int8: cutting
    rows, crossing matrices and the tail) give exactly ``to_fp32``'s values, and its strided
    sample (read a piece at a time) equals ``to_fp32``'s every k-th value."""
    from workbench.engine import groups
    from workbench.engine.stream.frozen_transfer import FrozenTransfer

    lay = layout([(48, 40), (40, 48), (7, 13), (48,), (40,)])
    tr = FrozenTransfer(codec, [lay], torch.device("cpu"), None,
                        None if codec == "fp32" else dtype)
    host = tr.host_storage(lay)
    tr.store_fp32(host, weights(lay))
    want, reader = tr.to_fp32(host), tr.reader(host)
    for step in (256, 512, 1024, lay.numel):
        got = torch.full((lay.numel,), float("nan"))
        for lo in range(0, lay.numel, step):
            hi = min(lay.numel, lo + step)
            reader.read(lo, hi, got[lo:hi])
        assert torch.equal(got, want), step
    monkeypatch.setattr(groups, "PIECE", 1024)  # 4 pieces and a bit; strides cross them
    for stride in (1, 7, 1021, lay.numel + 5):
        assert torch.equal(reader.sample(stride), want[::stride]), stride
