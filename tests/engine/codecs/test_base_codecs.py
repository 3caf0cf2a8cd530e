"""Frozen-base codecs: sizes, exactness of fp32, and the round-trip error bounds of fp8-e4m3
(per-block scales) and int8 (per-channel scales), against the formats' definitions."""
import pytest
import torch
from torch import nn

from workbench.engine.codecs.base import base_codec, round_trip
from workbench.engine.codecs.wire import CHUNK
from workbench.engine.groups import Entry, GroupLayout


def layout(shapes: list[tuple[int, ...]]) -> GroupLayout:
    """A group of parameters of ``shapes``, matrices first (as ``build_layouts`` orders them)."""
    entries, off = [], 0
    owner = ((nn.Module(), "weight"),)
    for k, shape in enumerate(shapes):
        n = int(torch.tensor(shape).prod())
        entries.append(Entry(f"p{k}", owner, shape, off, n))
        off += n
    n_decay = sum(e.numel for e in entries if len(e.shape) >= 2)
    return GroupLayout("block.0", entries, off, n_decay)


SHAPES = [(48, 40), (40, 48), (7, 13), (48,), (40,)]  # rows of very different magnitudes below


def weights(lay: GroupLayout, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(lay.numel, generator=g)
    first = lay.entries[0]
    rows = x[:first.numel].view(first.shape)
    rows *= torch.logspace(-4, 1, first.shape[0])[:, None]  # row scales 1e-4 .. 10
    return x


def round_tripped(name: str, lay: GroupLayout, x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    round_trip(name, lay, y)
    return y


def test_fp32_is_exact_and_bf16_rounds_to_nearest():
    lay = layout(SHAPES)
    x = weights(lay)
    assert torch.equal(round_tripped("fp32", lay, x), x)
    assert torch.equal(round_tripped("bf16", lay, x), x.to(torch.bfloat16).float())
    assert base_codec("bf16", lay).nbytes == 2 * lay.numel


def test_int8_per_channel_error_is_at_most_half_a_step_of_its_row():
    lay = layout(SHAPES)
    x = weights(lay)
    y = round_tripped("int8", lay, x)
    for e in lay.entries:
        xs, ys = x[e.offset:e.offset + e.numel], y[e.offset:e.offset + e.numel]
        if len(e.shape) < 2:
            assert torch.equal(xs, ys)  # biases and norm weights stay fp32
            continue
        xr, yr = xs.view(e.shape[0], -1), ys.view(e.shape[0], -1)
        step = xr.abs().amax(dim=1, keepdim=True) / 127  # each row's own scale
        assert ((xr - yr).abs() <= step / 2 * (1 + 1e-6)).all()
        assert ((xr - yr).abs() > 0).any()  # it does round
    # a per-tensor scale would flush the 1e-4 rows of the first matrix to zero; per-channel
    # keeps them within 1/254 of their own size
    small = x[:40].abs().max()
    assert (y[:40] - x[:40]).abs().max() <= small / 254 * (1 + 1e-6)
    n_mat = lay.n_decay
    assert base_codec("int8", lay).nbytes == (n_mat + 3) // 4 * 4 + 4 * (48 + 40 + 7) + 4 * 88


def test_fp8_e4m3_per_block_error_bound():
    """Within each block of CHUNK elements: |err| <= 2^-4 |x| in the normal range (3 mantissa
    bits), and <= scale x 2^-10 below it (half the subnormal spacing 2^-9)."""
    lay = layout([(64, 96), (96,)])
    x = weights(lay, seed=1)
    y = round_tripped("fp8-e4m3", lay, x)
    chunks = torch.nn.functional.pad(x, (0, -lay.numel % CHUNK)).view(-1, CHUNK)
    scale = (chunks.abs().amax(dim=1) / 448.0).repeat_interleave(CHUNK)[:lay.numel]
    bound = torch.maximum(x.abs() * 2**-4, scale * 2**-10)
    assert ((x - y).abs() <= bound * (1 + 1e-6)).all()
    assert not torch.equal(x, y)
    assert base_codec("fp8-e4m3", lay).nbytes == (lay.numel + 15) // 16 * 16 + 4 * (
        (lay.numel + CHUNK - 1) // CHUNK)


def test_a_zero_row_survives_int8():
    lay = layout([(4, 8)])
    x = torch.zeros(32)
    x[8:16] = 1.0
    assert torch.equal(round_tripped("int8", lay, x), x)


def test_unknown_base_codec_is_named():
    with pytest.raises(ValueError, match="base_codec: 'int4' is not one of"):
        base_codec("int4", layout([(2, 2)]))


@pytest.mark.parametrize("name", ["bf16", "fp16", "fp8-e4m3", "int8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_decode_form_rounds_the_fp32_decoding_once(name, dtype):
    """Into a ``FrozenForm``: each matrix element is its fp32 decoding rounded to nearest into
    the form's dtype (what autocast does to the fp32 weight), the tail its fp32 decoding. The
    matrix prefix (3931) ends inside an fp8 chunk, so a chunk's scale spans both parts."""
    from workbench.engine.codecs.frozen_form import FrozenForm

    lay = layout(SHAPES)
    x = weights(lay)
    codec, form = base_codec(name, lay), FrozenForm(lay, dtype)
    wire = torch.empty(codec.nbytes, dtype=torch.uint8)
    codec.encode(x, wire)
    ref = torch.empty(lay.numel)
    codec.decode(wire, ref)
    buf = form.empty("cpu")
    mats, tail = form.parts(buf)
    codec.decode_form(wire, mats, tail)
    n = lay.n_decay
    assert n % CHUNK != 0
    assert torch.equal(mats, ref[:n].to(dtype)) and torch.equal(tail, ref[n:])
