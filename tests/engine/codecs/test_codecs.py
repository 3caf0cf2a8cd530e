"""Transfer codecs, stochastic rounding, and updates that must not be lost."""
import pytest
import torch

from workbench.engine.codecs.wire import CHUNK, get_codec, stochastic_round
from workbench.engine.events import EventBus
from workbench.engine.groups import GroupLayout
from workbench.engine.stream.transfers import MirrorTransfer, SRTransfer
from workbench.engine.timing import OpTimer
from workbench.engine.zo.perturb import PendingUpdate, ZOOps

from zo_helpers import check_codec_run

# Largest relative rounding error of each format's normal range (half an ulp), and its
# smallest subnormal relative to the scale (fp8 is scaled per chunk so amax maps to fmax).
# fp16 also has an absolute floor: half its smallest subnormal, 2^-25.
BOUNDS = {"fp32": (0.0, 0.0, 0.0), "bf16": (2**-8, 0.0, 0.0), "fp16": (2**-11, 0.0, 2**-25),
          "fp8-e4m3": (2**-4, 2**-9 / 448, 0.0), "fp8-e5m2": (2**-3, 2**-16 / 57344, 0.0)}


def _weights(n=10_000, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g) * 0.02


@pytest.mark.parametrize("name", list(BOUNDS))
def test_round_trip_within_format_bound(name):
    codec = get_codec(name)
    x = _weights(10_007)  # not a multiple of the fp8 chunk
    buf = codec.empty(x.numel(), "cpu")
    out = torch.empty_like(x)
    codec.encode(x, buf)
    codec.decode(buf, out)
    rel, sub, floor = BOUNDS[name]
    amax = x.abs().view(-1)[: (x.numel() // CHUNK) * CHUNK].view(-1, CHUNK).amax(1).max()
    assert ((out - x).abs() <= rel * x.abs() + sub * float(amax) + floor).all()
    if name != "fp32":
        assert not torch.equal(out, x)


@pytest.mark.parametrize("name", ["fp8-e4m3", "fp8-e5m2"])
def test_fp8_scales_handle_tiny_and_huge(name):
    codec = get_codec(name)
    x = torch.cat([torch.full((CHUNK,), 1e-30), torch.full((CHUNK,), 3e30),
                   torch.zeros(CHUNK), _weights(CHUNK)])
    x[CHUNK + 5] = -2e30
    buf, out = codec.empty(x.numel(), "cpu"), torch.empty_like(x)
    codec.encode(x, buf)
    codec.decode(buf, out)
    assert torch.isfinite(out).all()
    assert torch.allclose(out, x, rtol=0.13, atol=0)  # small values not flushed to zero


@pytest.mark.parametrize("name", ["fp8-e4m3", "fp8-e5m2"])
def test_fp8_encode_in_pieces_gives_the_same_bytes(name, monkeypatch):
    """A large group is encoded a piece at a time (bounded temporaries): the bytes equal an
    encode of the whole, whose per-chunk scales are computed here independently."""
    from workbench.engine.codecs import wire as codecs

    codec = get_codec(name)
    x = _weights(10_007) * torch.linspace(0.1, 10.0, 10_007)  # scales differ chunk to chunk
    whole = codec.empty(x.numel(), "cpu")
    codec.encode(x, whole)
    monkeypatch.setattr(codecs, "ENCODE_PIECE", 4 * CHUNK)  # 10 pieces, the last one ragged
    pieces = codec.empty(x.numel(), "cpu")
    codec.encode(x, pieces)
    (v1, s1), (v2, scales) = codec.views(pieces, x.numel()), codec.views(whole, x.numel())
    assert torch.equal(v1.view(torch.uint8), v2.view(torch.uint8)) and torch.equal(s1, scales)
    padded = torch.cat([x, x.new_zeros(-x.numel() % CHUNK)]).view(-1, CHUNK)
    fmax = torch.finfo(torch.float8_e4m3fn if name == "fp8-e4m3" else torch.float8_e5m2).max
    assert torch.equal(scales, padded.abs().amax(1) / fmax)


@pytest.mark.parametrize("name, fraction", [("bf16", 0.5), ("fp16", 0.5), ("fp8-e4m3", 0.25),
                                            ("fp8-e5m2", 0.25)])
def test_encoded_bytes(name, fraction):
    n = 1 << 20
    scales = 4 * n // CHUNK if name.startswith("fp8") else 0
    assert get_codec(name).nbytes(n) == fraction * 4 * n + scales


def test_stochastic_rounding_is_unbiased():
    x = _weights(4096)
    # values strictly between bf16 neighbours
    trials = torch.stack([stochastic_round(x, torch.bfloat16, s).float() for s in range(400)])
    mean_err = (trials.mean(0) - x).abs().mean()
    rn_err = (x.to(torch.bfloat16).float() - x).abs().mean()
    assert mean_err < rn_err / 8
    # every draw is one of the two bf16 neighbours of x: the one toward zero (x with its low 16
    # bits cleared) or the next one away from zero (one bf16 ulp further)
    bits = x.view(torch.int32)
    toward = (bits & ~0xFFFF).view(torch.float32)
    away = ((bits & ~0xFFFF) + 0x10000).view(torch.float32)
    assert not (bits & 0xFFFF == 0).any()  # no x is a bf16 value: two distinct neighbours
    assert ((trials == toward) | (trials == away)).all()
    # and both occur (each with probability its distance to the other, over 400 draws)
    assert (trials == toward).any(0).float().mean() > 0.9
    assert (trials == away).any(0).float().mean() > 0.9


def _layout(n):
    return GroupLayout("block.0", [], n, n)


def _tiny_updates(transfer_cls, codec, steps=200, n=4096, lr=2e-7, drift=False):
    """Run ``steps`` tiny ZO updates through a transfer path: about 2e-7 per step on weights
    near 0.5, which fp32 resolves (ulp 6e-8) and a bf16 copy cannot (ulp 4e-3). Returns (host
    weights, fp32 reference, the reference's start)."""
    ops = ZOOps("philox", torch.device("cpu"))
    timer = OpTimer(torch.device("cpu"), EventBus(), enabled=False)
    tr = transfer_cls(torch.device("cpu"), timer, ops, get_codec(codec))
    lay = _layout(n)
    start = _weights(n, seed=3) + 0.5  # weights near 0.5: a bf16 ulp is 2^-9
    host = tr.host_storage(lay)
    tr.store_fp32(host, start)
    ref = tr.to_fp32(host).clone()
    ref_start = ref.clone()
    slot, extra = torch.empty(n), tr.slot_extra(n)
    for t in range(steps):
        upd = PendingUpdate(1 if drift else t + 1, torch.tensor(1.0), lr, 0.0)
        tr.wait_host(0)
        tr.upload(host, slot, extra, t, 0, None)
        if isinstance(tr, MirrorTransfer):
            tr.apply_update(slot, lay, upd, extra, 0)
        else:
            ops.update(slot, lay, upd)
        tr.offload(host, slot, extra, t, 0, lay, None)
        ref.add_(ops.delta(ref, lay, upd))
    tr.close()
    return tr.to_fp32(host).clone(), ref, ref_start


@pytest.mark.parametrize("codec", ["bf16", "fp16", "fp8-e4m3"])
def test_fp32_master_keeps_tiny_updates(codec):
    got, ref, start = _tiny_updates(MirrorTransfer, codec)
    moved = (ref - start).abs()
    assert moved.mean() > 1e-6  # many fp32 ulps, a small fraction of one bf16 ulp
    # The same as applying them in fp32, up to fp32 rounding noise: the update travels as bf16
    # (0.4% of its own size), which flips the rounding of an fp32 add about once in 200
    # steps, so the sums random-walk a few ulps apart; they never lose the update itself.
    ulp = torch.finfo(torch.float32).eps * ref.abs()
    assert ((got - ref).abs() <= 8 * ulp).all()
    assert (got - ref).abs().mean() < 0.03 * moved.mean()


def test_naive_compressed_master_loses_them_and_sr_keeps_them_on_average():
    # the same z every step: each weight drifts one way, by 5% of a bf16 ulp on average
    got, ref, start = _tiny_updates(SRTransfer, "bf16", n=65536, lr=1e-6, drift=True)
    moved = ref - start
    naive = start.to(torch.bfloat16).float()  # round-to-nearest storage: every update lost
    start_bf16 = naive.clone()
    for _ in range(200):
        naive = (naive + moved / 200).to(torch.bfloat16).float()
    assert torch.equal(naive, start_bf16)
    # SR: each weight jumps a whole bf16 ulp with probability (its update / ulp), so the
    # movement regressed on fp32's has slope 1 (about 3300 jumps here: +-2% noise).
    jumped = got - start_bf16
    slope = float((jumped * moved).sum() / (moved * moved).sum())
    assert 0.85 < slope < 1.15


@pytest.mark.parametrize("master, codec", [("fp32", "bf16"), ("fp32", "fp8-e4m3"),
                                           ("compressed-sr", "bf16"), ("compressed-sr", "fp16")])
def test_engine_bytes_and_error_bound(master, codec):
    """Exact bytes each way and the codec's error bound against an fp32 reference
    (``check_codec_run``; rng=torch: the CPU's philox is slow and the bound does not depend on
    the generator); stochastic rounding is seeded, so a second run is bit-identical."""
    first = check_codec_run("cpu", master, codec, rng="torch")
    if master == "compressed-sr":
        again = check_codec_run("cpu", master, codec, rng="torch")
        assert all(torch.equal(a, b) for a, b in zip(first, again))
