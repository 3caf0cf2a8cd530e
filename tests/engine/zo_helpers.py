"""Small helpers shared by the engine tests."""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import torch

from workbench.config import RunConfig
from workbench.data.batches import SyntheticData
from workbench.engine import build_engine
from workbench.engine.events import EventBus
from workbench.engine.groups import digest
from workbench.models.build import build_skeleton


def train(cfg: RunConfig, steps: int = 10, bus: EventBus | None = None, batch_size: int = 4):
    """``steps`` steps on synthetic batches; returns (engine, digest, [(loss, g, L+, L-)])
    (L+ / L- only for ZO methods)."""
    model, source = build_skeleton(cfg.model)
    engine = build_engine(model, source, cfg, torch.device(cfg.device), bus or EventBus())
    data = SyntheticData(model.config.vocab_size, 16)
    out = []
    for t in range(steps):
        batch = data.batch_for_step(t, batch_size, cfg.seed).to(cfg.device)
        o = engine.step(batch, t, cfg.lr, cfg.weight_decay)
        out.append(tuple(float(x) for x in (o.loss, o.projected_grad, o.loss_plus, o.loss_minus)
                         if x is not None))
    engine.flush()
    d = digest([f.detach().cpu() for f in engine.state_flats()])
    engine.close()
    return engine, d, out


#: (reuse_buffers, fused_update, resident_blocks) combinations checked against MeZO on the CPU:
#: every knob that changes what runs there (resident 4 = every block of the tiny models).
CPU_KNOBS = list(itertools.product([True, False], [True, False], [0, 2, 4]))
#: (overlap, reuse_buffers, fused_update, resident_blocks) on CUDA, where ``overlap`` chooses
#: between three streams and one (a CPU has no streams, so there it would repeat the cases).
KNOBS = [(overlap, *knobs) for overlap in (True, False) for knobs in CPU_KNOBS]


def losses_of_copies(engine, model, batch, theta: list[torch.Tensor], points) -> torch.Tensor:
    """An independent reference for a MeZO engine's losses: for each of ``points`` ((seed,
    scale) pairs), a deep copy of ``model`` whose weights are theta + scale z(seed) (theta: the
    groups' flat weights, z from the engine's ops), its classify loss on ``batch``; (k,) fp64."""
    import copy

    from workbench.engine.objective import label_loss

    out = []
    for seed, scale in points:
        ref = copy.deepcopy(model)
        for group, flat in zip(engine.groups, theta):
            moved = flat + scale * engine.ops.z(group.layout.numel, seed, group.layout.gid)
            for entry, view in zip(group.layout.entries, group.layout.views(moved)):
                module_name, slot = entry.name.rsplit(".", 1)
                getattr(ref.get_submodule(module_name), slot).data.copy_(view)
        with torch.no_grad():
            logits = ref(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        last = batch.attention_mask.sum(1) - 1
        out.append(float(label_loss(logits[torch.arange(len(last)), last], batch)))
    return torch.tensor(out, dtype=torch.float64)


def loss_at(model, groups, flats, batch) -> torch.Tensor:
    """The classify loss of ``model`` (a copy of an engine's) with its trained weights set to
    ``flats`` (the engine's ``groups``, in order): what a reference trainer's ``zo_forward``
    returns (0-d fp32)."""
    from workbench.engine.objective import label_loss

    for group, flat in zip(groups, flats):
        for entry, view in zip(group.layout.entries, group.layout.views(flat)):
            module_name, slot = entry.name.rsplit(".", 1)
            getattr(model.get_submodule(module_name), slot).data.copy_(view)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    last = batch.attention_mask.sum(1) - 1
    return label_loss(logits[torch.arange(len(last)), last], batch).detach()


def mezo_reference(model: str, device: str = "cpu"):
    """The MeZO run every zo-offload variant must equal: (config, (digest, losses))."""
    cfg = RunConfig(model=model, method="mezo", device=device, lr=5e-3, weight_decay=0.1)
    return cfg, train(cfg)[1:]


def assert_offload_equals_mezo(reference, overlap, reuse, fused, resident) -> None:
    """zo-offload with these knobs ends with MeZO's losses and parameter digest, bit for bit."""
    cfg, (ref_digest, ref_losses) = reference
    cfg = cfg.replace(method="zo-offload", overlap=overlap, reuse_buffers=reuse,
                      fused_update=fused, resident_blocks=resident)
    _, d, losses = train(cfg)
    assert losses == ref_losses
    assert d == ref_digest


#: Small synthetic runs for the checkpoint tests.
BASE = dict(model="tiny-opt", data="synthetic", batch_size=4, seq_len=16, lr=2e-3,
            weight_decay=0.01, sample_hz=0.0, eval_samples=0)
#: Every way the engines apply an update (fused or not) and each host format.
REPLAYED = {
    "mezo": dict(method="mezo"),
    "zo-offload": dict(method="zo-offload"),
    "unfused": dict(method="zo-offload", fused_update=False),
    "forward-grad": dict(method="forward-grad"),
    "mirror": dict(method="zo-offload", codec="bf16", resident_blocks=1),
    "sr": dict(method="zo-offload", master="compressed-sr", codec="bf16"),
    "sr-unfused": dict(method="forward-grad", master="compressed-sr", codec="fp16",
                       fused_update=False),
    # adapters (resident, over a frozen stream): the replay runs on the adapter groups alone
    "lora": dict(method="zo-offload", peft="lora", base_codec="int8"),
    "lora-forward-grad": dict(method="forward-grad", peft="lora", resident_blocks=1),
    # several perturbations per step: the log keeps q coefficients, the replay regenerates
    # the q directions from the step seed (a mirror transfer and a tied head's copies too)
    "queries": dict(method="zo-offload", queries=3, codec="bf16", resident_blocks=1),
    "one-sided-sr": dict(method="zo-offload", queries=2, estimator="one-sided", lr=1e-6,
                         master="compressed-sr", codec="bf16"),
    # FZOO's Rademacher directions, regenerated as signs (through the mirror's delta too)
    "fzoo": dict(method="mezo", queries=3, estimator="one-sided", directions="rademacher",
                 lr=1e-6),
    "fzoo-mirror": dict(method="zo-offload", queries=2, estimator="one-sided",
                        directions="rademacher", lr=1e-6, codec="bf16", resident_blocks=1),
    # the sign rule through the mirror's delta (its rule from the run, not the log's rows)
    "sign": dict(method="zo-offload", zo_optimizer="sign", queries=2, lr=1e-4, codec="bf16",
                 resident_blocks=1),
    # HiZOO's H scales every perturbation: it travels in a pass with no update pending too
    "hizoo-unfused": dict(method="zo-offload", zo_optimizer="hizoo", hessian_smooth=1e-2,
                          fused_update=False, resident_blocks=1),
    "hizoo-sr": dict(method="zo-offload", zo_optimizer="hizoo", hessian_smooth=1e-2,
                     master="compressed-sr", codec="bf16"),
    # optimizer state: the snapshot's, carried through the replay's own transfers
    "mezo-adam": dict(method="mezo", zo_optimizer="adam", lr=1e-4),
    "momentum-unfused": dict(method="zo-offload", zo_optimizer="momentum", fused_update=False,
                             resident_blocks=1),
    "adam-sr": dict(method="zo-offload", zo_optimizer="adam", lr=1e-4, queries=2,
                    master="compressed-sr", codec="bf16"),
    "lora-adam": dict(method="zo-offload", zo_optimizer="adam", lr=1e-4, peft="lora"),
}


def assert_replay_exact(cfg: RunConfig, tmp_path: Path) -> None:
    """Ten steps with a snapshot every four; ``restore_step`` to step 6 (snapshot 4 + two
    steps of the log, replayed on the run's device) has a straight six-step run's digest."""
    from workbench.engine.checkpoint import complete_checkpoints
    from workbench.engine.methods.replay import restore_step
    from workbench.recipes.train import run

    cfg = cfg.replace(steps=10, checkpoint_every=4, keep_last=10)
    run(cfg, tmp_path / "long", progress=False)
    root = tmp_path / "long" / "checkpoints"
    assert [p.name for p in complete_checkpoints(root)] == ["step-00000004", "step-00000008",
                                                            "step-00000010"]
    six = run(cfg.replace(steps=6, checkpoint_every=0), tmp_path / "six", progress=False)
    assert digest(restore_step(root, 6, device=cfg.device)) == six.param_digest
    lines = (root / "steps.jsonl").read_text().splitlines()
    assert len(lines) == 10 and all(len(l) < 200 for l in lines)  # bytes, not gigabytes


def run_under_triton_interpreter(script: str) -> None:
    """Run ``script`` in a fresh process with TRITON_INTERPRET=1 (kernels on CPU tensors); it
    must print "ok" last."""
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith("ok")


#: Largest relative error of one round-to-nearest into each codec's normal range (half an
#: ulp), its smallest subnormal relative to the fp8 chunk's scale, and an absolute floor.
HALF_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
CODEC_BOUNDS = {"fp32": (0.0, 0.0, 0.0), "bf16": (2**-8, 0.0, 0.0), "fp16": (2**-11, 0.0, 2**-25),
                "fp8-e4m3": (2**-4, 2**-9 / 448, 0.0), "fp8-e5m2": (2**-3, 2**-16 / 57344, 0.0)}


def ulp(x: torch.Tensor, codec: str) -> torch.Tensor:
    """The spacing of ``codec``'s values (bf16 / fp16) around each |x| (fp32), taken one binade
    up where x is near its top (a rounding may carry it there)."""
    bits, lowest = (8, 2.0**-133) if codec == "bf16" else (11, 2.0**-24)
    mag = (x.abs() * (1 + 2.0**-(bits - 1))).clamp_min(lowest)
    return torch.exp2(torch.floor(torch.log2(mag)) - (bits - 1)).clamp_min(lowest)


def check_codec_run(device: str, master: str, codec: str, amp: str = "off", rng: str = "philox",
                    steps: int = 5):
    """Train zo-offload (tiny-opt, block 0 resident, blocks 1-3 streamed) through a codec and
    check it against an fp32 reference fed the run's own g (``zo/step.py`` on the same device,
    no codec):
    - bytes each way, exactly: every pass uploads each streamed block in the codec; an fp32
      master's mirror sends down only the bf16 update (passes that carry one), an SR master
      the whole encoded block;
    - the embedding, head and resident block (fp32 on the device) equal the reference bit for
      bit; the streamed blocks stay within the codec's error bound of it: compressed-sr, one
      rounding (an ulp at most) per offload; the fp32-master mirror, per update the bf16
      rounding of the update plus its weight decay read from the mirror, plus fp32 rounding.
    Returns the final weights (canonical order, CPU)."""
    from workbench.engine.codecs.wire import get_codec
    from workbench.engine.zo.perturb import PendingUpdate, ZOOps
    from workbench.engine.zo.step import step_seed
    from workbench.engine.zo.step import ZOStep, apply_update, replay_pass

    cfg = RunConfig(model="tiny-opt", method="zo-offload", device=device, amp=amp, master=master,
                    codec=codec, rng=rng, lr=1e-3, weight_decay=0.1, resident_blocks=1)
    dev = torch.device(device)
    model, source = build_skeleton(cfg.model)
    engine = build_engine(model, source, cfg, dev, EventBus())
    layouts = engine.group_layouts()
    start = [f.detach().to(dev).clone() for f in engine.state_flats()]  # SR: already rounded
    data = SyntheticData(model.config.vocab_size, 16)
    gs = [engine.step(data.batch_for_step(t, 4, cfg.seed).to(dev), t, cfg.lr,
                      cfg.weight_decay).projected_grad for t in range(steps)]
    engine.flush()
    got = [f.detach().cpu().clone() for f in engine.state_flats()]
    moved = engine.bytes_h2d, engine.bytes_d2h
    engine.close()

    streamed = range(2, len(layouts) - 1)  # groups of blocks 1 .. n-1
    c = get_codec(codec)
    n = [layouts[k].numel for k in streamed]
    up = (steps + 1) * sum(c.nbytes(m) for m in n)  # every step + the final flush
    mirror = master == "fp32" and codec != "fp32"
    down = steps * sum(2 * m for m in n) if mirror else up
    assert moved == (up, down)

    ops = ZOOps(cfg.rng, dev)
    ref = [f.clone() for f in start]
    budget = [torch.zeros_like(f) for f in start]
    rel, sub, floor = CODEC_BOUNDS[codec]
    lr, wd, eps = cfg.lr, cfg.weight_decay, cfg.eps

    def charge(upd: PendingUpdate | None, before: list[torch.Tensor]) -> None:
        """What one pass (from weights ``before`` to ``ref``, with update ``upd``) may add to
        the streamed blocks' distance from the reference."""
        for k in streamed:
            w, lay = before[k], layouts[k]
            if mirror:  # only updates reach the master
                if upd is None:
                    continue
                z = ops.z(lay.numel, upd.seed, lay.gid, dev)
                wd_w = torch.zeros_like(w)
                wd_w[:lay.n_decay] = wd * w[:lay.n_decay].abs()
                delta = lr * (upd.g.abs() * z.abs() + wd_w)
                mirror_err = rel * w.abs() + sub * w.abs().max()
                budget[k] += 2**-8 * delta + lr * wd * mirror_err + 2**-21 * w.abs()
            elif master == "compressed-sr":  # one rounding (< 1 ulp) of the block per offload,
                # at the engine's value: the reference's, give or take the errors so far
                mag = torch.maximum(w.abs(), ref[k].abs()) + budget[k]
                budget[k] += ulp(mag, codec) + 2**-21 * mag

    upd = None
    for t, g in enumerate(gs):
        st = ZOStep(step_seed(cfg.seed, t), eps, upd)
        before = [f.clone() for f in ref]
        for w, lay in zip(ref, layouts):
            replay_pass(ops, w, lay, st, zo=True)
        charge(upd, before)
        upd = PendingUpdate(st.seed, g, lr, wd)
    before = [f.clone() for f in ref]
    for w, lay in zip(ref, layouts):
        apply_update(ops, w, lay, upd)
    charge(upd, before)
    ref, budget, start = ([f.cpu() for f in fs] for fs in (ref, budget, start))
    for k in (0, 1, len(layouts) - 1):
        assert torch.equal(got[k], ref[k]), layouts[k].name
    for k in streamed:
        err = (got[k] - ref[k]).abs()
        slack = 2.0 if mirror else 1.0  # the SR bound is exact: 2-ulp roundings would break it
        assert (err <= slack * budget[k]).all(), (layouts[k].name, float((err / budget[k]).max()))
        if master == "fp32":  # far below the updates' own size: losing one would break it
            assert float(budget[k].max()) < 0.05 * float((ref[k] - start[k]).abs().max())
        else:  # the host holds the codec's values, and the roundings did happen
            half = got[k].to(HALF_DTYPES[codec]).float()
            assert torch.equal(half, got[k]) and not torch.equal(got[k], ref[k])
    return got


def cli_run(out: Path, *sets: str) -> subprocess.CompletedProcess:
    """``python -m workbench run --out OUT --quiet --set ...`` as a user types it (each of
    ``sets`` is one ``name=value``)."""
    args = [a for s in sets for a in ("--set", s)]
    return subprocess.run([sys.executable, "-m", "workbench", "run", "--out", str(out),
                           "--quiet", *args], capture_output=True, text=True, timeout=600)
