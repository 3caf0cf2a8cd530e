"""HiZOO (``zo_optimizer=hizoo``): two steps against the public reference's update
(Yanjun-Zhao/HiZOO, ``trainer.py``: ``efficient_Hessian_perturb_parameters`` and
``zo_Hessian_step_update``), re-derived here on the same weights, batches and directions; the
Hessian state kept, streamed, checkpointed and replayed like Adam's moments; zo-offload
bit-equal to MeZO; the settings checked; the planner's extra pass; the CLI as a user runs it.

Where the reference differs from the paper or from us: its Hessian diagonal has the weights'
dtype (fp16 under its scripts' --load_float16, where an alpha of 1e-8 rounds every update of
H away); it decays every parameter in the HiZOO step (biases and norms too; weight_decay is 0
in its scripts); and it runs a fourth forward after the update, only to log the loss."""
import copy
import json

import pytest
import torch

from workbench.config import ConfigError, RunConfig
from workbench.data.batches import SyntheticData
from workbench.engine.events import EventBus
from workbench.engine.methods.mezo import MeZOEngine
from workbench.engine.zo.step import step_seed
from workbench.models.build import build_skeleton
from workbench.plan.planner import plan

from zo_helpers import cli_run, loss_at, train


def _reference_step(model, groups, params, hessian, batch, zs, eps, lr, alpha):
    """One step of the reference's ``zo_Hessian_step_update`` on flat groups: the clean loss,
    then +eps and -eps along z / sqrt(H) and back; then per group (the same z) H <- (1 -
    alpha) H + alpha |L+ + L- - 2 L0| H z^2 / (2 eps^2) and w <- w - lr (L+ - L-) / (2 eps) z /
    sqrt(H) (weight decay 0, as in its scripts). ``zs``: the step's z per group, given instead
    of torch.normal's. Returns (params, hessian, (L0, L+, L-))."""
    loss_original = loss_at(model, groups, params, batch)
    params = [p + 1 / torch.sqrt(h) * z * eps for p, h, z in zip(params, hessian, zs)]
    loss1 = loss_at(model, groups, params, batch)
    params = [p + -2 / torch.sqrt(h) * z * eps for p, h, z in zip(params, hessian, zs)]
    loss2 = loss_at(model, groups, params, batch)
    params = [p + 1 / torch.sqrt(h) * z * eps for p, h, z in zip(params, hessian, zs)]
    new_params, new_hessian = [], []
    for p, h, z in zip(params, hessian, zs):
        hessian_temp = h * z * z
        estimator = (torch.abs(loss1 + loss2 - 2 * loss_original) * hessian_temp * alpha
                     / (2 * eps * eps))
        h = (1 - alpha) * h + estimator
        grad = (loss1 - loss2) / (2 * eps) * z / torch.sqrt(h)
        new_params.append(p - lr * (grad + 0.0 * p))
        new_hessian.append(h)
    return new_params, new_hessian, (loss_original, loss1, loss2)


@pytest.mark.parametrize("model_name", ["tiny-llama", "tiny-opt"])
def test_two_steps_equal_the_reference_trainers(model_name):
    """From the same weights on the same batches with the same z: after two steps (the second
    perturbed by the H the first estimated) the weights and H equal the reference's within
    float tolerance, and H has moved far from 1 (alpha large enough to see it)."""
    eps, lr, alpha = 1e-2, 1e-3, 1e-3
    cfg = RunConfig(model=model_name, eps=eps, lr=lr, zo_optimizer="hizoo", hessian_smooth=alpha)
    model, source = build_skeleton(cfg.model)
    engine = MeZOEngine(model, source, cfg, torch.device("cpu"), EventBus())
    reference = copy.deepcopy(model)
    groups = engine.groups
    params = [g.flat.clone() for g in groups]
    start = torch.cat(params)
    hessian = [torch.ones_like(p) for p in params]
    data = SyntheticData(model.config.vocab_size, 16)
    for t in range(2):
        batch = data.batch_for_step(t, 4, 0)
        seed = step_seed(cfg.seed, t)
        zs = [engine.ops.z(g.layout.numel, seed, g.layout.gid) for g in groups]
        out = engine.step(batch, t, lr, 0.0)
        params, hessian, (l0, lp, lm) = _reference_step(reference, groups, params, hessian,
                                                         batch, zs, eps, lr, alpha)
        assert float(out.loss) == pytest.approx(float(l0), abs=1e-6)
        assert float(out.loss_plus) == pytest.approx(float(lp), abs=1e-5)
        assert float(out.loss_minus) == pytest.approx(float(lm), abs=1e-5)
    ours_h = torch.cat([s + 1 for s in engine.opt_state])
    ref_h = torch.cat(hessian)
    assert (ref_h - 1).abs().max() > 1e-2  # H moved: the preconditioning is exercised
    assert torch.allclose(ours_h, ref_h, rtol=1e-3, atol=1e-6)
    ours = torch.cat([g.flat for g in groups]) - start
    theirs = torch.cat(params) - start
    assert theirs.norm() > 0
    assert (ours - theirs).norm() <= 2e-3 * theirs.norm()


@pytest.mark.parametrize("variant", [
    dict(), dict(resident_blocks=2, fused_update=False), dict(peft="lora"),
    pytest.param(dict(amp="bf16"), marks=pytest.mark.slow)])
def test_offload_equals_mezo_with_the_hessian_streamed(variant):
    """H travels with each streamed block (also in a pass with no update pending: it scales
    the perturbation): zo-offload ends with MeZO's losses and weights, bit for bit; and not
    MeZO's plain rule (sgd)."""
    offload_only = ("resident_blocks", "fused_update")
    knobs = {k: v for k, v in variant.items() if k not in offload_only}
    cfg = RunConfig(model="tiny-opt", method="mezo", zo_optimizer="hizoo", hessian_smooth=1e-2,
                    lr=1e-3, weight_decay=0.1, **knobs)
    _, ref_digest, ref_losses = train(cfg, steps=4)
    offload = {k: v for k, v in variant.items() if k in offload_only}
    _, d, losses = train(cfg.replace(method="zo-offload", **offload), steps=4)
    assert losses == ref_losses and d == ref_digest
    _, sgd, _ = train(cfg.replace(zo_optimizer="sgd", hessian_smooth=1e-8), steps=4)
    assert sgd != ref_digest


def test_settings_are_checked_in_one_line_each():
    problems = []
    for bad in (dict(zo_optimizer="hizoo", queries=2),
                dict(zo_optimizer="hizoo", estimator="one-sided", queries=2),
                dict(hessian_smooth=1e-6),  # the knob of another rule
                dict(method="fo", hessian_smooth=1e-6),
                dict(zo_optimizer="hizoo", hessian_smooth=2.0),
                dict(method="mezo", zo_optimizer="hizoo", codec="bf16", master="compressed",
                     amp="bf16")):
        with pytest.raises(ConfigError) as e:
            RunConfig(**bad)
        problems += e.value.problems
    assert sum(p.startswith("zo_optimizer: hizoo estimates one curvature") for p in problems) == 2
    assert any(p.startswith("hessian_smooth: applies only with zo_optimizer=hizoo")
               for p in problems)
    assert any("hessian_smooth: 1e-06 does not apply to method=fo" in p for p in problems)
    assert any(p.startswith("hessian_smooth: 2.0 is outside") for p in problems)
    assert any("hizoo keeps per-weight state that mezo's bf16" in p for p in problems)
    assert all("\n" not in p for p in problems)


def test_the_planner_counts_the_clean_pass_and_the_state():
    """A third forward pass (one more hidden state live across blocks, a tied head's third
    copy) and one fp32 state per weight that travels with each streamed block."""
    base = dict(device="cuda", data="synthetic", batch_size=16, seq_len=128, model="opt-1.3b",
                method="zo-offload")
    sgd = plan(RunConfig(**base), gpu="h200")
    hz = plan(RunConfig(**base, zo_optimizer="hizoo"), gpu="h200")
    mom = plan(RunConfig(**base, zo_optimizer="momentum"), gpu="h200")
    assert hz.h2d_bytes_per_step == mom.h2d_bytes_per_step > sgd.h2d_bytes_per_step
    assert hz.gpu_breakdown["optimizer state"] == mom.gpu_breakdown["optimizer state"]
    assert hz.gpu_breakdown["tied head weight copy"] == 2 * sgd.gpu_breakdown[
        "tied head weight copy"]
    assert hz.gpu_breakdown["activations"] > mom.gpu_breakdown["activations"]
    assert hz.compute_seconds > mom.compute_seconds
    unfused = [plan(RunConfig(**base, zo_optimizer=r, fused_update=False), gpu="h200")
               for r in ("momentum", "hizoo")]  # H travels in the ZO pass and the update's
    state = mom.h2d_bytes_per_step - sgd.h2d_bytes_per_step
    assert unfused[1].h2d_bytes_per_step - unfused[0].h2d_bytes_per_step == state
    assert unfused[1].d2h_bytes_per_step - unfused[0].d2h_bytes_per_step == state


def test_the_cli_trains_hizoo_on_both_engines_alike(tmp_path):
    """As a user runs it: ``--set zo_optimizer=hizoo`` on mezo and zo-offload ends with one
    digest, recorded with 3 forward passes a step; a second query is refused in one line."""
    digests = []
    for method in ("mezo", "zo-offload"):
        r = cli_run(tmp_path / method, f"method={method}", "steps=3", "zo_optimizer=hizoo",
                    "hessian_smooth=1e-4")
        assert r.returncode == 0, r.stderr
        run = json.loads((tmp_path / method / "run.json").read_text())
        assert run["config"]["zo_optimizer"] == "hizoo"
        digests.append(run["param_digest"])
    assert digests[0] == digests[1]
    r = cli_run(tmp_path / "bad", "zo_optimizer=hizoo", "queries=2")
    assert r.returncode == 2 and not (tmp_path / "bad" / "run.json").exists()
    assert "zo_optimizer: hizoo estimates one curvature" in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2, r.stderr
