"""FZOO (``estimator=one-sided``, ``directions=rademacher``): one step against the public
reference's update (DKmiyan/FZOO, ``trainer.py``: ``zo_step`` / ``zo_update``), re-derived here
on the same weights, batch and directions; the Rademacher directions themselves; zo-offload
bit-equal to MeZO; the settings checked; and the CLI as a user runs it.

The reference differs from the paper in two places, both a constant factor of the learning
rate: its step has no 1 / eps (the paper's g_t = sum_i (l_i - l_0) u_i / (eps N)), and it
divides by the population standard deviation of the N losses (``torch.std(unbiased=False)``;
the paper's sigma_t divides by N - 1). We follow the paper, so one reference step at lr_ref is
ours at lr = lr_ref * eps * sqrt(N / (N - 1)) (what the first test checks)."""
import copy
import json
import math

import pytest
import torch

from workbench.config import ConfigError, RunConfig
from workbench.data.batches import SyntheticData
from workbench.engine.events import EventBus
from workbench.engine.groups import GroupLayout
from workbench.engine.methods.mezo import MeZOEngine
from workbench.engine.zo.perturb import ZOOps, query_seeds
from workbench.engine.zo.step import step_seed
from workbench.models.build import build_skeleton

from zo_helpers import cli_run, loss_at, train


def _reference_step(model, groups, flats, batch, us, eps: float, lr_ref: float):
    """One FZOO step as the reference's trainer takes it, its directions ``us`` (per query, per
    group) given instead of drawn from torch.randint: each query perturbs +eps u, evaluates,
    and perturbs back; the clean loss last; the coefficients (l_i - l_0) / (N std), std the
    population one; then every parameter moves by -lr * coefficient_i * u_i, query by query.
    Returns the new flats and the coefficients."""
    params = [f.clone() for f in flats]
    n = len(us)
    loss1s = []
    for u in us:
        params = [p + 1 * z * eps for p, z in zip(params, u)]
        loss1s.append(loss_at(model, groups, params, batch))
        params = [p + -1 * z * eps for p, z in zip(params, u)]
    loss1s = torch.tensor(loss1s, dtype=torch.float32)
    std = torch.std(loss1s, unbiased=False)
    loss0 = loss_at(model, groups, params, batch)
    projected = (loss1s - loss0) / (n * std)
    for i, u in enumerate(us):
        params = [p - lr_ref * (projected[i] * z) for p, z in zip(params, u)]
    return params, projected


@pytest.mark.parametrize("model_name", ["tiny-llama", "tiny-opt"])
def test_one_step_equals_the_reference_trainers_step(model_name):
    """N = 8 Rademacher queries at eps = 1e-3 (the reference's defaults, ``fzoo.sh``) from the
    same weights on the same batch: our update equals the reference's within float tolerance
    at lr = lr_ref * eps * sqrt(N / (N - 1))."""
    n, eps, lr_ref = 8, 1e-3, 1e-3
    lr = lr_ref * eps * math.sqrt(n / (n - 1))
    cfg = RunConfig(model=model_name, eps=eps, lr=lr, queries=n, estimator="one-sided",
                    directions="rademacher")
    model, source = build_skeleton(cfg.model)
    engine = MeZOEngine(model, source, cfg, torch.device("cpu"), EventBus())
    reference = copy.deepcopy(model)  # (the skeleton's weights exist once the engine loads them)
    batch = SyntheticData(model.config.vocab_size, 16).batch_for_step(0, 4, 0)
    groups = engine.groups
    theta = [g.flat.clone() for g in groups]
    seeds = query_seeds(step_seed(cfg.seed, 0), n)
    us = [[engine.ops.z(g.layout.numel, s, g.layout.gid) for g in groups] for s in seeds]
    assert all(torch.equal(z.abs(), torch.ones_like(z)) for u in us for z in u)

    out = engine.step(batch, 0, lr, 0.0)
    engine.flush()
    ours = [g.flat.clone() for g in groups]
    theirs, projected = _reference_step(reference, groups, theta, batch, us, eps, lr_ref)

    assert (projected.abs() > 1e-2).sum() >= n // 2  # a real signal, not 0 == 0
    # the coefficients: ours (l_i - l_0) / (eps N sigma_{N-1}), theirs without eps, sigma_N
    assert torch.allclose(out.coefs * eps * math.sqrt(n / (n - 1)), projected, rtol=1e-3,
                          atol=1e-5)
    step_ours = torch.cat([a - b for a, b in zip(ours, theta)])
    step_theirs = torch.cat([a - b for a, b in zip(theirs, theta)])
    assert step_theirs.norm() > 0
    assert (step_ours - step_theirs).norm() <= 2e-3 * step_theirs.norm()


@pytest.mark.parametrize("rng", ["philox", "torch"])
def test_rademacher_directions_are_the_signs_of_the_same_normals(rng):
    """Each element +-1 exactly, the sign of the normal the Gaussian rule draws for it (so a
    replay regenerates them from the seed alone); about half of each."""
    cpu = torch.device("cpu")
    signs, normals = ZOOps(rng, cpu, "rademacher"), ZOOps(rng, cpu)
    for seed, gid in ((5, 0), (1234567, 3)):
        z, g = signs.z(10_000, seed, gid), normals.z(10_000, seed, gid)
        assert z.dtype == torch.float32 and set(z.unique().tolist()) == {-1.0, 1.0}
        assert torch.equal(z, torch.where(g >= 0, 1.0, -1.0))
        assert abs(float(z.mean())) < 0.05
    x = torch.zeros(1000)
    lay = GroupLayout("block.0", [], 1000, 1000)
    signs.perturb(x, lay, 7, 1e-3)
    assert torch.equal(x, 1e-3 * signs.z(1000, 7, lay.gid))


@pytest.mark.parametrize("variant", [
    dict(), dict(resident_blocks=2, fused_update=False), dict(peft="lora"),
    pytest.param(dict(amp="bf16"), marks=pytest.mark.slow)])
def test_offload_equals_mezo_with_rademacher_directions(variant):
    """FZOO on both engines: the same losses and weights, bit for bit (the streamed blocks'
    z regenerated as signs in each visit); and not the Gaussian run."""
    offload_only = ("resident_blocks", "fused_update")
    knobs = {k: v for k, v in variant.items() if k not in offload_only}
    cfg = RunConfig(model="tiny-opt", method="mezo", queries=3, estimator="one-sided",
                    directions="rademacher", lr=1e-6, weight_decay=0.1, **knobs)
    _, ref_digest, ref_losses = train(cfg, steps=4)
    offload = {k: v for k, v in variant.items() if k in offload_only}
    _, d, losses = train(cfg.replace(method="zo-offload", **offload), steps=4)
    assert losses == ref_losses and d == ref_digest
    _, gauss, _ = train(cfg.replace(directions="gaussian"), steps=4)
    assert gauss != ref_digest


def test_settings_are_checked_in_one_line_each():
    problems = []
    for bad in (dict(method="fo", directions="rademacher"),
                dict(method="forward-grad", directions="rademacher"),
                dict(method="zo-offload", directions="rademacher", slot_dtype="compute",
                     codec="bf16", master="compressed-sr", amp="bf16"),
                dict(directions="uniform")):
        with pytest.raises(ConfigError) as e:
            RunConfig(**bad)
        problems += e.value.problems
    assert sum("directions: 'rademacher' does not apply to method" in p for p in problems) == 2
    assert any(p.startswith("slot_dtype: compute needs directions=gaussian") for p in problems)
    assert any(p.startswith("directions:") and "gaussian" in p and "rademacher" in p
               for p in problems[3:])
    assert all("\n" not in p for p in problems)


def test_the_cli_trains_fzoo_on_both_engines_alike(tmp_path):
    """As a user runs it: the paper's rule (one-sided, 4 queries, Rademacher) on mezo and
    zo-offload ends with one digest, recorded in run.json; a typo is refused in one line
    before any work."""
    sets = ("steps=3", "estimator=one-sided", "queries=4", "directions=rademacher", "lr=1e-6")
    digests = []
    for method in ("mezo", "zo-offload"):
        r = cli_run(tmp_path / method, f"method={method}", *sets)
        assert r.returncode == 0, r.stderr
        run = json.loads((tmp_path / method / "run.json").read_text())
        assert run["config"]["directions"] == "rademacher"
        digests.append(run["param_digest"])
    assert digests[0] == digests[1]
    r = cli_run(tmp_path / "bad", "directions=rademacer")
    assert r.returncode == 2 and not (tmp_path / "bad" / "run.json").exists()
    assert "directions" in r.stderr and "rademacher" in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2, r.stderr
