"""MeZO's half-precision weights (``zo/half.py``): against a hand-written MeZO loop, and the
two roundings of the update (nearest loses what stochastic rounding keeps in expectation)."""
import copy

import pytest
import torch

from workbench.config import RunConfig
from workbench.data.batches import SyntheticData
from workbench.engine.events import EventBus
from workbench.engine.groups import GroupLayout
from workbench.engine.objective import label_loss
from workbench.engine.zo import half
from workbench.engine.methods.mezo import MeZOEngine
from workbench.engine.zo.step import step_seed
from workbench.models.build import build_skeleton

from zo_helpers import BASE, assert_replay_exact, train

HALF = dict(method="mezo", master="compressed", codec="bf16", amp="bf16")


def _mezo_z(n: int, seed: int, gid: int) -> torch.Tensor:
    """MeZO's z for rng=torch: torch.randn from a generator seeded by (seed, group)."""
    gen = torch.Generator()
    gen.manual_seed((seed << 31) ^ gid)
    return torch.randn(n, generator=gen)


def _reference_loss(model, batch) -> float:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    last = batch.attention_mask.sum(1) - 1
    return float(label_loss(logits[torch.arange(len(last)), last].float(), batch))


def test_mezo_bf16_weights_equal_a_hand_written_mezo_loop():
    """Three steps of ``mezo master=compressed codec=bf16``: every parameter of an
    independent bf16 copy perturbed in place (+eps, -2 eps, +eps, each rounded to bf16 as
    MeZO's ``param.data`` arithmetic in half is), then w <- rn(w - lr (g z + wd w)) with wd on
    matrices only. The weights equal the engine's bit for bit (the update uses the engine's g,
    which the copy's own losses reproduce)."""
    cfg = RunConfig(model="tiny-opt", rng="torch", lr=5e-2, eps=1e-2, weight_decay=0.1, **HALF)
    model, source = build_skeleton(cfg.model)
    engine = MeZOEngine(model, source, cfg, torch.device("cpu"), EventBus())
    assert all(g.flat.dtype == torch.bfloat16 for g in engine.groups)
    ref = copy.deepcopy(model)  # bf16 parameters, the values MeZO's half loading gives
    params = {name: p for name, p in ref.named_parameters(remove_duplicate=False)}
    # (parameter, group id, offset, decayed) of every entry, in MeZO's loop order
    entries = [(params[e.name], g.layout.gid, e.offset, e.offset < g.layout.n_decay, g.layout)
               for g in engine.groups for e in g.layout.entries]
    data = SyntheticData(model.config.vocab_size, 16)
    for t in range(3):
        batch = data.batch_for_step(t, 4, cfg.seed)
        seed = step_seed(cfg.seed, t)
        zs = {g.layout.gid: _mezo_z(g.layout.numel, seed, g.layout.gid) for g in engine.groups}

        def perturb(scale):
            for p, gid, off, _, _ in entries:
                z = zs[gid][off:off + p.numel()].view(p.shape)
                p.data.copy_(z * scale + p.data.float())  # fp32 sum, one rounding to bf16

        with torch.no_grad():
            perturb(cfg.eps)
            plus = _reference_loss(ref, batch)
            perturb(-2 * cfg.eps)
            minus = _reference_loss(ref, batch)
            perturb(cfg.eps)
        out = engine.step(batch.to("cpu"), t, cfg.lr, cfg.weight_decay)
        g = (plus - minus) / (2 * cfg.eps)
        assert abs(g - float(out.projected_grad)) <= 0.05 * max(1.0, abs(g))
        with torch.no_grad():
            for p, gid, off, decayed, _ in entries:
                u = zs[gid][off:off + p.numel()].view(p.shape) * out.projected_grad
                if decayed:
                    u.add_(p.data, alpha=cfg.weight_decay)
                p.data.copy_(u.mul_(-cfg.lr).add_(p.data))
    for p, gid, off, _, layout in entries:
        flat = next(g.flat for g in engine.groups if g.layout is layout)
        assert torch.equal(flat[off:off + p.numel()].view(p.shape), p.data), p.shape
    assert any(not torch.equal(g.flat, g0) for g, g0 in
               zip(engine.groups, MeZOEngine(*build_skeleton(cfg.model), cfg,
                                             torch.device("cpu"), EventBus()).state_flats()))


class _Delta:
    """An ``ops`` whose update is a given constant delta (for the rounding alone)."""

    def __init__(self, d: torch.Tensor):
        self.d = d

    def delta(self, x, layout, upd):
        return self.d.clone()


LAYOUT = GroupLayout("g", [], 1 << 16, 0)


def test_an_update_below_half_an_ulp_survives_sr_in_expectation_and_is_lost_with_nearest():
    x0 = torch.ones(LAYOUT.numel, dtype=torch.bfloat16)  # bf16 ulp at 1: 2^-7 = 0.0078
    ops = _Delta(torch.full((LAYOUT.numel,), 1e-4))
    near = x0.clone()
    half.update(ops, near, LAYOUT, None)
    assert torch.equal(near, x0)  # lost: 1e-4 is far below half an ulp
    sr = x0.clone()
    half.update(ops, sr, LAYOUT, None, sr_seed=12345)
    moved = (sr.float() - 1.0).mean()
    # each element is 1 or 1 + 2^-7; the mean's standard deviation is about 3.4e-6
    assert abs(float(moved) - 1e-4) < 2.5e-5
    again = x0.clone()
    half.update(ops, again, LAYOUT, None, sr_seed=12345)
    assert torch.equal(again, sr)  # deterministic given the seed
    other = x0.clone()
    half.update(ops, other, LAYOUT, None, sr_seed=54321)
    assert not torch.equal(other, sr)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sr_update_is_unbiased_on_random_weights(dtype):
    gen = torch.Generator().manual_seed(0)
    n = 4096
    x0 = torch.randn(n, generator=gen).to(dtype)
    d = torch.randn(n, generator=gen) * 1e-3
    exact = x0.float() + d
    near = exact.to(dtype)  # the neighbours of exact in dtype: lo <= exact <= hi
    inf = torch.tensor(float("inf"), dtype=dtype)
    below = near.float() <= exact
    lo = torch.where(below, near, torch.nextafter(near, -inf)).float()
    hi = torch.where(below, torch.nextafter(near, inf), near).float()
    errs = []
    for seed in range(64):
        x = x0.clone()
        half.update(_Delta(d), x, GroupLayout("g", [], n, 0), None, sr_seed=seed)
        assert ((x.float() == lo) | (x.float() == hi)).all()  # one of the two neighbours
        errs.append((x.float() - exact) / (hi - lo))
    mean = torch.stack(errs).mean()
    assert abs(float(mean)) < 0.01  # 262144 draws: sd of the mean about 0.0006
    x = x0.clone()
    half.update(_Delta(d), x, GroupLayout("g", [], n, 0), None)
    assert torch.equal(x, near)  # nearest: the cast of the fp32 sum


def test_compressed_and_sr_differ_and_each_repeats():
    cfg = RunConfig(model="tiny-opt", lr=1e-2, weight_decay=0.1, **HALF)
    _, a, la = train(cfg, steps=3)
    _, b, lb = train(cfg, steps=3)
    _, c, _ = train(cfg.replace(master="compressed-sr"), steps=3)
    _, d, _ = train(cfg.replace(master="compressed-sr"), steps=3)
    assert a == b and la == lb and c == d and a != c


def test_half_weights_hold_half_the_bytes():
    cfg = RunConfig(model="tiny-opt", **HALF)
    fp32 = MeZOEngine(*build_skeleton(cfg.model), RunConfig(model="tiny-opt", amp="bf16"),
                      torch.device("cpu"), EventBus())
    bf16 = MeZOEngine(*build_skeleton(cfg.model), cfg, torch.device("cpu"), EventBus())
    nbytes = lambda e: sum(g.flat.numel() * g.flat.element_size() for g in e.groups)  # noqa
    assert 2 * nbytes(bf16) == nbytes(fp32)
    for g32, g16 in zip(fp32.state_flats(), bf16.state_flats()):  # loaded: rounded to nearest
        assert torch.equal(g32.to(torch.bfloat16), g16)


RESUMED = {"bf16": dict(master="compressed", codec="bf16", amp="bf16"),
           "bf16-sr": dict(master="compressed-sr", codec="bf16", amp="bf16"),
           "fp16-sr": dict(master="compressed-sr", codec="fp16", amp="fp16")}


@pytest.mark.parametrize("variant", list(RESUMED))
def test_resume_is_exact_with_half_weights(variant, tmp_path):
    """The checkpoint stores the half bits; a resumed run rounds (SR: draws seeded per step and
    group) exactly as the straight one."""
    from workbench.recipes.train import run

    cfg = RunConfig(method="mezo", steps=8, **RESUMED[variant], **BASE)
    straight = run(cfg, tmp_path / "straight", progress=False)
    part = run(cfg.replace(steps=5, checkpoint_every=3), tmp_path / "resumed", progress=False)
    assert part.param_digest != straight.param_digest
    resumed = run(cfg.replace(checkpoint_every=3), tmp_path / "resumed", progress=False,
                  resume=True)
    assert resumed.info["resumed_from"] == "step-00000005"
    assert resumed.param_digest == straight.param_digest
    from safetensors.torch import load_file

    from workbench.engine.checkpoint import latest_checkpoint

    shards = latest_checkpoint(tmp_path / "resumed" / "checkpoints").glob("*.safetensors")
    stored = {t.dtype for f in shards for t in load_file(f).values()}
    assert stored == {torch.bfloat16 if cfg.codec == "bf16" else torch.float16}


@pytest.mark.parametrize("variant", ["bf16", "fp16-sr"])
def test_restore_between_snapshots_replays_half_weights(variant, tmp_path):
    assert_replay_exact(RunConfig(method="mezo", **{**BASE, **RESUMED[variant]}), tmp_path)


def test_zo_offload_nearest_master_replays_exactly(tmp_path):
    """zo-offload's master=compressed: the SR transfer's host format, rounded to nearest."""
    assert_replay_exact(RunConfig(method="zo-offload", master="compressed", codec="bf16",
                                  **BASE), tmp_path)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_passes_on_cuda_equal_the_cpu_arithmetic_on_the_same_z(dtype):
    """On CUDA a half group runs as torch ops on the Triton kernel's normals, its SR through the
    fused SR kernel: fed the same z, every pass ends with the CPU's bits."""
    from workbench.engine.zo.perturb import PendingUpdate, ZOOps

    n, seed = 1_000_003, 4321
    lay = GroupLayout("g", [], n, n // 2)
    cuda, cpu = ZOOps("philox", torch.device("cuda")), ZOOps("philox", torch.device("cpu"))
    assert cuda.kernels is not None
    z = cuda.z(n, seed, lay.gid)
    cpu.z = lambda k, s, gid, device=None: z.cpu().clone()  # the CUDA normals, on the CPU
    x = (torch.randn(n, generator=torch.Generator().manual_seed(1)) * 0.05).to(dtype)
    xs = [x.cuda(), x.clone()]
    for ops, w in zip((cuda, cpu), xs):
        ops.perturb(w, lay, seed, 1e-3)
        ops.perturb(w, lay, seed, -2e-3)
        upd = PendingUpdate(seed, torch.tensor(0.7, device=w.device), 1e-3, 0.1)
        half.update(ops, w, lay, upd)  # nearest
        half.update(ops, w, lay, upd, sr_seed=99)  # stochastic
    assert torch.equal(xs[0].cpu(), xs[1])
    assert not torch.equal(xs[1], x)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["bf16", "bf16-sr"])
def test_mezo_half_weights_train_repeat_and_resume_on_cuda(variant, tmp_path):
    """mezo's half weights on CUDA (z from the Triton normals, torch ops; SR by the fused
    kernel): 2 B per parameter, a second run bit-identical, and an exact resume."""
    from workbench.recipes.train import run

    cfg = RunConfig(method="mezo", device="cuda", **RESUMED[variant], lr=1e-2, weight_decay=0.1)
    engine, a, losses = train(cfg, steps=6)
    assert all(torch.isfinite(torch.tensor(losses)).view(-1))
    assert engine.ops.kernels is not None
    _, b, again = train(cfg, steps=6)
    assert a == b and losses == again
    cfg = RunConfig(method="mezo", device="cuda", steps=8, **RESUMED[variant], **BASE)
    straight = run(cfg, tmp_path / "straight", progress=False)
    run(cfg.replace(steps=5, checkpoint_every=3), tmp_path / "resumed", progress=False)
    resumed = run(cfg.replace(checkpoint_every=3), tmp_path / "resumed", progress=False,
                  resume=True)
    assert resumed.param_digest == straight.param_digest


@pytest.mark.gpu
def test_mezo_half_weights_hold_two_bytes_a_param_on_cuda():
    cfg = RunConfig(method="mezo", device="cuda", **RESUMED["bf16"])
    engine = MeZOEngine(*build_skeleton("tiny-opt"), cfg, torch.device("cuda"), EventBus())
    n = sum(g.layout.numel for g in engine.groups)
    assert engine.gpu_param_bytes() == 2 * n
    engine.close()
